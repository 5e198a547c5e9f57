"""Attention entropy: per layer, how spread each head's attention is over the keys a query sees
(nats; 0 where a head attends to one key, log(t + 1) where query t attends uniformly), averaged over
heads and over each prompt's tokens. One file on the documented trace: ``trace_layers(...,
attention=True)`` hands each layer's attention weights per head to the measurement."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import torch

from ..trace import LayerTrace, require_finite
from ..wrapping import LoadedModel, takes_plain_models
from .shared.activations import each_batch, per_token_means
from .shared.reduce import token_weighted_mean
from .spec import Chart, ProbeSpec, on_prompts


@takes_plain_models()
def attention_entropy(
    loaded: LoadedModel, prompts: Sequence[str | torch.Tensor], batch_size: int = 4, progress: bool | None = None
) -> pl.DataFrame:
    """Per example and layer l in 0..L-1, the mean over the prompt's tokens of the entropy of each
    head's attention distribution at that token, averaged over heads: ``example, layer, metric``
    (``attn_entropy``), ``value``, ``n_tokens``. The attention is the model's own, computed by
    transformers' eager kernel for these passes (its kernel is restored after)."""

    def measure(trace: LayerTrace) -> list[tuple[int, torch.Tensor]]:
        weights = trace.attention.float()  # [batch, head, query, key]; 0 at keys a query does not see
        entropy = -torch.special.xlogy(weights, weights).sum(-1).mean(1)  # [batch, query]; 0 · log 0 = 0
        require_finite(entropy, f"the attention entropy at layer {trace.layer}", loaded.name)
        return [(trace.layer, entropy[..., None])]

    metrics, measured = ("attn_entropy",), each_batch(measure)
    return per_token_means(loaded, prompts, metrics, loaded.n_layers, measured, "attention entropy", batch_size,
                           progress, attention=True)  # fmt: skip


SPEC = ProbeSpec(
    name="attention_entropy",
    title="attention entropy",
    compute=on_prompts(attention_entropy),
    aggregate=token_weighted_mean,
    charts=(Chart("attention_entropy", "metric_curves", "attention_entropy"),),
    reusable=True,
    description="each layer's attention entropy over the keys a query sees (nats, mean over heads); no ED rule",
)
