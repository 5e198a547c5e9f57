"""``effective_depth(cosine, logit_lens, L)``: the ED of every registered rule whose probe's frame
is given, in one call (the Python API's shortcut; runs use the same registry rules)."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl

from ....errors import EffdepthError
from ... import registry
from ...depth import N_BOOTSTRAP_RUN, DepthResult, effective_depths
from .lens import KL_FRACTION, OVERLAP_THRESHOLD


def effective_depth(
    cosine: pl.DataFrame | None,
    logit_lens: pl.DataFrame | None,
    n_layers: int,
    kl_fraction: float = KL_FRACTION,
    overlap_threshold: float = OVERLAP_THRESHOLD,
    n_bootstrap: int = N_BOOTSTRAP_RUN,
    seed: int = 0,
    tuned_lens: pl.DataFrame | None = None,
    frames: dict[str, pl.DataFrame] | None = None,
    **options: object,
) -> dict[str, DepthResult]:
    """ED and ratio (ED+1)/L for each registered rule whose probe's frame is given.

    Takes per-example frames (``example, layer, metric, value, n_tokens``) so it can bootstrap
    over prompts; aggregated frames (``layer, metric, value``) give ED without intervals.
    Keys: ``cosine``, ``logit_lens_kl``, ``logit_lens_overlap``, with a tuned-lens frame
    ``tuned_lens_kl``, ``tuned_lens_overlap`` (method.md §1, §2, §7a), and the rules of any other
    probe — ``norm``, a plugin's — given in ``frames`` (probe → frame); ``options`` set their rules'
    options (``norm_fraction=0.4``), the rest take their defaults. ``depth.depth_table`` makes the
    result a frame.

    Args:
        cosine, logit_lens, tuned_lens: the probes' frames (None: that probe's rules are skipped).
        n_layers: L, the model's number of layers.
        kl_fraction, overlap_threshold: the lens rules' thresholds (method.md §2).
        n_bootstrap: resamples of the prompts for the intervals (0: none).
        seed: the bootstrap's seed.
        frames: other probes' frames by probe name.
        **options: other rules' options by name.

    Returns:
        ``DepthResult`` per rule key.
    """
    given = {"cosine": cosine, "logit_lens": logit_lens, "tuned_lens": tuned_lens, **(frames or {})}
    given = {name: frame for name, frame in given.items() if frame is not None}
    rules = [(name, rule) for name in given for rule in registry.get(name).rules]
    defaults = {name: option.default for name, option in registry.options().items()}
    unknown = sorted(set(options) - set(defaults))
    if unknown:  # a misspelt option would silently leave its rule at the default
        raise EffdepthError(
            f"unknown option(s) {', '.join(unknown)} for effective_depth; the registered probes' options are "
            f"{', '.join(sorted(defaults))}"
        )
    settings = SimpleNamespace(
        **{**defaults, "kl_fraction": kl_fraction, "overlap_threshold": overlap_threshold, **options}
    )
    return effective_depths(given, rules, n_layers, settings, n_bootstrap, seed)
