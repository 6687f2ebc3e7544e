"""Models, data sources and the saved training state."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from orch_trainer.args import MODEL_NAMES, parse_data_spec
from orch_trainer.data import SeededAugment, build_dataset, collate_or_none, empty_batch
from orch_trainer.errors import CheckpointError, DataError
from orch_trainer.models import build_model
from orch_trainer.precision import resolve_precision
from orch_trainer.schedule import WarmupCosine
from orch_trainer.state import (
    Progress,
    RunMeta,
    capture_rng,
    check_compatible,
    collect_state,
    restore_rng,
    restore_state,
)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_models_take_32px_images(name: str) -> None:
    model = build_model(name, num_classes=7)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 7)


def test_resnet18_is_adapted_to_small_inputs() -> None:
    model = build_model("resnet18", 10)
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)  # type: ignore[union-attr]
    assert isinstance(model.maxpool, torch.nn.Identity)


def test_tiny_model_has_no_batch_statistics() -> None:
    model = build_model("tiny", 10)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


def test_empty_batch_still_reaches_every_parameter() -> None:
    for name in MODEL_NAMES:
        model = build_model(name, 10)
        images, labels = torch.zeros(0, 3, 32, 32), torch.zeros(0, dtype=torch.long)
        torch.nn.functional.cross_entropy(model(images), labels, reduction="sum").backward()
        assert all(p.grad is not None for p in model.parameters())


def test_fake_data_is_a_function_of_seed_and_index() -> None:
    kwargs = {"fake_size": 20, "num_classes": 5, "image_size": 16}
    a = build_dataset(parse_data_spec("fake"), seed=1, **kwargs)
    b = build_dataset(parse_data_spec("fake"), seed=1, **kwargs)
    c = build_dataset(parse_data_spec("fake"), seed=2, **kwargs)
    assert (a.num_samples, a.num_classes) == (20, 5)
    torch.manual_seed(123)
    xa, ya = a.dataset[3]
    torch.manual_seed(456)
    xb, yb = b.dataset[3]
    assert xa.shape == (3, 16, 16) and torch.equal(xa, xb) and ya == yb
    assert not torch.equal(xa, c.dataset[3][0])


def test_unreadable_data_paths_raise_data_error(tmp_path: Path) -> None:
    kwargs = {"fake_size": 1, "num_classes": 2, "image_size": 32, "seed": 0}
    with pytest.raises(DataError, match="not found"):
        build_dataset(parse_data_spec(str(tmp_path / "missing")), **kwargs)
    with pytest.raises(DataError, match="cifar10 data not found"):
        build_dataset(parse_data_spec(f"cifar10:{tmp_path}"), **kwargs)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError):
        build_dataset(parse_data_spec(str(tmp_path / "empty")), **kwargs)


def test_image_folder_with_seeded_augmentation(tmp_path: Path) -> None:
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.new("RGB", (40, 40), (i * 90, 30, 200)).save(tmp_path / cls / f"{i}.png")
    info = build_dataset(
        parse_data_spec(str(tmp_path)), fake_size=1, num_classes=2, image_size=32, seed=0
    )
    assert (info.num_samples, info.num_classes) == (4, 2)
    dataset = info.dataset
    assert isinstance(dataset, SeededAugment)
    x1, _ = dataset[1]
    torch.manual_seed(99)  # the global RNG does not matter
    x2, _ = dataset[1]
    assert x1.shape == (3, 32, 32) and torch.equal(x1, x2)


def test_collate_turns_an_empty_micro_batch_into_none() -> None:
    assert collate_or_none([]) is None
    images, labels = collate_or_none([(torch.zeros(3, 4, 4), 1), (torch.ones(3, 4, 4), 0)])
    assert images.shape == (2, 3, 4, 4) and labels.tolist() == [1, 0]
    info = build_dataset(parse_data_spec("fake"), fake_size=2, num_classes=2, image_size=8, seed=0)
    empty_images, empty_labels = empty_batch(info.dataset)
    assert empty_images.shape == (0, 3, 8, 8) and empty_labels.shape == (0,)


def test_cpu_never_uses_amp() -> None:
    cpu = torch.device("cpu")
    for mode in ("auto", "bf16", "fp16", "off"):
        precision = resolve_precision(mode, cpu)
        assert precision.mode == "off" and not precision.make_scaler().is_enabled()


def test_rng_states_round_trip() -> None:
    cpu = torch.device("cpu")
    saved = capture_rng(cpu)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.rand(5), random.random(), np.random.rand()
    restore_rng(saved, cpu)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(expected[0], again[0]) and expected[1:] == again[1:]


def _meta(**overrides: object) -> RunMeta:
    fields: dict[str, object] = {
        "model": "tiny",
        "num_classes": 10,
        "num_samples": 64,
        "seed": 0,
        "data": "fake",
        "global_batch": 16,
        "world_size": 2,
    }
    fields.update(overrides)
    return RunMeta(**fields)  # type: ignore[arg-type]


def _training_objects() -> tuple[torch.nn.Module, torch.optim.Optimizer, WarmupCosine]:
    torch.manual_seed(0)
    model = build_model("tiny", 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, WarmupCosine(opt, peak_lr=0.1, warmup_steps=1, total_steps=10)


def test_state_round_trip_restores_model_optimizer_and_progress() -> None:
    cpu = torch.device("cpu")
    model, opt, sched = _training_objects()
    model(torch.randn(4, 3, 32, 32)).sum().backward()
    opt.step()
    sched.step()
    scaler = resolve_precision("off", cpu).make_scaler()
    state = collect_state(
        model=model,
        optimizer=opt,
        scaler=scaler,
        scheduler=sched,
        progress=Progress(epoch=1, epoch_samples=32, step=6),
        meta=_meta(),
        device=cpu,
    )
    model2, opt2, sched2 = _training_objects()
    progress = restore_state(
        state, model=model2, optimizer=opt2, scaler=scaler, scheduler=sched2, device=cpu
    )
    assert progress == Progress(epoch=1, epoch_samples=32, step=6)
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
    assert opt2.state_dict()["state"].keys() == opt.state_dict()["state"].keys()
    assert sched2.steps_done == 1


def test_a_different_world_size_is_compatible_a_different_model_is_not() -> None:
    state = {"format": 1, "meta": _meta().__dict__}
    check_compatible(state, _meta(world_size=3, global_batch=24))
    with pytest.raises(CheckpointError, match="model"):
        check_compatible(state, _meta(model="resnet18"))
    with pytest.raises(CheckpointError, match="num_samples"):
        check_compatible(state, _meta(num_samples=65))


def test_progress_rolls_over_at_the_end_of_an_epoch() -> None:
    progress = Progress()
    progress.advance(16, 20)
    assert progress == Progress(epoch=0, epoch_samples=16, step=1)
    progress.advance(4, 20)
    assert progress == Progress(epoch=1, epoch_samples=0, step=2)


def test_gpu_precision_modes() -> None:
    gpu = torch.device("cuda", 0)  # resolving needs no GPU when the mode is explicit
    bf16, fp16, off = (resolve_precision(m, gpu) for m in ("bf16", "fp16", "off"))
    assert (bf16.dtype, bf16.uses_scaler) == (torch.bfloat16, False)
    assert (fp16.dtype, fp16.uses_scaler) == (torch.float16, True)
    assert (off.dtype, off.uses_scaler) == (None, False)
