"""What effective depth buys, part 1 — layer pruning (method.md §7b): remove layers and measure
how much worse the model predicts the answer tokens (their mean negative log-likelihood and
top-1 accuracy). Removing a layer is the all-token skip of the skip probe: its output is its input.

Every block of k consecutive layers (k = 1, 2, 4 and ⌈L/4⌉; every start) is removed, which also
covers two layer-choice rules: "after ED" (the block that starts right after an ED; clipped to end
at layer L-1) and Gromov et al.'s angular distance (the block of k whose input and output
residuals are closest in angle). The third rule, ShortGPT's block influence 1 − cos(h_l, h_{l+1})
(Men et al. 2024), removes the k least influential layers, consecutive or not, and is run as its
own set. Both scores are averaged over the tokens of a calibration set (``calibration``; by default
the scored prompts themselves), as ShortGPT does, so that the scored prompts can stay held out.

Fast path: one clean pass per prompt, then each removal set is a batch row replayed from its first
removed layer on (earlier layers cannot change), its removed layers passing the residual through.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import polars as pl
import torch

from ...errors import EffdepthError, require_whole
from ...terminal import progress_bar
from ..replay import CleanRun, clean_run, run_layer
from ..trace import require_finite, show_progress, tokenize
from ..wrapping import LoadedModel, takes_plain_models
from .shared.answers import AnswerInput, AnswerSplit, answer_splits
from .shared.reduce import token_weighted_mean
from .spec import Context, Option, ProbeSpec, Shape, spelled

SCHEMA = {
    "example": pl.Int64,
    "rule": pl.String,  # none | block | shortgpt (scores); influence | block (calibration scores)
    "k": pl.Int64,  # layers removed
    "start": pl.Int64,  # first layer of a block (null for none and shortgpt)
    "removed": pl.String,  # the removed layers, "3,4,5"
    "metric": pl.String,
    "value": pl.Float64,
    "n_tokens": pl.Int64,  # answer tokens (scores) or tokens (block influence, angular distance)
}


def default_block_sizes(n_layers: int) -> list[int]:
    """k = 1, 2, 4 and ⌈L/4⌉, those below L."""
    return sorted({k for k in (1, 2, 4, math.ceil(n_layers / 4)) if 1 <= k < n_layers})


def answer_scores(loaded: LoadedModel, final: torch.Tensor, split: AnswerSplit) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean answer NLL and top-1 accuracy ``[rows]`` from final residuals ``[rows, token, d]``."""
    logp = torch.log_softmax(loaded.head(final[:, split.measured]).float(), dim=-1)  # [rows, answer, vocab]
    targets = split.targets.to(logp.device)
    nll = -logp.gather(-1, targets.view(1, -1, 1).expand(logp.shape[0], -1, 1)).squeeze(-1)
    accuracy = (logp.argmax(-1) == targets).float()
    return nll.mean(-1).cpu(), accuracy.mean(-1).cpu()


def pruned_final(loaded: LoadedModel, run: CleanRun, removed: Sequence[Sequence[int]]) -> torch.Tensor:
    """h_L ``[rows, token, d]`` of the model with each row's layers removed (rows sharing no start
    are fine: each joins at its own first removed layer; an empty set is the clean h_L)."""
    n_layers = loaded.n_layers
    sets = [frozenset(r) for r in removed]
    firsts = [min(s) if s else n_layers for s in sets]
    order = sorted(range(len(sets)), key=lambda i: firsts[i])
    hidden = run.hidden[0][:, :0].new_empty(0, run.n_tokens, run.hidden[0].shape[-1])
    joined = 0
    with torch.inference_mode():
        for layer in range(min(firsts, default=n_layers), n_layers):
            joining = [i for i in order[joined:] if firsts[i] == layer]
            if joining:
                hidden = torch.cat([hidden, run.hidden[layer].expand(len(joining), -1, -1).to(hidden.device)])
                joined += len(joining)
            keep = torch.tensor([layer in sets[i] for i in order[:joined]], device=hidden.device)
            if bool(keep.all()):
                continue
            new = run_layer(loaded, run, layer, hidden)
            hidden = torch.where(keep.view(-1, 1, 1), hidden.to(new.device), new) if bool(keep.any()) else new
        rest = order[joined:]  # empty sets: the clean final residual
        if rest:
            hidden = torch.cat([hidden, run.hidden[n_layers].expand(len(rest), -1, -1).to(hidden.device)])
    out = torch.empty_like(hidden)
    out[torch.tensor(order, device=hidden.device)] = hidden
    return out


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine per token of ``[1, token, d]`` states → ``[token]``."""
    a, b = a[0].float(), b[0].float()
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-12)


@takes_plain_models()
def layer_pruning(
    loaded: LoadedModel,
    examples: Sequence[AnswerInput],
    prune_sizes: Sequence[int] | None = None,
    calibration: Sequence[str | torch.Tensor] | None = None,
    max_rows: int = 16,
    progress: bool | None = None,
) -> pl.DataFrame:
    """Per example: the answer NLL and accuracy of the clean model (rule ``none``), of every block
    of ``k`` consecutive layers removed (``block``), and of ShortGPT's ``k`` lowest-influence layers
    removed (``shortgpt``). Plus, per calibration text (``example`` = its index; default: the scored
    prompts), each layer's block influence (rule ``influence``) and each block's angular distance
    (rule ``block``): the scores the rules choose layers by.

    Args:
        loaded: a ``LoadedModel`` (``load_model``/``wrap_model``) or a transformers causal LM.
        examples: ``Example``s with an answer (or (prompt, answer) pairs).
        prune_sizes: the numbers k of layers removed (None: 1, 2, 4 and ⌈L/4⌉, those below L).
        calibration: texts the rules score layers on (None: the examples' prompts).
        max_rows: pruned copies per forward pass.
        progress: show progress bars (None: when attached to a terminal or notebook).
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        A long frame ``example, rule, k, start, removed, metric, value``.
    """
    n_layers = loaded.n_layers
    require_whole("max_rows", max_rows)
    sizes = sorted(set(prune_sizes or default_block_sizes(n_layers)))
    if not sizes or sizes[0] < 1 or sizes[-1] >= n_layers:
        raise EffdepthError(
            f"{spelled('prune_sizes')} must be in 1..{n_layers - 1} for {loaded.name}, got {list(sizes)}"
        )
    splits = answer_splits(loaded, examples)
    runs = [clean_run(loaded, split.without_last()) for split in splits]
    scoring = (
        runs
        if calibration is None
        else [clean_run(loaded, ids) for ids in tokenize(loaded, calibration, truncate=True)]
    )
    rows: list[tuple] = []
    influence = torch.zeros(n_layers, dtype=torch.float64)
    tokens = 0
    for example, run in enumerate(scoring):
        for layer in range(n_layers):
            bi = 1 - _cosine(run.hidden[layer], run.hidden[layer + 1])
            influence[layer] += bi.double().sum()
            rows.append((example, "influence", 1, layer, str(layer), "block_influence", float(bi.mean()), run.n_tokens))
        for k in sizes:
            for start in range(n_layers - k + 1):
                angle = torch.arccos(_cosine(run.hidden[start], run.hidden[start + k]).clamp(-1, 1)) / math.pi
                removed = ",".join(map(str, range(start, start + k)))
                rows.append(
                    (example, "block", k, start, removed, "angular_distance", float(angle.mean()), run.n_tokens)
                )
        tokens += run.n_tokens
    least = (influence / tokens).argsort().tolist()  # ShortGPT: the same layers for every prompt
    sets: list[tuple[str, int, int | None, tuple[int, ...]]] = [("none", 0, None, ())]
    sets += [("block", k, s, tuple(range(s, s + k))) for k in sizes for s in range(n_layers - k + 1)]
    sets += [("shortgpt", k, None, tuple(sorted(least[:k]))) for k in sizes]
    pairs = list(zip(runs, splits, strict=True))
    bar = progress_bar(
        total=len(pairs) * len(sets), desc="pruning", unit="removal", disable=not show_progress(progress)
    )
    for example, (run, split) in enumerate(pairs):
        for first in range(0, len(sets), max_rows):
            chunk = sets[first : first + max_rows]
            bar.update(len(chunk))
            final = pruned_final(loaded, run, [s[3] for s in chunk])
            require_finite(final, "a pruned model's last residual", loaded.name)
            nll, accuracy = answer_scores(loaded, final, split)
            require_finite(nll, "a pruned model's answer log-likelihood", loaded.name)
            for (rule, k, start, removed), n, a in zip(chunk, nll.tolist(), accuracy.tolist(), strict=True):
                names = ",".join(map(str, removed))
                rows.append((example, rule, k, start, names, "answer_nll", n, split.n_answer))
                rows.append((example, rule, k, start, names, "answer_accuracy", a, split.n_answer))
    bar.close()
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def prune_summary(per_example: pl.DataFrame) -> pl.DataFrame:
    """Token-weighted means over prompts per (rule, k, start, removed, metric), plus ``delta_nll``:
    the answer NLL's increase over the clean model's."""
    keys = ["rule", "k", "start", "removed", "metric"]
    mean = token_weighted_mean(per_example, keys)
    clean = mean.filter(rule="none", metric="answer_nll")["value"]
    delta = mean.filter(pl.col("metric") == "answer_nll", pl.col("rule").is_in(["block", "shortgpt"])).with_columns(
        metric=pl.lit("delta_nll"), value=pl.col("value") - (clean[0] if len(clean) else None)
    )
    return pl.concat([mean, delta]).sort(keys, nulls_last=True)


def after_ed_block(ed: int, k: int, n_layers: int, keep_final: bool = False) -> int | None:
    """Start of the "after ED" block of k layers: ED+1, moved back so that it ends at L-1 at the latest
    (at L-2 with ``keep_final``: a block that never removes the final layer; None when none fits)."""
    last = n_layers - k - (1 if keep_final else 0)
    return max(0, min(ed + 1, last)) if last >= 0 else None


FINAL_KEPT = "final layer kept"


def rule_comparison(summary: pl.DataFrame, eds: dict[str, int | None], n_layers: int) -> pl.DataFrame:
    """For every budget k: ΔNLL and accuracy of the layers each rule removes — ``after ED (<rule>)``
    for each ED rule given (and ``after ED (<rule>), final layer kept``: the block moved back to end
    at L-2, since the plain one ends at L-1 when ED + k reaches past it), ``angular distance`` and
    ``block influence``. Columns ``k, choice, removed, delta_nll, answer_accuracy``."""
    scored = summary.filter(pl.col("rule").is_in(["none", "block", "shortgpt"]))  # not the calibration scores
    wide = scored.pivot(on="metric", index=["rule", "k", "start", "removed"], values="value")
    rows = []
    for k in sorted(wide.filter(rule="block")["k"].unique().to_list()):
        blocks = wide.filter(rule="block", k=k)
        picks = []
        for name, ed in eds.items():
            if ed is None:
                continue
            picks.append((f"after ED ({name})", blocks.filter(start=after_ed_block(ed, k, n_layers))))
            kept = after_ed_block(ed, k, n_layers, keep_final=True)
            if kept is not None:
                picks.append((f"after ED ({name}), {FINAL_KEPT}", blocks.filter(start=kept)))
        picks.append(("angular distance", blocks.sort("angular_distance").head(1)))
        picks.append(("block influence", wide.filter(rule="shortgpt", k=k)))
        for choice, row in picks:
            if row.height:
                r = row.row(0, named=True)
                rows.append((k, choice, r["removed"], r["delta_nll"], r["answer_accuracy"]))
    schema = {
        "k": pl.Int64,
        "choice": pl.String,
        "removed": pl.String,
        "delta_nll": pl.Float64,
        "answer_accuracy": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema, orient="row")


# --- the probe -------------------------------------------------------------------------------

PRUNE_CALIBRATION_TEXTS = 32  # lens-corpus texts (~2,500 tokens) that block influence and angles are measured on


def _sizes(text: str) -> list[int]:
    return [int(k) for k in str(text).split(",") if k.strip()]


def _normalize_sizes(text: str) -> str:
    """One spelling per set of sizes ("2,1", "1,,2" → "1,2"; a whole number 2 → "2"); anything else
    is left for the check (which names it without converting it: no 5000-digit number is printed)."""
    if isinstance(text, int) and not isinstance(text, bool) and 0 <= text < 10**9:
        text = str(text)
    if not isinstance(text, str):
        return text
    names = [k.strip() for k in text.split(",") if k.strip()]
    if all(_whole(k) for k in names):
        return ",".join(str(k) for k in sorted({int(k) for k in names}))
    return str(text)


def _whole(text: str) -> bool:
    """An ASCII whole number a layer count can reach (9 digits: ``int`` never meets its 4300-digit limit)."""
    return text.isascii() and text.isdigit() and len(text) <= 9


def _check_sizes(text: str) -> str | None:
    names = [k.strip() for k in str(text).split(",") if k.strip()]
    if not all(_whole(k) and int(k) >= 1 for k in names):
        shown = repr(text) if len(repr(text)) <= 60 else repr(text)[:57] + "..."
        return f"must be whole numbers of at least 1 (below the model's layers), got {shown}"
    return None


PRUNE_SIZES = Option(
    "prune_sizes",
    "",
    "pruned block sizes k, comma list (default 1,2,4,ceil(L/4))",
    normalize=_normalize_sizes,
    check_value=_check_sizes,
)


def _check(settings, facts) -> None:
    n_layers = facts.get("n_layers")
    if n_layers is not None and any(k >= n_layers for k in _sizes(settings.prune_sizes)):
        raise EffdepthError(
            f"{spelled('prune_sizes', settings.prune_sizes)} must stay below the model's {n_layers} layers "
            "(removing every layer leaves no model)"
        )


def _compute(loaded: LoadedModel, examples: Sequence, context: Context) -> pl.DataFrame:
    from ...tasks import lens_corpus

    # the rules choose layers on calibration text (never probed), so the scored prompts stay held out
    calibration = lens_corpus()[:PRUNE_CALIBRATION_TEXTS]
    sizes = _sizes(context.settings.prune_sizes) or None
    return layer_pruning(loaded, examples, prune_sizes=sizes, calibration=calibration, progress=context.progress)


def _cell(summary, frames) -> str:
    saved = frames.get("prune")
    if saved is None or saved.is_empty():
        return "—"
    single = saved.filter(rule="block", k=1, metric="delta_nll").sort("value")
    if single.is_empty():
        return "—"
    best = single.row(0, named=True)
    return f"cheapest single layer to remove: {best['start']} (ΔNLL {best['value']:+.2f})"


def _work(shape: Shape, settings, lengths) -> float:
    sizes = _sizes(settings.prune_sizes) or [1, 2, 4, math.ceil(shape.n_layers / 4)]
    removals = sum(max(shape.n_layers - k + 1, 0) + 1 for k in sizes)  # every block, plus ShortGPT's set
    return shape.forward * (1 + removals / 2) * sum(lengths)  # each replayed from its first layer (~half)


SPEC = ProbeSpec(
    name="prune",
    title="layer pruning",
    compute=_compute,
    options=(PRUNE_SIZES,),
    aggregate=prune_summary,
    cell=_cell,
    unit="removal",
    needs_answers=True,
    check=_check,
    description="remove blocks of layers (every start; ShortGPT's least influential): the answer's NLL and "
    "accuracy (§7b)",
    work=_work,  # its operations, for the grid's cost model
)
