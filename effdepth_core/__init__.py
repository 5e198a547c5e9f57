"""effdepth: measure how much of its depth a large language model really uses.

The public names below load on first use, so ``import effdepth_core`` (and the command line's
``--help``) does not import torch; ``dir(effdepth_core)``, tab completion and ``help`` list them.

- models: ``load_model`` (an offline alias, a folder, a GGUF, a hub id), ``wrap_model`` (a model
  already in memory), ``LoadedModel``
- data: ``load_task``, ``Example``
- probes, each a function of a model and prompts to a long Polars frame: ``residual_cosine``,
  ``logit_lens``, ``residual_norm``, ``skip_effects``, ``erasure_map``, ``integrated_gradients``,
  ``layer_pruning``, ``early_exit``, ``train_tuned_lens`` / ``TunedLens``, ``cross_model_map``
- one prompt token by token: ``lens_by_token`` (KL, overlap and the decoded top-k at every layer
  and position) and ``prediction_table`` (its layer × position table of predicted tokens)
- activations for one's own analysis: ``run_with_cache`` (each prompt's residual states, sublayer
  writes and optionally attention patterns, as an ``ActivationCache``; memory-bounded)
- effective depth: ``effective_depth``, ``DepthResult``, ``token_weighted_mean``
- the model-first API: ``measure(model, prompts)`` — a model in memory or by name, a list of
  prompts or a task — returns a ``Measurement`` (curves, EDs with intervals, ``.plot()``); a model
  in memory is measured directly, a model by name (or ``cache=True``, ``out=``) is cached by what
  was measured
- cached runs: ``run``, ``RunSettings`` (what ``effdepth run`` does, from Python)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "ActivationCache": "activations",
    "DepthResult": "measurement.depth",
    "EffdepthError": "errors",
    "Example": "tasks",
    "LoadedModel": "models",
    "Measurement": "api",
    "RunSettings": "settings",
    "TunedLens": "measurement.probes",
    "cross_model_map": "linear_map",
    "early_exit": "measurement.probes",
    "effective_depth": "measurement.probes",
    "erasure_map": "measurement.probes",
    "integrated_gradients": "measurement.probes",
    "layer_pruning": "measurement.probes",
    "lens_by_token": "measurement.probes",
    "load_model": "models",
    "load_task": "task_loading",
    "logit_lens": "measurement.probes",
    "measure": "api",
    "plot": "api",
    "prediction_table": "measurement.probes",
    "residual_cosine": "measurement.probes",
    "residual_norm": "measurement.probes.norm",
    "run": "results",
    "run_with_cache": "activations",
    "skip_effects": "measurement.probes",
    "token_weighted_mean": "measurement.probes",
    "train_tuned_lens": "measurement.probes",
    "wrap_model": "models",
}

__all__ = [
    "ActivationCache",
    "DepthResult",
    "EffdepthError",
    "Example",
    "LoadedModel",
    "Measurement",
    "RunSettings",
    "TunedLens",
    "cross_model_map",
    "early_exit",
    "effective_depth",
    "erasure_map",
    "integrated_gradients",
    "layer_pruning",
    "lens_by_token",
    "load_model",
    "load_task",
    "logit_lens",
    "measure",
    "plot",
    "prediction_table",
    "residual_cosine",
    "residual_norm",
    "run",
    "run_with_cache",
    "skip_effects",
    "token_weighted_mean",
    "train_tuned_lens",
    "wrap_model",
]
assert __all__ == sorted(_EXPORTS)  # one list, checked at import

if TYPE_CHECKING:
    from .activations import ActivationCache, run_with_cache
    from .api import Measurement, measure, plot
    from .errors import EffdepthError
    from .linear_map import cross_model_map
    from .measurement.depth import DepthResult
    from .measurement.probes import (
        TunedLens,
        early_exit,
        effective_depth,
        erasure_map,
        integrated_gradients,
        layer_pruning,
        lens_by_token,
        logit_lens,
        prediction_table,
        residual_cosine,
        skip_effects,
        token_weighted_mean,
        train_tuned_lens,
    )
    from .measurement.probes.norm import residual_norm
    from .models import LoadedModel, load_model, wrap_model
    from .results import run
    from .settings import RunSettings
    from .task_loading import load_task
    from .tasks import Example


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'effdepth_core' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names too, though they load on first use (completion and ``help`` list them)."""
    return sorted({*globals(), *__all__})
