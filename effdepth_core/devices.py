"""Devices and dtypes by name: ``auto``, ``cpu``, ``cuda[:N]``, ``mps``; ``auto``, ``float32``,
``bfloat16``, ``float16`` — resolved to what torch runs on here, or refused in one line; and which
devices multiply bfloat16 in hardware (the lens's ``--head-dtype auto``)."""

from __future__ import annotations

import functools

import torch

from .errors import EffdepthError, ModelNotFoundError


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


HEAD_DTYPES = ("auto", "float32", "bfloat16")
PRODUCT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere: no fast bfloat16 assumed)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def fast_bfloat16(device: str | torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices in hardware: a CPU with AMX or AVX512-BF16
    (Linux's ``amx_bf16``/``avx512_bf16`` flags; measured 2.5× float32 one thread with AVX512-BF16,
    benchmarks/head_dtype.py) or a CUDA GPU of compute capability 8.0 or more (bfloat16 tensor cores).
    Anything else (an older CPU, macOS, MPS): False, so ``auto`` keeps float32 there."""
    device = torch.device(device)
    if device.type == "cpu":
        return bool({"amx_bf16", "avx512_bf16"} & _cpu_flags())
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return False


def resolve_head_dtype(value: str, device: str | torch.device, weights: torch.dtype) -> str:
    """The head product's dtype a lens decode uses: ``value``, with ``auto`` → ``bfloat16`` for a
    float32 model on a device with ``fast_bfloat16``, else ``float32``. ``float32`` also stands for
    a model loaded in bfloat16/float16: its head multiplies in the weights' dtype, as before."""
    if value != "auto":
        return value
    return "bfloat16" if weights == torch.float32 and fast_bfloat16(device) else "float32"


def head_dtype_of_run(value: str, settings) -> str:
    """``resolve_head_dtype`` for a run's settings (its device and dtype as the run resolves them)."""
    if value != "auto":
        return value
    try:
        device = resolve_device(settings.device)
        if settings.device_map and torch.cuda.is_available():
            device = "cuda"
        weights = resolve_dtype(settings.dtype, device)
    except EffdepthError:  # a bad device or dtype is refused before the run; nothing is keyed then
        return "float32"
    return resolve_head_dtype(value, device, weights)
