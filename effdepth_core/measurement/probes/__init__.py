"""Probes: each a function (LoadedModel, prompts or examples, ...) -> long-format Polars frame,
declared with its spec (``spec.ProbeSpec``) in the same module; ``effdepth_core.measurement.registry`` collects them."""

from .cosine import residual_cosine
from .early_exit import early_exit, early_exit_summary
from .erasure import erasure_map, residual_means
from .igrad import integrated_gradients
from .lens_tokens import lens_by_token, prediction_table
from .logit_lens import logit_lens  # the submodule first, so this name stays the function
from .prune import layer_pruning, prune_summary, rule_comparison
from .shared.depth_score import depth_score, depth_scores
from .shared.effective import effective_depth
from .shared.reduce import token_weighted_mean
from .skip import skip_effects, skip_summary
from .tuned_lens import LensTraining, TunedLens, cached_tuned_lens, train_tuned_lens

__all__ = [
    "LensTraining",
    "TunedLens",
    "cached_tuned_lens",
    "depth_score",
    "depth_scores",
    "early_exit",
    "early_exit_summary",
    "effective_depth",
    "erasure_map",
    "integrated_gradients",
    "layer_pruning",
    "lens_by_token",
    "logit_lens",
    "prediction_table",
    "prune_summary",
    "residual_cosine",
    "residual_means",
    "rule_comparison",
    "skip_effects",
    "skip_summary",
    "token_weighted_mean",
    "train_tuned_lens",
]
