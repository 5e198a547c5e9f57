"""effdepth: measure how much of its depth a large language model really uses."""

from .depth import DepthResult, effective_depth
from .errors import EffdepthError
from .models import LoadedModel, load_model, wrap_model
from .probes import logit_lens, residual_cosine, token_weighted_mean
from .tasks import Example, load_task

__version__ = "0.1.0"

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
