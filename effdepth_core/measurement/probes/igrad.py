"""Integrated gradients per layer (method.md §5, Csordás Fig. 4a).

For layer l, its output h = h_{l+1} is interpolated from a baseline b, x(α) = b + α(h − b), and
Attribution[l, t] = Σ_d (h − b)[t, d] · ∫₀¹ ∂target/∂x(α)[t, d] dα, where the target is the summed
probability of the ground-truth answer tokens. The integral is a quadrature:
- ``quadrature="riemann"``: the reference left Riemann sum, α = k/steps (256 steps in the paper);
- ``quadrature="gauss"``: Gauss–Legendre nodes on [0, 1], exact for polynomials of degree
  2·steps − 1: far fewer steps where the path integrand is smooth (tiny models, late layers);
- ``quadrature="adaptive"``: Gauss panels halved where completeness fails, until the completeness
  gaps of the panels add up to at most ``tolerance`` of the target change. Real models have sharp
  features along the path in some layers (the target jumps within a narrow α band), where no fixed
  rule with few steps is accurate; the per-panel completeness gap finds them. ``steps`` gradient
  evaluations are spent towards a tenth of the tolerance (cheap insurance: errors of single
  positions can cancel in a sum); past them the rule grows only while the tolerance is missed, up
  to ``max_steps`` (8 × ``steps`` by default). Layers that miss it at the cap are flagged
  (``tolerance_met`` 0) and named in one warning.

Baselines: ``"position-mean"`` (the layer's output averaged over positions; Csordás' intent) or
``"hidden-mean"`` (averaged over the hidden dimension, which the paper's code does by accident).

- ``method="slow"``: one full forward + backward per (layer, step), as the published loop;
- ``method="fast"``: per layer, the steps are batch rows replayed from layer l+1 on, as many rows
  per pass as a memory budget allows (``rows_for_budget``: all 256 Riemann steps in one pass on a
  GPU; 16 on a CPU); the adaptive rule halves up to ``panels`` panels per round, so its evaluations are batched
  too.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import polars as pl
import torch

from ...errors import EffdepthError, EffdepthWarning, OptionError, require_layers, require_whole
from ...options import MAX_STEPS
from ...terminal import progress_bar
from ..replay import CleanRun, clean_run, run_layers
from ..trace import Hook, intervene, require_finite, show_progress
from ..wrapping import LoadedModel, takes_plain_models
from .shared.answers import AnswerInput, AnswerSplit, answer_splits
from .spec import KEY_ALWAYS, KEY_WHEN_SET, Chart, Context, Option, ProbeSpec, Shape, spelled

BASELINES = ("position-mean", "hidden-mean")
QUADRATURES = ("riemann", "gauss", "adaptive")
_PANEL_ORDER = 4  # Gauss nodes per panel of the adaptive rule
DEFAULT_TOLERANCE = 0.01  # of |target change|: the completeness the adaptive rule stops at
MAX_STEPS_FACTOR = 8  # the adaptive rule's default cap: 8 × steps gradient evaluations (1024 for 128)
_INNER_AIM = 0.1  # within the ``steps`` budget the adaptive rule refines towards this share of the tolerance
# Completeness gaps below this share of the target's magnitude count as met whatever the target
# change: in float32 a batched replay through smollm2-135m's 30 layers rounds differently from the
# one-row pass by up to ~1e-5 of the values' scale (tests/test_causal.py), and its completeness gaps
# bottom out at ~2e-5 of the target however fine the rule, so a layer whose target barely changes
# must not chase a relative tolerance below rounding. It is not scaled with the dtype: in bfloat16
# rounding alone leaves gaps of several % on smollm2-135m, and those layers are reported as misses
# rather than hidden under a floor.
_ROUNDING_SHARE = 1e-4


def rows_for_budget(loaded: LoadedModel, n_tokens: int, first_layer: int, n_answer: int, budget_bytes: int) -> int:
    """How many α rows one gradient pass from ``first_layer`` on may hold within ``budget_bytes``:
    per row, the autograd activations of the replayed layers (≈ 16·d_model + 4·d_ff elements per
    token and layer in the model's dtype, and a float32 attention map per head) and the float32
    softmax over the vocabulary at the answer positions (three copies: logits, probabilities,
    their gradient)."""
    config = loaded.model.config
    d_model = loaded.d_model
    d_ff = int(getattr(config, "intermediate_size", None) or 4 * d_model)
    heads = int(getattr(config, "num_attention_heads", None) or 1)
    element = torch.finfo(loaded.dtype).bits // 8
    per_token_layer = (16 * d_model + 4 * d_ff) * element + 4 * heads * n_tokens
    per_row = n_tokens * max(1, loaded.n_layers - first_layer) * per_token_layer + 12 * n_answer * loaded.vocab_size
    return max(1, budget_bytes // per_row)


CPU_ROWS = 16  # a CPU's α rows per pass: wider batches gain it little, and a budget would narrow them


def default_budget_bytes(loaded: LoadedModel) -> int | None:
    """The memory the fast path's batch rows may take: half of the GPU's free memory on CUDA; None
    elsewhere (``CPU_ROWS`` rows per pass)."""
    device = loaded.input_device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    return None


def gap_floor(ends: torch.Tensor) -> float:
    """The absolute completeness gap the tolerance never asks to go below, for a path whose target
    takes the values ``ends`` = [target(h), target(b)] (see ``_ROUNDING_SHARE``)."""
    return _ROUNDING_SHARE * float(ends.abs().max())


def default_max_steps(steps: int) -> int:
    """The adaptive rule's default cap on gradient evaluations for a budget of ``steps``."""
    return MAX_STEPS_FACTOR * steps


class PathIntegral(NamedTuple):
    """One layer's integrated gradients and what they cost."""

    attributions: torch.Tensor  # [token] float64
    ends: torch.Tensor  # [target(h), target(b)]
    grad_evals: int  # gradient evaluations (backward rows) spent
    panel_gap_sum: float  # Σ over α panels of |Σ attributions − the target's change across the panel|


def quadrature_rule(kind: str, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes α in [0, 1) and weights summing to 1."""
    if steps < 1:
        raise OptionError(f"steps must be at least 1, got {steps}")
    if kind == "riemann":
        return torch.arange(steps, dtype=torch.float64) / steps, torch.full((steps,), 1.0 / steps, dtype=torch.float64)
    if kind == "gauss":
        nodes, weights = np.polynomial.legendre.leggauss(steps)
        return torch.from_numpy((nodes + 1) / 2), torch.from_numpy(weights / 2)
    if kind == "adaptive":
        raise OptionError("the adaptive quadrature chooses its nodes per layer; it has no fixed rule")
    raise OptionError(f"quadrature must be one of {QUADRATURES}, got {kind!r}")


def make_baseline(h: torch.Tensor, kind: str) -> torch.Tensor:
    """Baseline for one layer output ``h`` ``[1, token, d]``, same shape."""
    if kind == "position-mean":
        return h.mean(dim=1, keepdim=True).expand_as(h)
    if kind == "hidden-mean":
        return h.mean(dim=2, keepdim=True).expand_as(h)
    raise OptionError(f"baseline must be one of {BASELINES}, got {kind!r}")


def _target(loaded: LoadedModel, final: torch.Tensor, split: AnswerSplit) -> torch.Tensor:
    """Summed probability of the answer tokens at the positions that predict them: ``[rows]``."""
    probs = torch.softmax(loaded.head(final[:, split.measured]).float(), dim=-1)  # [rows, A, vocab]
    index = split.targets.to(probs.device).view(1, -1, 1).expand(probs.shape[0], -1, 1)
    return probs.gather(-1, index).squeeze(-1).sum(-1)


@dataclass
class LayerPath:
    """The straight path x(α) = b + α(h − b) from the baseline to layer ``layer``'s output, with the
    target evaluated by replaying the layers above it (the fast path): nodes are batch rows."""

    loaded: LoadedModel
    run: CleanRun
    split: AnswerSplit
    layer: int
    baseline: torch.Tensor  # [1, token, d]
    max_rows: int = 16  # α rows per replay pass
    panels: int = 1  # panels the adaptive rule halves per round (1: always the worst one)

    @property
    def h(self) -> torch.Tensor:
        return self.run.hidden[self.layer + 1]

    def _points(self, alphas: torch.Tensor) -> torch.Tensor:
        a = alphas.to(self.h.device, self.h.dtype).view(-1, 1, 1)
        return self.baseline + a * (self.h - self.baseline)  # [rows, token, d]

    def targets_at(self, alphas: torch.Tensor) -> torch.Tensor:
        """target(x(α)) for each α (forward passes only), ``[len(alphas)]`` float64."""
        out = []
        with torch.no_grad():
            for start in range(0, len(alphas), self.max_rows):
                final = run_layers(
                    self.loaded, self.run, self.layer + 1, self._points(alphas[start : start + self.max_rows])
                )
                out.append(_target(self.loaded, final, self.split).double().cpu())
        return torch.cat(out)

    def node_attributions(self, nodes: torch.Tensor) -> torch.Tensor:
        """Σ_d (h − b)·∂target/∂x(α) per node and position, ``[node, token]`` float64."""
        diff = self.h - self.baseline
        out = []
        for start in range(0, len(nodes), self.max_rows):
            x = self._points(nodes[start : start + self.max_rows]).detach().requires_grad_(True)
            with torch.enable_grad():
                target = _target(self.loaded, run_layers(self.loaded, self.run, self.layer + 1, x), self.split)
                (grad,) = torch.autograd.grad(target.sum(), x)
            out.append((grad.double() * diff.double()).sum(-1).cpu())
        return torch.cat(out)

    def ends(self) -> torch.Tensor:
        """[target(h), target(b)]."""
        return self.targets_at(torch.tensor([1.0, 0.0]))

    def fixed_rule(self, nodes: torch.Tensor, weights: torch.Tensor) -> PathIntegral:
        """Attributions ``[token]`` under a fixed quadrature rule (one panel: [0, 1])."""
        attributions, ends = (self.node_attributions(nodes) * weights.view(-1, 1)).sum(0), self.ends()
        gap = abs(float(attributions.sum()) - float(ends[0] - ends[1]))
        return PathIntegral(attributions, ends, len(nodes), gap)

    def adaptive(
        self,
        steps: int,
        tolerance: float = DEFAULT_TOLERANCE,
        max_steps: int | None = None,
        floor: float | None = None,
    ) -> PathIntegral:
        """Gauss panels refined where completeness fails: on a panel [a, b] the attributions must
        sum to target(b) − target(a), so each panel's gap is an exact, free error indicator of the
        path integral there. The panel with the largest gap is halved (2 × 4 gradient evaluations),
        with up to ``panels`` − 1 more whose gaps exceed their equal share of the goal, in one pass

        - while fewer than ``steps`` evaluations are spent and the gaps add up to more than a tenth
          of ``tolerance`` × |target change| (the old fixed-budget rule at the default tolerance);
        - past that, while they add up to more than ``tolerance`` × |target change| and the cap
          ``max_steps`` (default 8 × ``steps``) is not reached.

        Gaps below ``floor`` (absolute; default ``gap_floor``: float32 rounding) always count as met.
        The summed |panel gaps| bound the layer's |completeness gap|; the tolerance is met when they
        are within it."""
        max_steps = default_max_steps(steps) if max_steps is None else max_steps
        if max_steps < steps:
            raise OptionError(f"max_steps ({max_steps}) must be at least steps ({steps})")
        base_nodes, base_weights = quadrature_rule("gauss", _PANEL_ORDER)
        n_start = max(1, min(8, steps // _PANEL_ORDER))
        edges = torch.linspace(0, 1, n_start + 1, dtype=torch.float64)
        f_edges = self.targets_at(edges)

        def panel_attributions(bounds: list[tuple[float, float]]) -> list[torch.Tensor]:
            nodes = torch.cat([a + base_nodes * (b - a) for a, b in bounds])
            per_node = self.node_attributions(nodes).view(len(bounds), _PANEL_ORDER, -1)
            return [(per_node[i] * (base_weights * (b - a)).view(-1, 1)).sum(0) for i, (a, b) in enumerate(bounds)]

        bounds = [(float(edges[i]), float(edges[i + 1])) for i in range(n_start)]
        ends = {bound: (float(f_edges[i]), float(f_edges[i + 1])) for i, bound in enumerate(bounds)}
        attributions = dict(zip(bounds, panel_attributions(bounds), strict=True))
        used = n_start * _PANEL_ORDER
        total_change = abs(float(f_edges[-1] - f_edges[0]))
        if floor is None:
            floor = gap_floor(f_edges[[-1, 0]])
        allowed = tolerance * total_change + floor
        aim = _INNER_AIM * tolerance * total_change + floor

        def gap(bound: tuple[float, float]) -> float:
            return abs(float(attributions[bound].sum()) - (ends[bound][1] - ends[bound][0]))

        def goal() -> float | None:
            """What the panel gaps must add up to before the next round (None: stop refining)."""
            gaps = sum(map(gap, attributions))
            if used + 2 * _PANEL_ORDER <= steps:
                return aim if gaps > aim else None
            return allowed if used + 2 * _PANEL_ORDER <= max_steps and gaps > allowed else None

        while (target := goal()) is not None:
            # the worst panel, and up to ``panels`` − 1 more of the largest gaps that exceed their
            # equal share of the goal (some panel always does while the gaps add up to more), as
            # long as the evaluations stay within the budget of this phase
            limit = steps if used + 2 * _PANEL_ORDER <= steps else max_steps
            room = max(1, (limit - used) // (2 * _PANEL_ORDER))
            ranked = sorted(attributions, key=gap, reverse=True)
            share = target / len(ranked)
            chosen = [ranked[0]] + [b for b in ranked[1 : min(self.panels, room)] if gap(b) > share]
            middles = [(a + b) / 2 for a, b in chosen]
            f_middles = self.targets_at(torch.tensor(middles, dtype=torch.float64)).tolist()
            halves = [half for (a, b), m in zip(chosen, middles, strict=True) for half in ((a, m), (m, b))]
            for half, value in zip(halves, panel_attributions(halves), strict=True):
                attributions[half] = value
            for (a, b), m, f_m in zip(chosen, middles, f_middles, strict=True):
                ends[(a, m)], ends[(m, b)] = (ends[(a, b)][0], f_m), (f_m, ends[(a, b)][1])
                del attributions[(a, b)], ends[(a, b)]
            used += 2 * _PANEL_ORDER * len(chosen)
        return PathIntegral(
            sum(attributions.values()),
            torch.tensor([float(f_edges[-1]), float(f_edges[0])]),
            used,
            sum(map(gap, attributions)),
        )


def _layer_slow(
    loaded: LoadedModel,
    split: AnswerSplit,
    layer: int,
    baseline: torch.Tensor,
    nodes: torch.Tensor,
    weights: torch.Tensor,
    block: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle: full forwards + backwards of the whole model, the output of layer ``layer``
    replaced by x(α) through a hook — ``block`` values of α per pass, as rows of one batch from that
    layer on (the published script batches 16: ``BLOCK_SIZE`` in ``plot_integrated_gradients.py``)."""
    input_ids = split.without_last().view(1, -1).to(loaded.input_device)
    state: dict[str, torch.Tensor] = {}

    def replace(h: torch.Tensor, _) -> torch.Tensor:  # h: [rows, token, d] (equal rows) → x: [rows, token, d]
        b = baseline.to(h.device)
        state["diff"] = (h[:1] - b).detach()
        alphas = state["alphas"].to(h.device, h.dtype).view(-1, 1, 1)
        state["x"] = (b + alphas * state["diff"]).requires_grad_(True)
        return state["x"]

    def target_of(alphas: torch.Tensor, grad: bool) -> torch.Tensor:
        state["alphas"] = alphas
        with torch.enable_grad() if grad else torch.no_grad():  # a row per α from the embedding on, so that
            rows = input_ids.expand(len(alphas), -1)  # every argument a block gets has the batch's size (ALiBi's)
            logits = loaded.model(input_ids=rows, use_cache=False).logits[:, split.measured]
            probs = torch.softmax(logits.float(), dim=-1)
            targets = split.targets.view(1, -1, 1).to(probs.device).expand(probs.shape[0], -1, 1)
            return probs.gather(-1, targets).sum(dim=(1, 2))  # [rows]

    with intervene([Hook(loaded.layers[layer], "output", replace)]):
        grad_sum = 0.0
        for start in range(0, len(nodes), block):
            alphas, w = nodes[start : start + block], weights[start : start + block]
            target = target_of(alphas, grad=True)
            (grad,) = torch.autograd.grad(target.sum(), state["x"])  # rows are independent: one backward
            grad_sum = grad_sum + (grad.double() * w.view(-1, 1, 1).to(grad.device)).sum(0, keepdim=True)
        ends = target_of(torch.tensor([1.0, 0.0], dtype=torch.float64), grad=False)
    return (state["diff"].double() * grad_sum).sum(-1)[0], ends


def check_tolerance(tolerance: float, max_steps: int | None, steps: int) -> None:
    """ValueError for a tolerance or cap that cannot work (the command line says it in one line)."""
    if not (isinstance(tolerance, int | float) and math.isfinite(tolerance) and 0 < tolerance < 1):
        raise OptionError(f"the completeness tolerance igrad_tol must be a fraction in (0, 1), got {tolerance!r}")
    if max_steps is not None and max_steps < steps:
        raise OptionError(f"igrad_max_steps ({max_steps}) must be at least igrad_steps ({steps})")


@takes_plain_models()
def integrated_gradients(
    loaded: LoadedModel,
    examples: Sequence[AnswerInput],
    igrad_steps: int = 128,
    igrad_quadrature: str = "adaptive",
    igrad_baseline: str = "position-mean",
    method: str = "fast",
    layers: Sequence[int] | None = None,
    max_rows: int | None = None,
    progress: bool | None = None,
    igrad_tol: float = DEFAULT_TOLERANCE,
    igrad_max_steps: int | None = None,
    slow_block: int = 1,
    igrad_panels: int = 1,
    memory_budget_mb: int | None = None,
) -> pl.DataFrame:
    """Per-layer integrated-gradient attributions to every position towards the answer tokens.

    Long frame ``example, layer, position, metric, value`` with metric ``attribution`` per position
    and, per layer (``position`` null): ``target_delta`` = target(h) − target(b),
    ``attribution_sum``, ``completeness_gap`` = attribution_sum − target_delta, ``grad_evals`` (the
    gradient evaluations spent), ``panel_gap_sum`` (Σ over the rule's α panels of their completeness
    gaps' magnitudes, ≥ |completeness_gap|; one panel [0, 1] for the fixed rules) and
    ``tolerance_met`` (1 when panel_gap_sum ≤ ``igrad_tol`` × |target_delta| + ``gap_floor``, the
    float32 rounding floor of 1e-4 of the target's magnitude; else 0).

    Options are spelled as ``measure`` and ``effdepth run`` spell them (``igrad_steps`` is
    ``--igrad-steps``). The adaptive rule refines until the tolerance is met or ``igrad_max_steps``
    (default 8 × ``igrad_steps``) gradient evaluations are spent; the fixed rules spend
    ``igrad_steps`` and are only checked. Every layer that misses the tolerance is named in one
    warning at the end. ``slow_block``: the values of α the slow path evaluates per forward pass
    (1: the oracle; 16: the published script). ``max_rows``: α rows per pass of the fast path
    (default: as many as ``memory_budget_mb`` holds, by default half the GPU's free memory; 16 on
    a CPU without a budget); ``igrad_panels``: panels the adaptive rule halves per round (1, the
    default, always halves the single worst one; more batch its evaluations on a GPU, a slightly
    different refinement to the same tolerance).

    Args:
        loaded: a ``LoadedModel`` (``load_model``/``wrap_model``) or a transformers causal LM.
        examples: ``Example``s with an answer (or (prompt, answer) pairs).
        igrad_steps, igrad_quadrature, igrad_baseline, igrad_tol, igrad_max_steps, igrad_panels:
            the path integral's rule and tolerance, as above.
        method: ``"fast"`` (α rows batched) or ``"slow"`` (the oracle).
        layers: the layers to attribute at (None: every layer).
        max_rows, slow_block, memory_budget_mb: how much one pass holds, as above.
        progress: show progress bars (None: when attached to a terminal or notebook).
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        The long frame above.
    """
    for option, value in ((IGRAD_STEPS, igrad_steps), (IGRAD_QUADRATURE, igrad_quadrature),
                          (IGRAD_BASELINE, igrad_baseline), (IGRAD_TOL, igrad_tol),
                          (IGRAD_MAX_STEPS, igrad_max_steps), (IGRAD_PANELS, igrad_panels)):  # fmt: skip
        option.check(value)
    steps, quadrature, baseline = igrad_steps, igrad_quadrature, igrad_baseline
    tolerance, max_steps, panels = igrad_tol, igrad_max_steps, igrad_panels
    require_whole("slow_block", slow_block)
    if max_rows is not None:
        require_whole("max_rows", max_rows)
    if memory_budget_mb is not None:
        require_whole("memory_budget_mb", memory_budget_mb)
    if method not in ("fast", "slow"):
        raise OptionError(f"method must be 'fast' or 'slow', got {method!r}")
    check_tolerance(tolerance, max_steps, steps)
    if quadrature == "adaptive":
        if method == "slow":
            raise OptionError("the adaptive quadrature has no slow path; use riemann or gauss with method='slow'")
        if steps < _PANEL_ORDER:
            raise OptionError(f"the adaptive quadrature needs at least {_PANEL_ORDER} steps, got {steps}")
        nodes = weights = None
    else:
        nodes, weights = quadrature_rule(quadrature, steps)
    every = list(range(loaded.n_layers))
    chosen = every if layers is None else require_layers("layers", layers, loaded.n_layers, loaded.name)
    splits = answer_splits(loaded, examples)
    budget = default_budget_bytes(loaded) if memory_budget_mb is None else memory_budget_mb << 20
    rows: dict[str, list] = {k: [] for k in ("example", "layer", "position", "metric", "value")}
    misses: list[str] = []

    def add(example: int, layer: int, position: int | None, metric: str, value: float) -> None:
        for key, v in zip(rows, (example, layer, position, metric, value), strict=True):
            rows[key].append(v)

    with progress_bar(
        total=len(splits) * len(chosen), desc=f"igrad ({method})", unit="layer", disable=not show_progress(progress)
    ) as bar:
        for example, split in enumerate(splits):
            run = clean_run(loaded, split.without_last())  # by causality the last token cannot matter
            for layer in chosen:
                base = make_baseline(run.hidden[layer + 1], baseline)
                width = max_rows or CPU_ROWS
                if max_rows is None and budget is not None:
                    width = rows_for_budget(loaded, run.n_tokens, layer + 1, len(split.targets), budget)
                path = LayerPath(loaded, run, split, layer, base, width, panels)
                if quadrature == "adaptive":
                    result = path.adaptive(steps, tolerance, max_steps)
                elif method == "fast":
                    result = path.fixed_rule(nodes, weights)
                else:
                    attributions, ends = _layer_slow(loaded, split, layer, base, nodes, weights, slow_block)
                    gap = abs(float(attributions.sum()) - float(ends[0] - ends[1]))
                    result = PathIntegral(attributions, ends, len(nodes), gap)
                attributions = torch.cat(
                    [result.attributions.cpu(), torch.zeros(1, dtype=result.attributions.dtype)]
                )  # last token: 0
                ends = result.ends.cpu().to(attributions.dtype)
                where = f"the integrated gradients of layer {layer} (prompt {example})"
                checked = torch.cat([attributions, ends, torch.tensor([result.panel_gap_sum], dtype=ends.dtype)])
                require_finite(checked, where, loaded.name)
                for position, value in enumerate(attributions.tolist()):
                    add(example, layer, position, "attribution", value)
                delta = float(ends[0] - ends[1])
                total = float(attributions.sum())
                met = result.panel_gap_sum <= tolerance * abs(delta) + gap_floor(ends)
                add(example, layer, None, "target_delta", delta)
                add(example, layer, None, "attribution_sum", total)
                add(example, layer, None, "completeness_gap", total - delta)
                add(example, layer, None, "grad_evals", float(result.grad_evals))
                add(example, layer, None, "panel_gap_sum", result.panel_gap_sum)
                add(example, layer, None, "tolerance_met", float(met))
                if not met:
                    share = f"{result.panel_gap_sum / abs(delta):.1%}" if delta else f"{result.panel_gap_sum:.2g} of 0"
                    misses.append(f"prompt {example} layer {layer} ({share}, {result.grad_evals})")
                bar.update(1)
    if misses:
        if quadrature == "adaptive":
            spent = f"the cap of {default_max_steps(steps) if max_steps is None else max_steps} gradient evaluations"
            hint = f"raise {spelled('igrad_max_steps')} or read those layers with care"
        else:
            spent = f"{steps} {quadrature} steps"
            hint = f"raise {spelled('igrad_steps')} or use {spelled('igrad_quadrature', 'adaptive')}"
        if loaded.dtype not in (torch.float32, torch.float64):
            dtype = str(loaded.dtype).removeprefix("torch.")
            hint = f"in {dtype} rounding alone can exceed it: try {spelled('dtype', 'float32')}"
        listed = "; ".join(misses[:8]) + (f"; and {len(misses) - 8} more" if len(misses) > 8 else "")
        warnings.warn(
            f"integrated gradients missed the completeness tolerance ({tolerance:.2%} of the target change) at "
            f"{spent} in {len(misses)} layer(s) (summed panel gaps over |target change|, gradient evaluations): "
            f"{listed}; {hint}",
            EffdepthWarning,
            stacklevel=2,
        )
    schema = {"example": pl.Int64, "layer": pl.Int64, "position": pl.Int64, "metric": pl.String, "value": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


# --- the probe -------------------------------------------------------------------------------

IGRAD_STEPS = Option(
    "igrad_steps",
    128,
    "quadrature nodes or adaptive budget (igrad)",
    type=int,
    minimum=1,
    maximum=MAX_STEPS,
    key=KEY_ALWAYS,
)
IGRAD_QUADRATURE = Option(
    "igrad_quadrature", "adaptive", "the α quadrature (igrad)", choices=("adaptive", "riemann", "gauss"), key=KEY_ALWAYS
)
IGRAD_BASELINE = Option(
    "igrad_baseline",
    "position-mean",
    "the baseline: the layer's output averaged over positions, or over the hidden dimension (the paper's code)",
    choices=BASELINES,
    key=KEY_ALWAYS,
)
IGRAD_TOL = Option(
    "igrad_tol",
    DEFAULT_TOLERANCE,
    "completeness tolerance per layer, a share of the target change (igrad; 0.01 = 1 %)",
    type=float,
    minimum=0,
    maximum=1,
    open_interval=True,
)
IGRAD_MAX_STEPS = Option(
    "igrad_max_steps",
    None,
    "cap on the adaptive rule's gradient evaluations per layer (igrad; default 8 × --igrad-steps)",
    type=int,
    minimum=1,
    maximum=8 * MAX_STEPS,
)
IGRAD_PANELS = Option(
    "igrad_panels",
    1,
    "panels the adaptive rule halves per round (igrad; 1 halves the worst one; 8 batches a GPU's work)",
    type=int,
    minimum=1,
    maximum=MAX_STEPS,  # more panels than gradient evaluations cannot be halved
    key=KEY_WHEN_SET,
)


def _check(settings, facts) -> None:
    if settings.igrad_quadrature == "adaptive":
        if settings.igrad_steps < _PANEL_ORDER:
            raise EffdepthError(
                f"{spelled('igrad_steps', settings.igrad_steps)} is too few for the adaptive quadrature "
                f"(its panels have {_PANEL_ORDER} Gauss nodes; give at least {_PANEL_ORDER}, 128 by default)"
            )
        if settings.method == "slow":
            raise EffdepthError(
                "the slow method has no adaptive quadrature; add "
                f"{spelled('igrad_quadrature', 'riemann')} (the paper's, 256 steps)"
            )
    if settings.igrad_max_steps is not None and settings.igrad_max_steps < settings.igrad_steps:
        raise EffdepthError(
            f"{spelled('igrad_max_steps', settings.igrad_max_steps)} is below "
            f"{spelled('igrad_steps', settings.igrad_steps)}; "
            "the cap must be at least the budget"
        )


def _compute(loaded: LoadedModel, examples: Sequence, context: Context) -> pl.DataFrame:
    settings = context.settings
    return integrated_gradients(
        loaded,
        examples,
        igrad_steps=settings.igrad_steps,
        igrad_quadrature=settings.igrad_quadrature,
        igrad_baseline=settings.igrad_baseline,
        method=settings.method,
        progress=context.progress,
        igrad_tol=settings.igrad_tol,
        igrad_max_steps=settings.igrad_max_steps,
        igrad_panels=settings.igrad_panels,
    )


def _outdated(record, settings) -> str | None:
    """Revision 2: the adaptive rule stops on a completeness tolerance (grad_evals, tolerance_met);
    the fixed rules' numbers did not change."""
    if settings.igrad_quadrature == "adaptive" and int(record.get("revision", 1)) < 2:
        return (
            "come from the earlier adaptive rule (a fixed budget of --igrad-steps, no completeness tolerance); "
            "rerun into a new --out to apply the tolerance"
        )
    return None


def _cell(summary, frames) -> str:
    saved = frames.get("igrad")
    if saved is None or saved.is_empty():
        return "—"
    per_layer = saved.filter(metric="attribution").group_by("layer").agg(pl.col("value").abs().sum())
    top = per_layer.sort("value", descending=True).row(0, named=True)
    met = saved.filter(metric="tolerance_met")["value"]
    return f"most attribution at layer {top['layer']}; tolerance met in {int(met.sum())}/{met.len()} layers"


def _work(shape: Shape, settings, lengths) -> float:
    # a forward and a backward (~3 passes) per quadrature step and layer, from that layer on (~L/2)
    return 3 * shape.forward * settings.igrad_steps * shape.n_layers / 2 * sum(lengths)


SPEC = ProbeSpec(
    name="igrad",
    title="integrated gradients",
    compute=_compute,
    options=(IGRAD_STEPS, IGRAD_QUADRATURE, IGRAD_BASELINE, IGRAD_TOL, IGRAD_MAX_STEPS, IGRAD_PANELS),
    cell=_cell,
    charts=(Chart("igrad", "attribution_heatmap", "igrad_by_example"),),
    unit="layer",
    needs_answers=True,
    reusable=True,
    check=_check,
    revision=2,
    outdated=_outdated,
    description="per-layer integrated gradients towards the answer tokens, to a completeness tolerance (§5)",
    work=_work,  # its operations, for the grid's cost model
)
