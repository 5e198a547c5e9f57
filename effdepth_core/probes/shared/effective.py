"""``effective_depth(cosine, logit_lens, L)``: the ED of every rule of the correlational probes in
one call (the Python API's shortcut; runs use the registry's rules for whatever probes ran)."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl

from ...depth import DepthResult, effective_depths
from ...registry import get
from .lens import KL_FRACTION, OVERLAP_THRESHOLD


def effective_depth(
    cosine: pl.DataFrame | None,
    logit_lens: pl.DataFrame | None,
    n_layers: int,
    kl_fraction: float = KL_FRACTION,
    overlap_threshold: float = OVERLAP_THRESHOLD,
    n_bootstrap: int = 1000,
    seed: int = 0,
    tuned_lens: pl.DataFrame | None = None,
) -> dict[str, DepthResult]:
    """ED and ratio (ED+1)/L for each rule whose probe's frame is given.

    Takes per-example frames (``example, layer, metric, value, n_tokens``) so it can bootstrap
    over prompts; aggregated frames (``layer, metric, value``) give ED without intervals.
    Keys: ``cosine``, ``logit_lens_kl``, ``logit_lens_overlap``, and with a tuned-lens frame
    ``tuned_lens_kl``, ``tuned_lens_overlap`` (method.md §1, §2, §7a).
    """
    frames = {"cosine": cosine, "logit_lens": logit_lens, "tuned_lens": tuned_lens}
    frames = {name: frame for name, frame in frames.items() if frame is not None}
    rules = [(name, rule) for name in frames for rule in get(name).rules]
    settings = SimpleNamespace(kl_fraction=kl_fraction, overlap_threshold=overlap_threshold)
    return effective_depths(frames, rules, n_layers, settings, n_bootstrap, seed)
