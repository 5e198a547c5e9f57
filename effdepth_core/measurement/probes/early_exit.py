"""What effective depth buys, part 2 — early exit (method.md §7b): decode each layer's residual
with the logit lens (or a tuned lens) as if the model stopped there. Per layer l = 0..L (l layers
run; l = L is the model itself): the share of tokens whose top-1 equals the final top-1
(``agreement``), and the answer tokens' mean NLL and top-1 accuracy when exiting at l."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import torch

from ...errors import require_whole
from ...terminal import progress_bar
from ..replay import clean_run
from ..trace import require_finite, show_progress
from ..wrapping import LoadedModel, takes_plain_models
from .shared.answers import AnswerInput, answer_splits
from .shared.lens import LENS, Translator
from .shared.reduce import token_weighted_mean
from .spec import Context, ProbeSpec, Shape
from .tuned_lens import LENS_STEPS, LENS_TOKENS, check_lens_cache, lens_identity, run_tuned_lens


@takes_plain_models()
def early_exit(
    loaded: LoadedModel,
    examples: Sequence[AnswerInput],
    lens: Translator | None = None,
    chunk: int = 128,
    progress: bool | None = None,
) -> pl.DataFrame:
    """Per example and exit layer: ``example, layer, metric, value, n_tokens`` (``n_tokens``: the
    tokens the value averages: all of the prompt's for ``agreement``, the answer's otherwise).

    Args:
        loaded: a ``LoadedModel`` (``load_model``/``wrap_model``) or a transformers causal LM.
        examples: ``Example``s with an answer (or (prompt, answer) pairs).
        lens: a tuned lens of this model to exit through (None: the logit lens).
        chunk: tokens decoded per matrix product.
        progress: show progress bars (None: when attached to a terminal or notebook).
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        The long frame above (metrics ``agreement``, ``answer_nll``, ``answer_accuracy``).

    Every decode multiplies the head in the weights' dtype (float32 for a float32 model): the logit
    lens's ``head_dtype`` does not apply here.
    """
    require_whole("chunk", chunk)
    rows = []
    for example, split in enumerate(
        progress_bar(answer_splits(loaded, examples), desc="early exit", disable=not show_progress(progress))
    ):
        run = clean_run(loaded, split.without_last())
        targets = split.targets.to(loaded.head_device)
        measured = torch.zeros(run.n_tokens, dtype=torch.bool)
        measured[split.measured] = True
        with torch.inference_mode():
            final_top = torch.cat(
                [loaded.head(run.hidden[-1][0, s : s + chunk]).argmax(-1) for s in range(0, run.n_tokens, chunk)]
            )
            for layer in range(loaded.n_layers + 1):
                hidden = run.hidden[layer][0]  # [token, d_model]
                if lens is not None:
                    hidden = lens.translate(layer, hidden)
                agree = torch.zeros((), dtype=torch.float64)
                nll, correct = [], []
                for s in range(0, run.n_tokens, chunk):
                    logits = loaded.head(hidden[s : s + chunk]).float()  # [rows, vocab]
                    what = (
                        "early-exit decode (final norm + LM head)" if lens is None else "early-exit tuned-lens decode"
                    )
                    require_finite(logits, f"the {what} of layer {layer}'s input", loaded.name)
                    top = logits.argmax(-1)
                    agree += (top == final_top[s : s + chunk]).sum()
                    rows_measured = measured[s : s + chunk].to(logits.device)
                    if rows_measured.any():
                        logp = torch.log_softmax(logits[rows_measured], dim=-1)
                        first = s + int(rows_measured.nonzero()[0]) - split.measured.start
                        wanted = targets[first : first + logp.shape[0]]
                        nll.append(-logp.gather(-1, wanted[:, None]).squeeze(-1))
                        correct.append((top[rows_measured] == wanted).float())
                rows.append((example, layer, "agreement", float(agree) / run.n_tokens, run.n_tokens))
                rows.append((example, layer, "answer_nll", float(torch.cat(nll).mean()), split.n_answer))
                rows.append((example, layer, "answer_accuracy", float(torch.cat(correct).mean()), split.n_answer))
    schema = {"example": pl.Int64, "layer": pl.Int64, "metric": pl.String, "value": pl.Float64, "n_tokens": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def early_exit_summary(per_example: pl.DataFrame) -> pl.DataFrame:
    """Token-weighted means over prompts per (lens, layer, metric) — ``lens`` where the frame has it."""
    return token_weighted_mean(per_example, [c for c in ("lens", "layer", "metric") if c in per_example.columns])


def _lenses(settings) -> list[str]:
    return [name for name in ("logit", "tuned") if settings.lens in (name, "both")]


def _compute(loaded: LoadedModel, examples: Sequence, context: Context) -> pl.DataFrame:
    frames = []
    for lens_name in _lenses(context.settings):
        lens = run_tuned_lens(loaded, context) if lens_name == "tuned" else None
        frame = early_exit(loaded, examples, lens=lens, progress=context.progress)
        frames.append(frame.with_columns(lens=pl.lit(lens_name)))
    return pl.concat(frames)


def _identity(loaded: LoadedModel, context: Context) -> dict:
    return lens_identity(loaded, context) if "tuned" in _lenses(context.settings) else {}


def _cell(summary, frames) -> str:
    saved = frames.get("early_exit")
    if saved is None or saved.is_empty():
        return "—"
    agree = saved.filter(metric="agreement").sort("layer")
    first = agree.filter(pl.col("value") >= 0.5)
    lens = agree["lens"][0] if "lens" in agree.columns else "logit"
    where = f"top-1 agrees on half the tokens from layer {first['layer'][0]}" if first.height else "never agrees"
    return f"{where} ({lens} lens)"


def _work(shape: Shape, settings, lengths) -> float:
    lenses = 2 if settings.lens == "both" else 1
    return lenses * (shape.forward + shape.n_layers * shape.unembed) * sum(lengths)


SPEC = ProbeSpec(
    name="early_exit",
    title="early exit",
    compute=_compute,
    options=(LENS, LENS_STEPS, LENS_TOKENS),
    aggregate=early_exit_summary,
    cell=_cell,
    needs_answers=True,
    reusable=True,
    identity=_identity,
    check=lambda settings, facts: check_lens_cache(settings) if settings.lens in ("tuned", "both") else None,
    description="decode every layer as if the model stopped there: agreement, answer NLL and accuracy (§7b)",
    work=_work,  # its operations, for the grid's cost model
)
