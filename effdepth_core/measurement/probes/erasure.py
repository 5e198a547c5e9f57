"""Residual erasure (method.md §4, Csordás Fig. 4b): replace one position's residual at one depth by the
dataset mean and record the largest change in the distributions that predict the answer tokens.

- ``method="slow"``: one full forward pass per (layer, position), as the published loop;
- ``method="fast"``: per position t, the erasures at every layer as batch rows replayed from their
  layer on over positions t.. only (prefix reuse: the clean run's keys/values serve positions < t);
  tokens after the last answer-predicting one are dropped by causality.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import torch

from ...errors import OptionError, require_whole
from ...terminal import progress_bar
from ..replay import CleanRun, clean_run, run_layers, run_suffix_layer
from ..trace import (
    Hook,
    LayerTrace,
    forward,
    intervene,
    iter_batches,
    replace_positions,
    require_finite,
    show_progress,
    tokenize,
    trace_layers,
)
from ..wrapping import LoadedModel, takes_plain_models
from .shared.answers import AnswerInput, AnswerSplit, answer_splits
from .shared.output_change import OUTPUT_METRIC_OPTION, change_of, check_output_metric, head_buffer, output_change
from .spec import Chart, Context, ProbeSpec, Shape

OUTPUT_NAMES = {"l2": "erasure_effect", "kl": "erasure_kl"}  # the frame's metric per output_metric


@takes_plain_models()
def residual_means(loaded: LoadedModel, prompts: Sequence[str | torch.Tensor], batch_size: int = 4) -> torch.Tensor:
    """Mean of h_l over every token of ``prompts`` for l = 0..L, ``[L+1, d_model]`` float32."""
    token_lists = tokenize(loaded, prompts)
    sums = torch.zeros(loaded.n_layers + 1, loaded.d_model, dtype=torch.float64)
    count = sum(ids.numel() for ids in token_lists)
    for batch in iter_batches(token_lists, loaded.rows(batch_size, token_lists), loaded.input_device):
        mask = batch.mask

        def on_layer(trace: LayerTrace, mask: torch.Tensor = mask) -> None:
            sums[trace.layer] += trace.h_in[mask].double().sum(0).cpu()
            if trace.layer == loaded.n_layers - 1:
                sums[-1] += trace.h_out[mask].double().sum(0).cpu()

        with trace_layers(loaded, on_layer, sublayers=False):
            forward(loaded, batch)
    return (sums / count).float()


def _no_step(done: int) -> None:
    pass


def _map_fast(
    loaded: LoadedModel, split: AnswerSplit, baselines: torch.Tensor, max_rows: int, step=_no_step, metric: str = "l2"
) -> torch.Tensor:
    """The ``[layer 0..L, position]`` map by prefix reuse: erasing h_l[t] leaves positions < t
    unchanged at every layer, so per position t the erasures at every layer l are batch rows that
    join at their layer and replay positions t..last only, against the clean run's cached keys and
    values of positions < t. Positions after the last one that predicts an answer token are never
    run; erasing there changes nothing measured (0)."""
    last = split.measured.stop - 1  # the last position whose distribution is measured
    run = clean_run(loaded, split.ids)  # the whole prompt, as the oracle runs it (and checked so)
    if not run.reuses_prefixes:
        return _map_rows(loaded, split, baselines, max_rows, run, step, metric)
    measure, n_layers = split.measured, loaded.n_layers
    effects = torch.zeros(n_layers + 1, split.n_tokens, device=loaded.head_device)  # [layer 0..L, position]
    buffer = head_buffer(loaded)
    with torch.inference_mode():
        clean_probs = torch.softmax(loaded.head(run.hidden[-1][0, measure]).float(), dim=-1)
        require_finite(clean_probs, "the final distribution (final norm + LM head)", loaded.name)
        for t in range(last + 1):
            first = max(measure.start, t)  # measured positions t.. (those before t cannot change)
            for low in range(0, n_layers + 1, max_rows):
                high = min(low + max_rows, n_layers + 1)  # erased layers [low, high) as rows
                hidden = run.hidden[low][:, :0].new_empty(0, last + 1 - t, loaded.d_model)  # [rows, token ≥ t, d]
                for layer in range(low, n_layers + 1):
                    if layer < high:  # the row erasing at this layer joins
                        erased = run.hidden[layer][:, t : last + 1].clone()
                        erased[:, 0] = baselines[layer].to(erased.device, erased.dtype)
                        hidden = torch.cat([hidden, erased])
                    if layer < n_layers:
                        hidden, _ = run_suffix_layer(loaded, run, layer, hidden, t)
                changed = output_change(
                    loaded, clean_probs[first - measure.start :], hidden[:, first - t :], buffer=buffer, metric=metric
                )
                effects[low:high, t] = changed
                step(high - low)
    return effects.cpu()  # one host copy per prompt


def _map_rows(
    loaded: LoadedModel,
    split: AnswerSplit,
    baselines: torch.Tensor,
    max_rows: int,
    run: CleanRun,
    step=_no_step,
    metric: str = "l2",
) -> torch.Tensor:
    """Without cached keys/values (an attention kernel that takes no mask): per layer, all
    positions as batch rows replayed from that layer on over the whole prompt."""
    measure = split.measured
    effects = torch.zeros(loaded.n_layers + 1, split.n_tokens, device=loaded.head_device)  # [layer 0..L, position]
    buffer = head_buffer(loaded)
    with torch.inference_mode():
        clean_probs = torch.softmax(loaded.head(run.hidden[-1][0, measure]).float(), dim=-1)
        require_finite(clean_probs, "the final distribution (final norm + LM head)", loaded.name)
        for layer in range(loaded.n_layers + 1):
            base = baselines[layer].to(run.hidden[layer].device, run.hidden[layer].dtype)
            for start in range(0, measure.stop, max_rows):
                positions = torch.arange(start, min(start + max_rows, measure.stop))
                hidden = run.hidden[layer].expand(len(positions), -1, -1).clone()  # [rows, token, d]
                hidden[torch.arange(len(positions)), positions] = base
                final = run_layers(loaded, run, layer, hidden)
                effects[layer, positions.to(effects.device)] = output_change(
                    loaded, clean_probs, final[:, measure], buffer=buffer, metric=metric
                )
                step(len(positions))
    return effects.cpu()


def _map_slow(
    loaded: LoadedModel, split: AnswerSplit, baselines: torch.Tensor, step=_no_step, metric: str = "l2"
) -> torch.Tensor:
    """The oracle: one full forward pass per (layer, position), the residual replaced through a hook
    on the input of layer l (l < L) or the output of the last layer (l = L)."""
    measure = split.measured
    input_ids = split.ids.view(1, -1).to(loaded.input_device)
    with torch.inference_mode():
        clean_probs = torch.softmax(
            loaded.model(input_ids=input_ids, use_cache=False).logits[0, measure].float(), dim=-1
        )
    effects = torch.zeros(loaded.n_layers + 1, split.n_tokens)
    row = torch.ones(1, dtype=torch.bool)
    for layer in range(loaded.n_layers + 1):
        module, where = (loaded.layers[layer], "input") if layer < loaded.n_layers else (loaded.layers[-1], "output")
        for position in range(split.n_tokens):
            site = slice(position, position + 1)
            hook = Hook(
                module, where, lambda h, _, site=site, layer=layer: replace_positions(h, row, site, baselines[layer])
            )
            with intervene([hook]), torch.inference_mode():
                logits = loaded.model(input_ids=input_ids, use_cache=False).logits[0, measure]
            effects[layer, position] = change_of(clean_probs, logits, metric).cpu()
            step(1)
    return effects


@takes_plain_models()
def erasure_map(
    loaded: LoadedModel,
    examples: Sequence[AnswerInput],
    baselines: torch.Tensor | None = None,
    method: str = "fast",
    max_rows: int = 32,
    progress: bool | None = None,
    output_metric: str = "l2",
) -> pl.DataFrame:
    """The (L+1)×T map per example: for erasing h_l[t] (l = 0 is the embedding, l = L the final
    residual), the largest ‖y − ȳ‖₂ (metric ``erasure_effect``, ``output_metric="l2"``, the paper's)
    or KL(ȳ ‖ y) in nats (``erasure_kl``, ``output_metric="kl"``) over the positions that predict the
    answer tokens.

    ``baselines`` ``[L+1, d_model]`` default to ``residual_means`` over the examples themselves.
    Long frame: ``example, layer, position, token, is_answer, metric, value``.

    Args:
        loaded: a ``LoadedModel`` (``load_model``/``wrap_model``) or a transformers causal LM.
        examples: ``Example``s with an answer (or (prompt, answer) pairs).
        baselines: what an erased state is replaced by, ``[L+1, d_model]``.
        method: ``"fast"`` (batched) or ``"slow"`` (one erasure per pass, the oracle).
        max_rows: erased copies per forward pass of the fast path.
        progress: show progress bars (None: when attached to a terminal or notebook).
        output_metric: ``"l2"`` or ``"kl"``.
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        The long frame above.
    """
    if method not in ("fast", "slow"):
        raise OptionError(f"method must be 'fast' or 'slow', got {method!r}")
    check_output_metric(output_metric)
    require_whole("max_rows", max_rows)
    splits = answer_splits(loaded, examples)
    if baselines is None:
        baselines = residual_means(loaded, [split.ids for split in splits])
    require_finite(baselines, "the mean residuals (erasure baselines)", loaded.name)
    if tuple(baselines.shape) != (loaded.n_layers + 1, loaded.d_model):
        raise OptionError(f"baselines must be [{loaded.n_layers + 1}, {loaded.d_model}], got {tuple(baselines.shape)}")
    frames = []
    sites = [(loaded.n_layers + 1) * (s.measured.stop if method == "fast" else s.n_tokens) for s in splits]
    shown = show_progress(progress)
    with progress_bar(total=sum(sites), desc=f"erasure ({method})", unit="intervention", disable=not shown) as bar:
        for example, split in enumerate(splits):
            effects = (
                _map_fast(loaded, split, baselines, max_rows, bar.update, output_metric)
                if method == "fast"
                else _map_slow(loaded, split, baselines, bar.update, output_metric)
            )
            for layer in range(effects.shape[0]):
                where = f"the effect of erasing layer {layer}'s residual (prompt {example})"
                require_finite(effects[layer], where, loaded.name)
            frames.append(_frame(loaded, example, split, effects, OUTPUT_NAMES[output_metric]))
    return pl.concat(frames)


def _frame(
    loaded: LoadedModel, example: int, split: AnswerSplit, effects: torch.Tensor, name: str = "erasure_effect"
) -> pl.DataFrame:
    n_layers_plus, n_tokens = effects.shape
    ids = split.ids
    tokens = [loaded.tokenizer.decode([i]) if loaded.tokenizer is not None else str(i) for i in ids.tolist()]
    layer = torch.arange(n_layers_plus).repeat_interleave(n_tokens)
    position = torch.arange(n_tokens).repeat(n_layers_plus)
    return pl.DataFrame(
        {
            "example": [example] * (n_layers_plus * n_tokens),
            "layer": layer.numpy(),
            "position": position.numpy(),
            "token": [tokens[p] for p in position.tolist()],
            "is_answer": split.is_answer[position].numpy(),
            "metric": [name] * (n_layers_plus * n_tokens),
            "value": effects.reshape(-1).double().numpy(),
        },
        schema={
            "example": pl.Int64,
            "layer": pl.Int64,
            "position": pl.Int64,
            "token": pl.String,
            "is_answer": pl.Boolean,
            "metric": pl.String,
            "value": pl.Float64,
        },
    )


def _compute(loaded: LoadedModel, examples: Sequence, context: Context) -> pl.DataFrame:
    settings = context.settings
    return erasure_map(
        loaded, examples, method=settings.method, progress=context.progress, output_metric=settings.output_metric
    )


def _cell(summary, frames) -> str:
    saved = frames.get("erasure")
    if saved is None or saved.is_empty():
        return "—"
    kl = "metric" in saved.columns and saved.filter(pl.col("metric") == OUTPUT_NAMES["kl"]).height > 0
    by_layer = saved.group_by("layer").agg(pl.col("value").max()).sort("value", descending=True)
    top = by_layer.row(0, named=True)
    measured = f"KL {top['value']:.2f} nats" if kl else f"‖Δy‖₂ {top['value']:.2f}"
    return f"largest effect {measured} (erasing at layer {top['layer']})"


def _work(shape: Shape, settings, lengths) -> float:
    # per position t, every layer's erasure replayed from its layer over positions t..: ~ T²/2 × L/2 rows
    return shape.forward * shape.n_layers / 4 * sum(t * t for t in lengths)


SPEC = ProbeSpec(
    name="erasure",
    title="residual erasure",
    compute=_compute,
    options=(OUTPUT_METRIC_OPTION,),
    cell=_cell,
    charts=(Chart("erasure", "erasure_heatmap", "erasure_by_example"),),
    unit="intervention",
    needs_answers=True,
    description="the (L+1)×T map of how erasing one residual (the data set's mean) changes the answer (§4)",
    work=_work,  # its operations, for the grid's cost model
)
