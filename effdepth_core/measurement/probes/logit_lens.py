"""The logit-lens probe (method.md §2): each layer's residual decoded by the model's own final norm
and head (``lens.logit_lens``), its KL to the output and top-k overlap; ED by the lens rules."""

from __future__ import annotations

from .shared.lens import KL_FRACTION_OPTION, LENS, OVERLAP_THRESHOLD_OPTION, TOP_K, check_top_k, lens_rules, logit_lens
from .shared.reduce import token_weighted_mean
from .spec import Chart, ProbeSpec, Shape, on_prompts


def _expand(settings) -> tuple[str, ...]:
    """``--lens`` chooses the lens of the lens probe: the logit lens, the tuned lens, or both."""
    LENS.check(settings.lens)
    return {"logit": ("logit_lens",), "tuned": ("tuned_lens",), "both": ("logit_lens", "tuned_lens")}[settings.lens]


def _work(shape: Shape, settings, lengths) -> float:
    return (shape.forward + shape.n_layers * shape.unembed) * sum(lengths)  # one decode per layer and token


SPEC = ProbeSpec(
    name="logit_lens",
    title="logit lens",
    compute=on_prompts(logit_lens, top_k="top_k"),
    options=(TOP_K, KL_FRACTION_OPTION, OVERLAP_THRESHOLD_OPTION),  # --lens belongs to early exit (and expand)
    aggregate=token_weighted_mean,
    rules=lens_rules("logit_lens", "lens"),
    charts=(Chart("logit_lens", "lens_curves", "logit_lens"),),
    reusable=True,
    check=check_top_k,
    expand=_expand,
    description="each layer's residual decoded by the final norm and head: KL to the output, top-k overlap (§2)",
    work=_work,  # its operations, for the grid's cost model
)
