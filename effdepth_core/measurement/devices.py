"""Devices and dtypes by name: ``auto``, ``cpu``, ``cuda[:N]``, ``mps``; ``auto``, ``float32``,
``bfloat16``, ``float16`` — resolved to what torch runs on here, or refused in one line."""

from __future__ import annotations

import torch

from ..errors import ModelNotFoundError


def check_device(device: str) -> None:
    """One-line error for a device torch cannot name (before anything loads)."""
    import re

    if device in ("auto", "cpu", "mps") or re.fullmatch(r"cuda(:\d+)?", device):
        if device == "mps" and not torch.backends.mps.is_available():
            raise ModelNotFoundError("--device mps was asked for but this torch has no MPS backend; use --device cpu")
        return
    raise ModelNotFoundError(f"unknown --device {device!r}; use auto, cpu, cuda, cuda:N or mps")


def resolve_device(device: str) -> str:
    """``auto`` → cuda when available, else cpu."""
    check_device(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelNotFoundError("--device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
    return device


def resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    """``auto`` → bfloat16 on a GPU, float32 on the CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise ModelNotFoundError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(table)}")
    return table[dtype]
