"""The logit-lens probe (method.md §2): each layer's residual decoded by the model's own final norm
and head (``lens.logit_lens``), its KL to the output and top-k overlap; ED by the lens rules."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from ..wrapping import LoadedModel
from .shared.activations import PassPart
from .shared.lens import (
    HEAD_DTYPE,
    KL_FRACTION_OPTION,
    LENS,
    OVERLAP_THRESHOLD_OPTION,
    TOP_K,
    check_top_k,
    lens_rules,
    logit_lens,
    logit_lens_part,
)
from .shared.reduce import token_weighted_mean
from .spec import Chart, Context, ProbeSpec, Shape, prompts_of


def _expand(settings) -> tuple[str, ...]:
    """``--lens`` chooses the lens of the lens probe: the logit lens, the tuned lens, or both."""
    LENS.check(settings.lens)
    return {"logit": ("logit_lens",), "tuned": ("tuned_lens",), "both": ("logit_lens", "tuned_lens")}[settings.lens]


def _compute(loaded: LoadedModel, examples: Sequence, context: Context) -> pl.DataFrame:
    """``logit_lens`` on the prompts, its head product's dtype resolved from the settings as the key
    resolves it (``HEAD_DTYPE.resolve``), so the numbers are always those the key names."""
    settings = context.settings
    return logit_lens(
        loaded,
        prompts_of(examples),
        top_k=settings.top_k,
        batch_size=settings.batch_size,
        progress=context.progress,
        head_dtype=HEAD_DTYPE.resolve(settings.head_dtype, settings),
    )


def _pass_part(loaded: LoadedModel, context: Context) -> PassPart:
    """``_compute``'s measurement as a part of a forward pass the run's other probes may share."""
    settings = context.settings
    return logit_lens_part(loaded, top_k=settings.top_k, head_dtype=HEAD_DTYPE.resolve(settings.head_dtype, settings))


def _work(shape: Shape, settings, lengths) -> float:
    return (shape.forward + shape.n_layers * shape.unembed) * sum(lengths)  # one decode per layer and token


SPEC = ProbeSpec(
    name="logit_lens",
    title="logit lens",
    compute=_compute,
    # --lens belongs to early exit (and expand); the tuned lens and early exit decode in float32 always
    options=(TOP_K, KL_FRACTION_OPTION, OVERLAP_THRESHOLD_OPTION, HEAD_DTYPE),
    aggregate=token_weighted_mean,
    rules=lens_rules("logit_lens", "lens"),
    charts=(Chart("logit_lens", "lens_curves", "logit_lens"),),
    reusable=True,
    check=check_top_k,
    expand=_expand,
    description="each layer's residual decoded by the final norm and head: KL to the output, top-k overlap (§2)",
    work=_work,  # its operations, for the grid's cost model
    pass_part=_pass_part,
)
