"""Residual erasure (SPEC §4, Csordás Fig. 4b): replace one position's residual at one depth by the
dataset mean and record the largest change in the distributions that predict the answer tokens.

- ``method="slow"``: one full forward pass per (layer, position), as the published loop;
- ``method="fast"``: per layer, all positions as batch rows replayed from that layer on; the last
  token (which predicts nothing inside the prompt) is dropped by causality.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import torch
from tqdm import tqdm

from ..models import LoadedModel
from ..replay import clean_run, run_layers
from ..trace import LayerTrace, forward, iter_batches, require_finite, tokenize, trace_layers
from .answers import AnswerInput, answer_splits
from .output_change import output_change


def residual_means(loaded: LoadedModel, prompts: Sequence[str | torch.Tensor], batch_size: int = 4) -> torch.Tensor:
    """Mean of h_l over every token of ``prompts`` for l = 0..L, ``[L+1, d_model]`` float32."""
    token_lists = tokenize(loaded, prompts)
    sums = torch.zeros(loaded.n_layers + 1, loaded.d_model, dtype=torch.float64)
    count = sum(ids.numel() for ids in token_lists)
    for batch in iter_batches(token_lists, batch_size, loaded.input_device):
        mask = batch.mask

        def on_layer(trace: LayerTrace, mask: torch.Tensor = mask) -> None:
            sums[trace.layer] += trace.h_in[mask].double().sum(0).cpu()
            if trace.layer == loaded.n_layers - 1:
                sums[-1] += trace.h_out[mask].double().sum(0).cpu()

        with trace_layers(loaded, on_layer, sublayers=False):
            forward(loaded, batch)
    return (sums / count).float()


def _map_fast(loaded, ids, n_answer, baselines, max_rows) -> torch.Tensor:
    n_tokens = ids.numel()
    run = clean_run(loaded, ids[:-1])  # the last token predicts nothing inside the prompt
    measure = slice(n_tokens - 1 - n_answer, n_tokens - 1)  # positions predicting the answer tokens
    effects = torch.zeros(loaded.n_layers + 1, n_tokens)  # [layer 0..L, position]
    with torch.inference_mode():
        clean_probs = torch.softmax(loaded.head(run.hidden[-1][0, measure]).float(), dim=-1)
        require_finite(clean_probs, "the final distribution (final norm + LM head)", loaded.name)
        for layer in range(loaded.n_layers + 1):
            base = baselines[layer].to(run.hidden[layer].device, run.hidden[layer].dtype)
            for start in range(0, n_tokens - 1, max_rows):
                positions = torch.arange(start, min(start + max_rows, n_tokens - 1))
                hidden = run.hidden[layer].expand(len(positions), -1, -1).clone()  # [rows, token, d]
                hidden[torch.arange(len(positions)), positions] = base
                final = run_layers(loaded, run, layer, hidden)
                effects[layer, positions] = output_change(loaded, clean_probs, final[:, measure])
    return effects


def _map_slow(loaded, ids, n_answer, baselines) -> torch.Tensor:
    n_tokens = ids.numel()
    measure = slice(n_tokens - 1 - n_answer, n_tokens - 1)
    input_ids = ids.view(1, -1).to(loaded.input_device)
    with torch.inference_mode():
        clean_probs = torch.softmax(loaded.model(input_ids=input_ids).logits[0, measure].float(), dim=-1)
    effects = torch.zeros(loaded.n_layers + 1, n_tokens)
    for layer in range(loaded.n_layers + 1):
        for position in range(n_tokens):

            def erase(tensor: torch.Tensor, layer: int = layer, position: int = position) -> torch.Tensor:
                tensor = tensor.clone()
                tensor[:, position] = baselines[layer].to(tensor.device, tensor.dtype)
                return tensor

            if layer < loaded.n_layers:  # replace the input of layer `layer`
                hook = loaded.layers[layer].register_forward_pre_hook(
                    lambda m, a, k, erase=erase: (
                        ((erase(a[0]), *a[1:]), k) if a else (a, {**k, "hidden_states": erase(k["hidden_states"])})
                    ),
                    with_kwargs=True,
                )
            else:  # replace the final residual h_L
                hook = loaded.layers[-1].register_forward_hook(
                    lambda m, a, o, erase=erase: (erase(o[0]), *o[1:]) if isinstance(o, tuple) else erase(o)
                )
            try:
                with torch.inference_mode():
                    logits = loaded.model(input_ids=input_ids, use_cache=False).logits[0, measure]
            finally:
                hook.remove()
            probs = torch.softmax(logits.float(), dim=-1)
            effects[layer, position] = (probs - clean_probs).norm(dim=-1).amax().cpu()
    return effects


def erasure_map(
    loaded: LoadedModel,
    examples: Sequence[AnswerInput],
    baselines: torch.Tensor | None = None,
    method: str = "fast",
    max_rows: int = 32,
    progress: bool = False,
) -> pl.DataFrame:
    """The (L+1)×T map per example: for erasing h_l[t] (l = 0 is the embedding, l = L the final
    residual), the largest ‖y − ȳ‖₂ over the positions that predict the answer tokens.

    ``baselines`` ``[L+1, d_model]`` default to ``residual_means`` over the examples themselves.
    Long frame: ``example, layer, position, token, is_answer, metric, value``.
    """
    if method not in ("fast", "slow"):
        raise ValueError(f"method must be 'fast' or 'slow', got {method!r}")
    splits = answer_splits(loaded, examples)
    if baselines is None:
        baselines = residual_means(loaded, [ids for ids, _ in splits])
    require_finite(baselines, "the mean residuals (erasure baselines)", loaded.name)
    if tuple(baselines.shape) != (loaded.n_layers + 1, loaded.d_model):
        raise ValueError(f"baselines must be [{loaded.n_layers + 1}, {loaded.d_model}], got {tuple(baselines.shape)}")
    frames = []
    with tqdm(total=len(splits), desc=f"erasure ({method})", unit="prompt", disable=not progress) as bar:
        for example, (ids, n_answer) in enumerate(splits):
            effects = (
                _map_fast(loaded, ids, n_answer, baselines, max_rows)
                if method == "fast"
                else _map_slow(loaded, ids, n_answer, baselines)
            )
            for layer in range(effects.shape[0]):
                where = f"the effect of erasing layer {layer}'s residual (prompt {example})"
                require_finite(effects[layer], where, loaded.name)
            frames.append(_frame(loaded, example, ids, n_answer, effects))
            bar.update(1)
    return pl.concat(frames)


def _frame(loaded: LoadedModel, example: int, ids: torch.Tensor, n_answer: int, effects: torch.Tensor) -> pl.DataFrame:
    n_layers_plus, n_tokens = effects.shape
    tokens = [loaded.tokenizer.decode([i]) if loaded.tokenizer is not None else str(i) for i in ids.tolist()]
    layer = torch.arange(n_layers_plus).repeat_interleave(n_tokens)
    position = torch.arange(n_tokens).repeat(n_layers_plus)
    return pl.DataFrame(
        {
            "example": [example] * (n_layers_plus * n_tokens),
            "layer": layer.numpy(),
            "position": position.numpy(),
            "token": [tokens[p] for p in position.tolist()],
            "is_answer": (position >= n_tokens - n_answer).numpy(),
            "metric": ["erasure_effect"] * (n_layers_plus * n_tokens),
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
