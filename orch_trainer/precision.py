"""Mixed precision: which autocast dtype and whether a GradScaler is needed.

`--amp` on a GPU: `bf16` autocasts to bfloat16, `fp16` autocasts to float16 with dynamic loss
scaling (GradScaler), `auto` picks bf16 when the GPU supports it, else fp16; `off` trains in
float32. On the CPU every mode resolves to off.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Precision:
    """A resolved `--amp` mode."""

    mode: str  # "bf16", "fp16" or "off"
    device_type: str  # "cuda" or "cpu"

    @property
    def dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.mode)

    @property
    def uses_scaler(self) -> bool:
        return self.mode == "fp16"

    def autocast(self) -> AbstractContextManager[Any]:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def make_scaler(self) -> torch.amp.GradScaler:
        """A GradScaler, enabled only for fp16 (a disabled one passes calls through)."""
        return torch.amp.GradScaler(self.device_type, enabled=self.uses_scaler)


def resolve_precision(requested: str, device: torch.device) -> Precision:
    """The precision `requested` ("auto", "bf16", "fp16", "off") means on `device`."""
    if device.type != "cuda" or requested == "off":
        return Precision("off", device.type)
    if requested == "auto":
        return Precision("bf16" if torch.cuda.is_bf16_supported() else "fp16", "cuda")
    return Precision(requested, "cuda")
