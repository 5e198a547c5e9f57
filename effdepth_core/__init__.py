"""effdepth: measure how much of its depth a large language model really uses.

The public names load on first use, so ``import effdepth_core`` (and the command line's ``--help``)
does not import torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "DepthResult": "depth",
    "effective_depth": "probes",
    "EffdepthError": "errors",
    "LoadedModel": "models",
    "load_model": "models",
    "wrap_model": "models",
    "logit_lens": "probes",
    "residual_cosine": "probes",
    "token_weighted_mean": "probes",
    "Example": "tasks",
    "load_task": "tasks",
}

__all__ = [
    "DepthResult",
    "EffdepthError",
    "Example",
    "LoadedModel",
    "effective_depth",
    "load_model",
    "load_task",
    "logit_lens",
    "residual_cosine",
    "token_weighted_mean",
    "wrap_model",
]
assert sorted(__all__) == sorted(_EXPORTS)

if TYPE_CHECKING:
    from .depth import DepthResult
    from .errors import EffdepthError
    from .models import LoadedModel, load_model, wrap_model
    from .probes import effective_depth, logit_lens, residual_cosine, token_weighted_mean
    from .tasks import Example, load_task


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'effdepth_core' has no attribute {name!r}")
