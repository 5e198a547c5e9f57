"""Layer skipping: the effect of skipping a layer (or its attention / MLP) on later layers'
contributions and on the output distribution (method.md §3, Csordás Fig. 3).

Two paths give the same numbers:
- ``method="slow"``: one full forward pass per intervention, as the published loops do (the oracle);
- ``method="fast"``: one clean pass per prompt, then interventions stacked as batch rows and replayed
  from the skipped layer on (layers before it cannot change), in chunks of ``max_rows``; the
  future-token variant replays positions ≥ t from layer s + 1 only, against the prefixes of the
  all-token skip of the same layer (``_future_fast``; method.md §8).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl
import torch

from ...errors import EffdepthError, EffdepthWarning, OptionError, require_whole
from ...options import MAX_CONTEXT
from ...terminal import progress_bar
from ..replay import CleanRun, clean_run, recorded_forward, run_layer, run_suffix_layer
from ..trace import Hook, intervene, replace_positions, require_finite, show_progress, tokenize
from ..wrapping import LoadedModel, takes_plain_models
from .shared.depth_score import depth_scores
from .shared.output_change import OUTPUT_METRIC_OPTION, change_of, check_output_metric, head_buffer, output_change
from .spec import KEY_ALWAYS, Chart, Context, Option, ProbeSpec, Shape, prompts_of, spelled

SKIP_PARTS = ("layer", "attn", "mlp")
VARIANTS = ("future", "current")
OUTPUT_NAMES = {"l2": "output_effect", "kl": "output_kl"}  # the frame's metric per output_metric
MIN_TOKENS = {"future": 13, "current": 2}  # future: range(8, T-4, 8) must not be empty


def check_skip_options(parts: Sequence[str], variants: Sequence[str]) -> None:
    """One-line error for an unknown or empty list of skip parts or variants."""
    for kind, given, known in (("part", parts, SKIP_PARTS), ("variant", variants, VARIANTS)):
        bad = [x for x in given if x not in known]
        if bad or not given:
            raise EffdepthError(
                f"unknown skip {kind}(s) {', '.join(map(repr, bad)) or '(none given)'}; choose from {', '.join(known)}"
            )


@dataclass(frozen=True)
class Intervention:
    """Skip ``part`` of layer ``layer`` at token positions ``skip`` and measure at ``measure``."""

    variant: str
    position: int | None  # t for the future-token variant
    part: str
    layer: int
    skip: slice
    measure: slice


def sample_positions(n_tokens: int, n_positions: int, seed: int, example: int) -> list[int]:
    """Up to ``n_positions`` of range(8, T-4, 8), shuffled deterministically for (seed, example)."""
    candidates = list(range(8, n_tokens - 4, 8))
    random.Random(seed * 1_000_003 + example).shuffle(candidates)
    return sorted(candidates[:n_positions])


def interventions_for(
    n_tokens: int, n_layers: int, positions: Sequence[int], parts: Sequence[str], variants: Sequence[str]
) -> list[Intervention]:
    out = []
    for part in parts:
        if "future" in variants:
            for t in positions:
                out += [Intervention("future", t, part, s, slice(1, t), slice(t, n_tokens)) for s in range(n_layers)]
        if "current" in variants:
            out += [
                Intervention("current", None, part, s, slice(1, n_tokens), slice(0, n_tokens)) for s in range(n_layers)
            ]
    return out


def skip_hooks(loaded: LoadedModel, part: str, layer: int, rows: torch.Tensor, positions: slice) -> list[Hook]:
    """Hooks (for ``intervene``) that skip layer ``layer`` (or its attention / MLP contribution)
    for batch rows ``rows`` (bool ``[batch]``) at ``positions``: a skipped layer's output is its
    input; a skipped sublayer adds nothing to the residual."""
    if part != "layer":
        attn, mlp = loaded.write_modules(layer)  # each group's every write (Adapter.attn_also, mlp_also)
        arg = loaded.adapter.residual_arg  # a sublayer that returns the residual with its write keeps the residual

        def skipped(out: torch.Tensor, arguments: dict) -> torch.Tensor:
            kept = arguments.get(arg) if arg is not None else None
            kept = kept if isinstance(kept, torch.Tensor) else torch.zeros(())
            if out.dim() == 2:  # a write flattened over batch and tokens (OPT's MLP): skip in [batch, token, d]
                by_token = out.reshape(rows.numel(), -1, out.shape[-1])
                kept = kept.reshape(by_token.shape) if kept.dim() == 2 else kept
                return replace_positions(by_token, rows, positions, kept).reshape(out.shape)
            return replace_positions(out, rows, positions, kept)

        return [Hook(module, "output", skipped) for module in (attn if part == "attn" else mlp)]
    block, seen = loaded.layers[layer], {}
    return [
        Hook(block, "input", lambda h_in, _: seen.__setitem__("h_in", h_in)),
        Hook(block, "output", lambda out, _: replace_positions(out, rows, positions, seen["h_in"])),
    ]


def _relative_change(clean: torch.Tensor, changed: torch.Tensor) -> torch.Tensor:
    """max over tokens of |clean − changed| / |clean| for ``[rows, token, d]`` → ``[rows]``."""
    clean, changed = clean.float(), changed.float()
    return ((clean - changed).norm(dim=-1) / clean.norm(dim=-1).clamp_min(1e-12)).amax(dim=-1)


Prefixes = dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]  # (skipped, layer) → keys, values


def _effects_fast(
    loaded: LoadedModel,
    run: CleanRun,
    group: list[Intervention],
    clean_probs: torch.Tensor | None,
    prefixes: Prefixes | None = None,
    record: int = 0,
    stop: int | None = None,
    buffer: torch.Tensor | None = None,
    metric: str = "l2",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Layer effects ``[rows, L]`` and output effects ``[rows]`` for interventions sharing part and
    positions, replayed from the lowest skipped layer with rows joining at their own layer.

    With ``prefixes``, the keys/values of positions < ``record`` at every layer above a row's
    skipped layer are stored there (the future-token variant's prefixes); ``stop`` replays
    positions < stop only, and ``clean_probs=None`` skips the output effects."""
    n_layers = loaded.n_layers
    part, measure = group[0].part, group[0].measure
    layers = torch.tensor([i.layer for i in group])
    effects = torch.zeros(len(group), n_layers, device=run.hidden[0].device)  # on the host once, at the end
    start = int(layers.min())
    stop = run.n_tokens if stop is None else stop
    active = 0  # rows are sorted by layer: rows [0, active) are running
    hidden = run.hidden[start][:, :0].new_empty(0, stop, run.hidden[0].shape[-1])
    with torch.inference_mode():
        for layer in range(start, n_layers):
            joining = int((layers == layer).sum())
            if joining:
                hidden = torch.cat([hidden, run.hidden[layer][:, :stop].expand(joining, -1, -1)])
                active += joining
            rows = torch.zeros(active, dtype=torch.bool)
            rows[active - joining : active] = True
            with intervene(skip_hooks(loaded, part, layer, rows, group[0].skip)):
                if run.reuses_prefixes:
                    out, (keys, values) = run_suffix_layer(loaded, run, layer, hidden, 0)
                else:
                    out = run_layer(loaded, run, layer, hidden)
            if prefixes is not None:
                for row in range(active - joining):  # rows whose skipped layer lies below this one
                    prefixes[int(layers[row]), layer] = (  # copies: the replay's [rows, kv, T, hd] can go
                        keys[row : row + 1, :, :record].clone(),
                        values[row : row + 1, :, :record].clone(),
                    )
            clean_delta = (run.hidden[layer + 1] - run.hidden[layer])[:, measure]
            effects[:active, layer] = _relative_change(clean_delta, (out - hidden)[:, measure])
            hidden = out
        outputs = (
            None
            if clean_probs is None
            else output_change(loaded, clean_probs, hidden[:, measure], buffer=buffer, metric=metric)
        )
    return effects.cpu(), None if outputs is None else outputs.cpu()


def _future_fast(
    loaded: LoadedModel,
    run: CleanRun,
    group: list[Intervention],
    clean_probs: torch.Tensor,
    prefixes: Prefixes,
    buffer: torch.Tensor | None = None,
    metric: str = "l2",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The future-token variant by prefix reuse. Skipping layer s at positions < t leaves layers
    ≤ s unchanged at positions ≥ t, and the skipped prefix at layers > s is the prefix of the
    all-token skip of s (``prefixes``, by causality). So each row starts at layer s + 1 from the
    clean h_{s+1}[t:] and replays positions t.. only, attending to those prefixes."""
    n_layers, t = loaded.n_layers, group[0].position
    skipped = [item.layer for item in group]  # sorted
    effects = torch.zeros(len(group), n_layers, device=run.hidden[0].device)  # on the host once, at the end
    hidden = run.hidden[0][:, :0].new_empty(0, run.n_tokens - t, run.hidden[0].shape[-1])  # [rows, token ≥ t, d]
    active = 0
    with torch.inference_mode():
        for layer in range(skipped[0] + 1, n_layers + 1):
            joining = skipped.count(layer - 1)
            if joining:
                hidden = torch.cat([hidden, run.hidden[layer][:, t:].expand(joining, -1, -1)])
                active += joining
            if layer == n_layers:
                break
            keys = torch.cat([prefixes[s, layer][0][:, :, :t] for s in skipped[:active]])
            values = torch.cat([prefixes[s, layer][1][:, :, :t] for s in skipped[:active]])
            out, _ = run_suffix_layer(loaded, run, layer, hidden, t, (keys, values))
            clean_delta = (run.hidden[layer + 1] - run.hidden[layer])[:, t:]
            effects[:active, layer] = _relative_change(clean_delta, out - hidden)
            hidden = out
        outputs = output_change(loaded, clean_probs, hidden, buffer=buffer, metric=metric)
    return effects.cpu(), outputs.cpu()


def _effects_slow(
    loaded: LoadedModel, run: CleanRun, intervention: Intervention, clean_probs: torch.Tensor, metric: str = "l2"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle: one full forward pass of the whole model with the intervention hooked in, its
    residuals recorded as ``clean_run`` records the clean ones."""
    rows = torch.ones(1, dtype=torch.bool)
    hooks = skip_hooks(loaded, intervention.part, intervention.layer, rows, intervention.skip)
    hidden, logits = recorded_forward(loaded, run.input_ids, hooks)
    measure = intervention.measure
    effects = torch.zeros(1, loaded.n_layers)
    for layer in range(loaded.n_layers):
        clean_delta = (run.hidden[layer + 1] - run.hidden[layer])[:, measure]
        effects[:, layer] = _relative_change(clean_delta, (hidden[layer + 1] - hidden[layer])[:, measure])
    return effects, change_of(clean_probs, logits[0, measure], metric).view(1).cpu()


Results = list[tuple[Intervention, torch.Tensor, torch.Tensor]]  # (intervention, layer effects [L], output effect)


def _clean_probs(loaded: LoadedModel, run: CleanRun, measure: slice, cache: dict) -> torch.Tensor:
    """The clean output distribution at ``measure`` (computed once per span)."""
    span = (measure.start, measure.stop)
    if span not in cache:
        with torch.inference_mode():
            cache[span] = torch.softmax(loaded.head(run.hidden[-1][0, measure]).float(), dim=-1)
        require_finite(cache[span], "the final distribution (final norm + LM head)", loaded.name)
    return cache[span]


def _groups(todo: list[Intervention]) -> dict[tuple, list[Intervention]]:
    """Interventions by (variant, position, part): each group shares its positions."""
    groups: dict[tuple, list[Intervention]] = {}
    for item in todo:
        groups.setdefault((item.variant, item.position, item.part), []).append(item)
    return groups


def _prompt_slow(loaded: LoadedModel, run: CleanRun, todo: list[Intervention], metric: str = "l2", **_) -> Results:
    """Every intervention of one prompt as its own full forward pass (the published loop)."""
    probs: dict = {}
    return [
        (
            item,
            *(x[0] for x in _effects_slow(loaded, run, item, _clean_probs(loaded, run, item.measure, probs), metric)),
        )
        for item in todo
    ]


def _prompt_fast(
    loaded: LoadedModel,
    run: CleanRun,
    todo: list[Intervention],
    parts: Sequence[str],
    positions: list[int],
    max_rows: int,
    metric: str = "l2",
) -> Results:
    """Every intervention of one prompt as batch rows replayed from the skipped layer on. The
    future-token skips of a part start at layer s+1 from the clean h_{s+1} and replay positions ≥ t
    only, attending to the keys/values that the all-token skip of s recorded for the prefix, so per
    part the all-token skips run first (or, with the future variant alone, a record-only pass)."""
    groups = _groups(todo)
    reuse = run.reuses_prefixes and bool(positions) and any(k[0] == "future" for k in groups)
    prefixes: Prefixes = {}
    prefixes_of = None  # the part whose all-token skips filled ``prefixes``
    buffer, probs = head_buffer(loaded), {}
    done: dict[tuple, Results] = {}
    for key in sorted(groups, key=lambda k: (parts.index(k[2]), k[0] == "future")):
        group, (variant, _, part) = groups[key], key
        clean_probs = _clean_probs(loaded, run, group[0].measure, probs)
        done[key] = []
        if variant == "current" or not reuse:
            if reuse:
                prefixes.clear()
                prefixes_of = part
            for chunk in _chunks(group, max_rows):
                record = positions[-1] if reuse else 0
                effects, outputs = _effects_fast(
                    loaded, run, chunk, clean_probs, prefixes if reuse else None, record, buffer=buffer, metric=metric
                )
                done[key] += [(item, effects[r], outputs[r]) for r, item in enumerate(chunk)]
            continue
        if prefixes_of != part:  # the future variant alone: record the all-token skips' prefixes first
            prefixes.clear()
            prefixes_of = part
            cut = positions[-1]
            record_only = [
                Intervention("current", None, part, s, slice(1, cut), slice(0, cut)) for s in range(len(loaded.layers))
            ]
            for chunk in _chunks(record_only, max_rows):
                _effects_fast(loaded, run, chunk, None, prefixes, record=cut, stop=cut)
        for chunk in _chunks(group, max_rows):
            effects, outputs = _future_fast(loaded, run, chunk, clean_probs, prefixes, buffer, metric)
            done[key] += [(item, effects[r], outputs[r]) for r, item in enumerate(chunk)]
    return [entry for key in groups for entry in done[key]]  # in the order of the frame


def _check_lengths(token_lists: list[torch.Tensor], variants: Sequence[str]) -> None:
    shortest = MIN_TOKENS["future" if "future" in variants else "current"]
    for index, ids in enumerate(token_lists):
        if ids.numel() < shortest:
            raise EffdepthError(
                f"prompt {index} has {ids.numel()} tokens; the skip probe's "
                + (
                    f"future-token variant needs at least {shortest} (cut positions 8, 16, … up to T−5); "
                    f"use longer prompts or {spelled('skip_variants', 'current')}"
                    if shortest == MIN_TOKENS["future"]
                    else f"all-token variant needs at least {shortest}"
                )
            )


@takes_plain_models()
def skip_effects(
    loaded: LoadedModel,
    prompts: Sequence[str | torch.Tensor],
    skip_positions: int = 4,
    skip_parts: str | Sequence[str] = SKIP_PARTS,
    skip_variants: str | Sequence[str] = VARIANTS,
    seed: int = 0,
    method: str = "fast",
    max_rows: int = 16,
    progress: bool | None = None,
    first_example: int = 0,
    output_metric: str = "l2",
) -> pl.DataFrame:
    """Per prompt and intervention: effect of skipping a layer on every layer's contribution and on
    the output distribution. Prompt i is example ``first_example + i`` (positions are sampled per
    (seed, example), so a run extended by more prompts samples the first ones as before).

    Long frame: ``example, variant, position, part, skipped_layer, layer, metric, value`` with
    metric ``layer_effect`` (``layer`` = the layer measured) or, with ``layer`` null, the change at
    the output: ``output_effect`` (max over tokens of ‖y − ȳ‖₂, the paper's; ``output_metric="l2"``)
    or ``output_kl`` (max over tokens of KL(ȳ ‖ y) in nats; ``output_metric="kl"``).
    Reduce with ``skip_summary`` (max over positions and prompts, as method.md §3).

    Args:
        loaded: a ``LoadedModel`` (``load_model``/``wrap_model``) or a transformers causal LM.
        prompts: texts, or token-id tensors ``[token]``, one per example.
        skip_positions: positions t sampled per prompt for the future-token variant.
        skip_parts: what is skipped: ``layer``, ``attn``, ``mlp``.
        skip_variants: ``future`` (positions < t skipped, ≥ t measured), ``current`` (every position).
        seed: the positions' sampling seed.
        method: ``"fast"`` (batched interventions) or ``"slow"`` (one per pass, the oracle).
        max_rows: interventions per forward pass of the fast path.
        progress: show progress bars (None: when attached to a terminal or notebook).
        first_example: the example index of the first prompt, as above.
        output_metric: ``"l2"`` or ``"kl"``.
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        The long frame above.
    """
    if method not in ("fast", "slow"):
        raise OptionError(f"method must be 'fast' or 'slow', got {method!r}")
    SKIP_POSITIONS.check(skip_positions)
    require_whole("max_rows", max_rows)
    n_positions, parts, variants = skip_positions, _names(skip_parts), _names(skip_variants)
    check_skip_options(parts, variants)
    check_output_metric(output_metric)
    token_lists = tokenize(loaded, prompts)
    _check_lengths(token_lists, variants)
    prompt_effects = _prompt_fast if method == "fast" else _prompt_slow
    plans = []
    for example, ids in enumerate(token_lists, start=first_example):
        positions = sample_positions(ids.numel(), n_positions, seed, example)
        plans.append(
            (example, ids, positions, interventions_for(ids.numel(), loaded.n_layers, positions, parts, variants))
        )
    short = [(example, len(positions)) for example, _, positions, _ in plans if len(positions) < n_positions]
    if short and "future" in variants:
        listed = ", ".join(f"prompt {example}: {used}" for example, used in short[:5])
        more = f" and {len(short) - 5} more" if len(short) > 5 else ""
        warnings.warn(
            f"{len(short)} prompt(s) have room for fewer than the {n_positions} skip positions asked (cut "
            f"positions are every 8th token up to T−5), so fewer were measured ({listed}{more}); the frame and "
            "the run's summary (skip_positions_used) hold the positions measured",
            EffdepthWarning,
            stacklevel=2,
        )
    frames = []
    with progress_bar(
        total=sum(len(p[3]) for p in plans),
        desc=f"skip ({method})",
        unit="intervention",
        disable=not show_progress(progress),
    ) as bar:
        for example, ids, positions, todo in plans:
            run = clean_run(loaded, ids)
            results = prompt_effects(
                loaded, run, todo, parts=parts, positions=positions, max_rows=max_rows, metric=output_metric
            )
            for item, effects, output in results:
                where = f"skipping {item.part} of layer {item.layer} ({item.variant} tokens) in prompt {example}"
                require_finite(torch.cat([effects, output.view(1)]), f"the effect of {where}", loaded.name)
            frames.append(_frame(example, results, loaded.n_layers, OUTPUT_NAMES[output_metric]))
            bar.update(len(todo))
    return pl.concat(frames)


def _frame(example: int, results, n_layers: int, output_name: str = "output_effect") -> pl.DataFrame:
    columns: dict[str, list] = {
        k: [] for k in ("variant", "position", "part", "skipped_layer", "layer", "metric", "value")
    }
    for item, effects, output in results:
        entries = [(layer, "layer_effect", value) for layer, value in enumerate(effects.tolist())]
        entries.append((None, output_name, float(output)))
        for layer, metric, value in entries:
            row = (item.variant, item.position, item.part, item.layer, layer, metric, value)
            for key, v in zip(columns, row, strict=True):
                columns[key].append(v)
    schema = {
        "variant": pl.String,
        "position": pl.Int64,
        "part": pl.String,
        "skipped_layer": pl.Int64,
        "layer": pl.Int64,
        "metric": pl.String,
        "value": pl.Float64,
    }
    return (
        pl.DataFrame(columns, schema=schema)
        .with_columns(pl.lit(example, dtype=pl.Int64).alias("example"))
        .select("example", *schema)
    )


def skip_summary(frame: pl.DataFrame) -> pl.DataFrame:
    """Max (the paper's statistic), mean and std over positions and prompts per
    (variant, part, skipped_layer, layer, metric)."""
    keys = ["variant", "part", "skipped_layer", "layer", "metric"]
    # sorted before the sums: a group's rows in one order, so identical runs write identical bytes
    per_example = frame.group_by([*keys, "example"]).agg(pl.col("value").max())
    per_example = per_example.sort([*keys, "example"], nulls_last=True)
    return (
        per_example.group_by(keys)
        .agg(
            pl.col("value").max().alias("value"),
            pl.col("value").mean().alias("mean"),
            pl.col("value").std().alias("std"),
        )
        .sort(keys, nulls_last=True)
    )


def _chunks(items: list, size: int):
    return (items[start : start + size] for start in range(0, len(items), size))


# --- the probe -------------------------------------------------------------------------------


def _unknown(kind: str, known: tuple[str, ...]):
    def check(value: str) -> str | None:
        try:
            check_skip_options(*((_names(value), VARIANTS) if kind == "part" else (SKIP_PARTS, _names(value))))
        except EffdepthError as exc:
            return f"names {exc}"
        return None

    return check


SKIP_POSITIONS = Option(
    "skip_positions",
    4,
    "future-token positions per prompt (skip)",
    type=int,
    minimum=1,
    maximum=MAX_CONTEXT // 8,  # cut positions are every 8th token of a prompt (sample_positions)
    key=KEY_ALWAYS,
)
SKIP_PARTS_OPTION = Option(
    "skip_parts",
    "layer,attn,mlp",
    "what to skip: layer, attn, mlp (comma list)",
    key=KEY_ALWAYS,
    check_value=_unknown("part", SKIP_PARTS),
)
SKIP_VARIANTS = Option(
    "skip_variants",
    "future,current",
    "future (tokens after a cut), current (all tokens)",
    check_value=_unknown("variant", VARIANTS),
)


def _names(given: str | Sequence[str]) -> list[str]:
    """``"layer,attn"`` (a setting's text) or ``["layer", "attn"]`` (Python) as a list of names."""
    items = str(given).split(",") if isinstance(given, str) else [str(x) for x in given]
    return [x.strip() for x in items if x.strip()]


def group_label(example) -> str:
    """Difficulty group of an example for the depth score: MATH level, operand digits, or task."""
    meta = getattr(example, "meta", {}) or {}
    if "level" in meta:
        return f"level {meta['level']}"
    if "digits" in meta:
        return f"{meta['digits']} digits"
    return str(meta.get("task", "all"))


def _depth_score(skip: pl.DataFrame, examples: Sequence) -> pl.DataFrame | None:
    """The depth score needs the future-token, whole-layer skips (None when they were not run)."""
    if skip.filter(variant="future", part="layer", metric="output_effect").is_empty():
        return None
    return depth_scores(skip, {i: group_label(e) for i, e in enumerate(examples)})


def _compute(loaded: LoadedModel, examples: Sequence, context: Context) -> pl.DataFrame:
    settings = context.settings
    frame = skip_effects(
        loaded,
        prompts_of(examples),
        skip_positions=settings.skip_positions,
        skip_parts=_names(settings.skip_parts),
        skip_variants=_names(settings.skip_variants),
        seed=settings.seed,
        method=settings.method,
        progress=context.progress,
        first_example=context.first_example,
        output_metric=settings.output_metric,
    )
    return frame.with_columns(pl.col("example") - context.first_example)  # the run numbers its examples


def positions_used(skip: pl.DataFrame | None) -> dict | None:
    """The future-token cut positions measured per prompt (fewest, most), which a short prompt keeps
    below ``skip_positions``; None without the future variant."""
    if skip is None or not {"variant", "example", "position"} <= set(skip.columns):
        return None
    future = skip.filter(variant="future")
    if future.is_empty():
        return None
    counts = future.group_by("example").agg(pl.col("position").n_unique())["position"]
    return {"fewest": int(counts.min()), "most": int(counts.max())}


def _summarize(frames) -> dict:
    summary = {}
    used = positions_used(frames.get("skip_by_example"))
    if used is not None:
        summary["skip_positions_used"] = used
    scores = frames.get("depth_score")
    if scores is None:
        return summary
    rows = scores.filter(pl.col("example").is_null(), metric="depth_score")
    return {**summary, "depth_score": {row["group"]: row["value"] for row in rows.iter_rows(named=True)}}


def _cell(summary, frames) -> str:
    scores = summary.get("depth_score") or {}
    if scores:
        return ", ".join(f"{g}: {v:.1f}" if v is not None else f"{g}: —" for g, v in scores.items())
    saved = frames.get("skip")
    if saved is None or saved.is_empty():
        return "—"
    output = saved.filter(pl.col("metric").is_in(list(OUTPUT_NAMES.values())))
    top = output.sort("value", descending=True).row(0, named=True)
    unit = " nats" if top["metric"] == OUTPUT_NAMES["kl"] else ""
    what = {"layer": "layer", "attn": "the attention of layer", "mlp": "the MLP of layer"}[top["part"]]
    # under the column "depth score", which needs the future variant: say so, then what was measured
    return (
        f"none (the future variant was not run); largest output effect {top['value']:.2f}{unit} "
        f"(skipping {what} {top['skipped_layer']})"
    )


def _variant(frame: pl.DataFrame) -> dict:
    variants = set(frame["variant"].unique().to_list()) if "variant" in frame.columns else set()
    return {"variant": "future" if "future" in variants or not variants else sorted(variants)[0]}


def _work(shape: Shape, settings, lengths) -> float:
    parts, variants = len(_names(settings.skip_parts)), _names(settings.skip_variants)
    # current: every layer's skip replayed from it (~half a pass); future: per position, from it on
    per_layer = 0.5 * ("current" in variants) + 0.25 * settings.skip_positions * ("future" in variants)
    return shape.forward * (1 + shape.n_layers * parts * per_layer) * sum(lengths)


SPEC = ProbeSpec(
    name="skip",
    title="layer skipping",
    compute=_compute,
    options=(SKIP_POSITIONS, SKIP_PARTS_OPTION, SKIP_VARIANTS, OUTPUT_METRIC_OPTION),
    aggregate=skip_summary,
    derived={"depth_score": _depth_score},
    summarize=_summarize,
    cell=_cell,
    cell_label="depth score",
    charts=(
        Chart("skip", "skip_heatmap", "skip", _variant),
        Chart("skip-output", "output_effect_bars", "skip", _variant),
    ),
    unit="intervention",
    reusable=True,
    description="the effect of skipping a layer, its attention or MLP on later layers and the output (§3) and "
    "the depth score (§6)",
    work=_work,  # its operations, for the grid's cost model
)
