"""Probes: each a function (LoadedModel, prompts or examples, ...) -> long-format Polars frame."""

from .depth_score import depth_score, depth_scores
from .erasure import erasure_map, residual_means
from .igrad import integrated_gradients
from .linear_map import cross_model_map
from .logit_lens import logit_lens
from .reduce import token_weighted_mean
from .residual import residual_cosine
from .skip import skip_effects, skip_summary

__all__ = [
    "cross_model_map",
    "depth_score",
    "depth_scores",
    "erasure_map",
    "integrated_gradients",
    "logit_lens",
    "residual_cosine",
    "residual_means",
    "skip_effects",
    "skip_summary",
    "token_weighted_mean",
]
