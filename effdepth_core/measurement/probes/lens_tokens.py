"""The lens token by token, for reading one prompt in a notebook: at every position and layer the
KL to the model's output, the top-k overlap, and the top-k tokens the lens decodes (as text). The
logit-lens probe averages exactly these per-token numbers over each prompt's tokens (a test holds
them equal); this function keeps them apart and names the tokens, as TransformerLens's
``logit_lens(…, top_k=…)`` and tuned-lens's ``PredictionTrajectory`` do. Not a registered probe: it
returns per-token rows, which no ED rule reads.
"""

from __future__ import annotations

import polars as pl
import torch

from ...errors import EffdepthError
from ...topk import largest
from ..trace import residual_states, tokenize
from ..wrapping import LoadedModel, takes_plain_models
from .shared.lens import Translator, _check_top_k, check_lens

TOKEN_CHUNK = 256  # positions decoded at once: [chunk, vocab] float32 is the only vocabulary-sized buffer


@takes_plain_models()
def lens_by_token(
    loaded: LoadedModel, prompt: str | torch.Tensor, top_k: int = 5, lens: Translator | None = None
) -> pl.DataFrame:
    """The lens of one prompt at every position and layer 0..L (layer L decodes the output).

    Args:
        loaded: the model (``load_model`` or ``wrap_model``).
        prompt: a text (encoded by the model's tokenizer) or a 1-D tensor of token ids.
        top_k: how many of the lens's most likely tokens to keep, and the overlap's k.
        lens: a tuned lens of this model (``cached_tuned_lens``); None decodes with the final norm
            and head alone (the logit lens).
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        One row per position and layer: ``position, token`` (the input token there, as text),
        ``layer, kl`` (KL(q_l || p) in nats), ``overlap`` (the share of q_l's top-k in p's top-k),
        ``top_tokens`` and ``top_probs`` (q_l's top-k, most likely first).
    """
    _check_top_k(top_k, loaded.vocab_size, loaded.name)
    check_lens(lens)
    _check_one_prompt(prompt)
    ids = tokenize(loaded, [prompt])[0]  # [token]
    states = torch.cat(list(residual_states(loaded, [ids], batch_size=1)))  # [token, L+1, d_model]
    n_layers = loaded.n_layers
    # every layer of a few positions decoded in one product: one [rows, d] × [d, vocab] matmul is far
    # faster per row than one per layer (26 rows: 40 ms; 256 rows: 148 ms, one thread of this CPU)
    per_chunk = max(1, TOKEN_CHUNK // (n_layers + 1))  # positions per chunk
    buffer = torch.empty(min(per_chunk, ids.numel()) * (n_layers + 1), loaded.vocab_size, device=loaded.head_device)
    columns: dict[str, list] = {name: [] for name in ("position", "layer", "kl", "overlap", "top_ids", "top_probs")}
    for start in range(0, ids.numel(), per_chunk):
        chunk = states[start : start + per_chunk].to(loaded.head_device)  # [position, L+1, d_model]
        count = chunk.shape[0]
        with torch.inference_mode():
            final_logp = torch.log_softmax(loaded.head_into(chunk[:, n_layers], buffer).clone(), dim=-1)
            final_top = largest(final_logp, top_k).indices  # [position, k]
            hidden = chunk.transpose(0, 1)  # [L+1, position, d_model]
            if lens is not None:  # each layer's translator; the output (layer L) as it is
                hidden = torch.stack([*(lens.translate(i, hidden[i]) for i in range(n_layers)), hidden[n_layers]])
            logp = torch.log_softmax(loaded.head_into(hidden.reshape(-1, hidden.shape[-1]), buffer), dim=-1)
            logp = logp.view(n_layers + 1, count, -1)  # [L+1, position, vocab]
            kl = (logp.exp() * (logp - final_logp)).sum(-1).clamp_min(0.0)  # [L+1, position]
            top = largest(logp, top_k)  # [L+1, position, k]
            overlap = (top.indices[..., None] == final_top[None, :, None, :]).any(-1).float().mean(-1)
        columns["position"] += (start + torch.arange(count)).repeat(n_layers + 1).tolist()  # layer-major
        columns["layer"] += torch.arange(n_layers + 1).repeat_interleave(count).tolist()
        columns["kl"] += kl.reshape(-1).tolist()
        columns["overlap"] += overlap.reshape(-1).tolist()
        columns["top_ids"] += top.indices.reshape(-1, top_k).tolist()
        columns["top_probs"] += top.values.exp().reshape(-1, top_k).tolist()
    decode = _decoder(loaded)
    words = decode(ids.tolist())
    flat = decode([i for row in columns.pop("top_ids") for i in row])
    columns["top_tokens"] = [flat[i : i + top_k] for i in range(0, len(flat), top_k)]
    columns["token"] = [words[position] for position in columns["position"]]
    schema = {"position": pl.Int64, "token": pl.String, "layer": pl.Int64, "kl": pl.Float64, "overlap": pl.Float64,
              "top_tokens": pl.List(pl.String), "top_probs": pl.List(pl.Float64)}  # fmt: skip
    return pl.DataFrame({name: columns[name] for name in schema}, schema=schema).sort("layer", "position")


def _check_one_prompt(prompt: object) -> None:
    """One line for what is not one prompt: a list, a 2-D batch, anything but text or 1-D ids."""
    if isinstance(prompt, str):
        return
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() == 1 or (prompt.dim() == 2 and prompt.shape[0] == 1):
            return
        raise EffdepthError(
            f"lens_by_token reads one prompt: a text or 1-D token ids, got a tensor of shape {list(prompt.shape)}; "
            "call it once per prompt (for a batch, logit_lens(model, prompts) gives per-prompt means)"
        )
    kind = f"a list of {len(prompt)}" if isinstance(prompt, list | tuple) else type(prompt).__name__
    raise EffdepthError(
        f"lens_by_token reads one prompt: a text or 1-D token ids, got {kind}; call it once per prompt "
        "(for many prompts, logit_lens(model, prompts) gives per-prompt means)"
    )


def _decoder(loaded: LoadedModel):
    """``decode(ids)``: each id as the text it stands for (its id in brackets where there is no
    tokenizer), each distinct id decoded once."""
    texts: dict[int, str] = {}

    def decode(ids: list[int]) -> list[str]:
        new = [i for i in dict.fromkeys(ids) if i not in texts]
        if new:
            if loaded.tokenizer is None:
                texts.update((i, f"[{i}]") for i in new)
            else:
                texts.update(zip(new, loaded.tokenizer.batch_decode([[i] for i in new]), strict=True))
        return [texts[i] for i in ids]

    return decode


def prediction_table(rows: pl.DataFrame, rank: int = 0) -> pl.DataFrame:
    """The one-prompt view: a layer × position table of the lens's ``rank``-th most likely token
    (0: its top prediction), as tuned-lens and TransformerLens show it; a frame, so it renders as a
    table in a notebook.

    Args:
        rows: ``lens_by_token``'s frame for one prompt.
        rank: which of the kept top-k tokens to show (0 ≤ rank < top_k).

    Returns:
        One row per layer (``layer``, last is the model's output), one column per position, named
        ``"<position> <input token>"``.
    """
    from ...errors import OptionError, require_whole

    if not isinstance(rows, pl.DataFrame):
        kind = "a pandas DataFrame" if hasattr(rows, "columns") else type(rows).__name__
        fix = "pl.from_pandas(rows) or " if hasattr(rows, "columns") else ""
        raise EffdepthError(f"prediction_table takes lens_by_token's polars frame for one prompt, got {kind}; "
                            f"pass {fix}lens_by_token(model, prompt)")  # fmt: skip
    missing = [c for c in ("position", "token", "layer", "top_tokens") if c not in rows.columns]
    if missing:
        raise EffdepthError(
            f"prediction_table takes lens_by_token's frame for one prompt; this one has no {', '.join(missing)} "
            "(a logit_lens frame holds per-prompt means, not tokens): pass lens_by_token(model, prompt)"
        )
    if not rows.height:
        raise EffdepthError("no rows: give lens_by_token's frame for one prompt")
    repeated = rows.height - rows.select("layer", "position").n_unique()
    if repeated:
        raise EffdepthError(
            f"prediction_table reads one prompt, but {repeated} (layer, position) pairs repeat: rows of several "
            "prompts; pass one prompt's lens_by_token frame"
        )
    kept = int(rows["top_tokens"].list.len().min())
    if require_whole("rank", rank, 0) >= kept:
        raise OptionError(f"rank must be below the top_k kept ({kept}), got {rank}")
    names = {p: f"{p} {t!r}" for p, t in rows.select("position", "token").unique().sort("position").iter_rows()}
    picked = rows.select("layer", "position", pl.col("top_tokens").list.get(rank).alias("predicted"))
    wide = picked.pivot(on="position", index="layer", values="predicted").sort("layer")
    return wide.rename({str(p): name for p, name in names.items()})
