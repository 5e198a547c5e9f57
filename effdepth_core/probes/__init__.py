"""Probes: each a function (LoadedModel, prompts, ...) -> long-format Polars frame."""

from .logit_lens import logit_lens
from .reduce import token_weighted_mean
from .residual import residual_cosine

__all__ = ["logit_lens", "residual_cosine", "token_weighted_mean"]
