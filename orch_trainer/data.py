"""Data sources and the DataLoader that feeds one rank.

`--data` forms (nothing is ever downloaded):
- `fake`: torchvision FakeData, `--fake-size` samples of 3 x S x S images. Sample i is a pure
  function of (seed, i), so every rank, worker and resumed run sees the same data.
- `cifar10:/dir`: the CIFAR-10 training set already on disk under /dir (the folder holding
  `cifar-10-batches-py`, or that folder itself).
- any other value: a folder in ImageFolder layout (one sub-folder per class).

Random augmentation (cifar10, folders) draws from an RNG seeded by (seed, epoch, sample index)
inside `SeededAugment`, so it does not depend on the world size, the worker count or where
the run was resumed.

A rank may be handed an empty micro-batch (the last few samples of an epoch spread over more
ranks than samples). The loader then yields None and the training loop substitutes
`empty_batch(...)`, a zero-length batch that still takes part in gradient synchronization.
"""

from __future__ import annotations

import hashlib
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, default_collate
from torchvision import datasets, transforms

from orch_trainer.args import DataSpec
from orch_trainer.errors import DataError

Batch = tuple[torch.Tensor, torch.Tensor]

_MEAN = (0.4914, 0.4822, 0.4465)
_STD = (0.2470, 0.2435, 0.2616)
_CIFAR_FOLDER = "cifar-10-batches-py"


@dataclass(frozen=True)
class DataInfo:
    """A built training set and what the model needs to know about it."""

    dataset: Dataset[Any]  # yields (image tensor 3xSxS, class index)
    num_samples: int  # len(dataset), > 0
    num_classes: int  # model output size


def _normalize() -> list[Callable[[Any], Any]]:
    return [transforms.ToTensor(), transforms.Normalize(_MEAN, _STD)]


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """64-bit seed of the augmentation RNG for one sample in one epoch."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class SeededAugment(Dataset[Batch]):
    """Applies a random `transform` to `base[i]` with an RNG seeded by (seed, epoch, i).

    Call `set_epoch` before creating a DataLoader iterator (workers copy the dataset then).
    """

    def __init__(self, base: Dataset[Any], transform: Callable[[Any], Any], seed: int) -> None:
        self.base = base
        self.transform = transform
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Batch:
        image, label = self.base[index]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sample_seed(self.seed, self.epoch, index))
            return self.transform(image), label


def _cifar_root(path: Path) -> Path:
    return path.parent if path.name == _CIFAR_FOLDER else path


def _build_fake(num_samples: int, num_classes: int, image_size: int, seed: int) -> DataInfo:
    dataset = datasets.FakeData(
        size=num_samples,
        image_size=(3, image_size, image_size),
        num_classes=num_classes,
        transform=transforms.Compose(_normalize()),
        random_offset=seed * num_samples,
    )
    return DataInfo(dataset, num_samples, num_classes)


def _build_cifar10(path: Path, image_size: int, seed: int) -> DataInfo:
    root = _cifar_root(path)
    if not (root / _CIFAR_FOLDER).is_dir():
        raise DataError(
            f"cifar10 data not found: {root / _CIFAR_FOLDER} is not a readable folder "
            "(nothing is downloaded; copy the extracted CIFAR-10 python version there)"
        )
    try:
        base = datasets.CIFAR10(root=str(root), train=True, download=False)
    except (OSError, RuntimeError, ValueError) as exc:
        raise DataError(f"cannot read cifar10 data under {root}: {exc}") from None
    resize = [] if image_size == 32 else [transforms.Resize(image_size)]
    augment = transforms.Compose(
        [
            *resize,
            transforms.RandomCrop(image_size, padding=image_size // 8),
            transforms.RandomHorizontalFlip(),
            *_normalize(),
        ]
    )
    return DataInfo(SeededAugment(base, augment, seed), len(base), len(base.classes))


def _build_folder(path: Path, image_size: int, seed: int) -> DataInfo:
    if not path.is_dir():
        raise DataError(f"data folder not found or not a folder: {path}")
    try:
        base = datasets.ImageFolder(str(path))
    except (OSError, RuntimeError, ValueError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"cannot read image folder {path}: {message}") from None
    if len(base.classes) < 2:
        raise DataError(f"image folder {path} needs at least 2 class folders")
    augment = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size, scale=(0.35, 1.0)),
            transforms.RandomHorizontalFlip(),
            *_normalize(),
        ]
    )
    return DataInfo(SeededAugment(base, augment, seed), len(base), len(base.classes))


def build_dataset(
    spec: DataSpec, *, fake_size: int, num_classes: int, image_size: int, seed: int
) -> DataInfo:
    """The training set named by `spec`; raise `DataError` when it cannot be read."""
    if spec.kind == "cifar10" and spec.path is not None:
        info = _build_cifar10(spec.path, image_size, seed)
    elif spec.kind == "folder" and spec.path is not None:
        info = _build_folder(spec.path, image_size, seed)
    else:
        info = _build_fake(fake_size, num_classes, image_size, seed)
    if info.num_samples == 0:
        raise DataError(f"data set {spec} holds no samples")
    return info


def set_data_epoch(dataset: Dataset[Any], epoch: int) -> None:
    """Tell an epoch-aware dataset (SeededAugment) which epoch is being read."""
    setter = getattr(dataset, "set_epoch", None)
    if callable(setter):
        setter(epoch)


def empty_batch(dataset: Dataset[Any]) -> Batch:
    """A zero-length batch shaped like the samples of `dataset`."""
    image, _ = dataset[0]
    return image.new_empty((0, *image.shape)), torch.empty(0, dtype=torch.long)


def collate_or_none(samples: Sequence[Any]) -> Batch | None:
    """default_collate, except that an empty micro-batch becomes None."""
    if not samples:
        return None
    return default_collate(list(samples))


def ignore_stop_signals(_worker_id: int) -> None:
    """DataLoader worker init: leave SIGTERM/SIGUSR1 to the training process.

    torchrun signals the whole process group of a rank; a worker dying on it would make the
    rank fail instead of finishing its step and saving a checkpoint.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def make_loader(
    dataset: Dataset[Any], batch_sampler: Iterable[list[int]], *, workers: int, pin_memory: bool
) -> DataLoader[Any]:
    """A DataLoader over `batch_sampler`'s micro-batches for one rank."""
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,  # type: ignore[arg-type]
        num_workers=workers,
        collate_fn=collate_or_none,
        pin_memory=pin_memory,
        worker_init_fn=ignore_stop_signals if workers > 0 else None,
    )
