"""Replay decoder layers from any depth on a batch of modified residual streams.

One clean forward pass of a single prompt records every layer's input h_l and the keyword
arguments the model called it with (attention mask, rotary embeddings, …). Any layer can then be
re-run on a batch of ``rows`` different residual streams for the same tokens, so an intervention
at layer s costs layers s..L-1 only, with many interventions stacked as batch rows. Causal masks
and position embeddings recorded with batch size 1 broadcast over the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .models import LoadedModel
from .trace import Hook, first_tensor, intervene, require_finite


@dataclass
class CleanRun:
    """One prompt's clean forward pass: ``hidden[l]`` is h_l ``[1, token, d_model]`` for l = 0..L."""

    input_ids: torch.Tensor  # [1, token]
    hidden: list[torch.Tensor]
    layer_kwargs: list[dict]

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[1])


def clean_run(loaded: LoadedModel, ids: torch.Tensor) -> CleanRun:
    """Run ``ids`` ``[token]`` once and record what every decoder layer received and returned."""
    hidden: list[torch.Tensor | None] = [None] * (loaded.n_layers + 1)
    kwargs: list[dict] = [{} for _ in range(loaded.n_layers)]

    def record(index: int):
        def fn(h: torch.Tensor, call_kwargs: dict) -> None:
            hidden[index] = h
            if index < loaded.n_layers:
                kwargs[index] = {k: v for k, v in call_kwargs.items() if k != "hidden_states"}

        return fn

    hooks = [Hook(layer, "input", record(i)) for i, layer in enumerate(loaded.layers)]
    hooks.append(Hook(loaded.layers[-1], "output", record(loaded.n_layers)))
    input_ids = ids.view(1, -1).to(loaded.input_device)
    with intervene(hooks), torch.no_grad():  # not inference_mode: replays may differentiate through these
        loaded.base_model()(input_ids=input_ids, use_cache=False)
    for index, h in enumerate(hidden):
        require_finite(h, "the embedding output" if index == 0 else f"the output of layer {index - 1}", loaded.name)
    return CleanRun(input_ids, [h.clone() for h in hidden], kwargs)


def run_layer(loaded: LoadedModel, run: CleanRun, layer: int, hidden: torch.Tensor) -> torch.Tensor:
    """Layer ``layer`` applied to ``hidden`` ``[rows, token, d_model]`` (same tokens as ``run``)."""
    module = loaded.layers[layer]
    device = next(module.parameters()).device
    return first_tensor(module(hidden.to(device), **run.layer_kwargs[layer]))


def run_layers(loaded: LoadedModel, run: CleanRun, start: int, hidden: torch.Tensor, stop: int | None = None):
    """Layers ``start``..``stop-1`` (default: to the last) applied to ``hidden``; returns h_stop."""
    for layer in range(start, loaded.n_layers if stop is None else stop):
        hidden = run_layer(loaded, run, layer, hidden)
    return hidden
