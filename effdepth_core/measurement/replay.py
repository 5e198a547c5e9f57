"""Replay decoder layers from any depth on a batch of modified residual streams.

One clean forward pass of a single prompt records every layer's input h_l, the keyword arguments
the model called it with (attention mask, rotary embeddings, …) and, through the model's own
``DynamicCache``, every layer's keys and values. Any layer can then be re-run on a batch of
``rows`` different residual streams for the same tokens, so an intervention at layer s costs layers
s..L-1 only, with many interventions stacked as batch rows. Causal masks and position embeddings
recorded with batch size 1 broadcast over the rows.

Prefix reuse (``run_suffix_layer``): an intervention at position t leaves positions < t unchanged
at every layer (attention is causal), so only positions t.. are replayed, attending to the prefix's
cached keys/values through the layer's own cache argument; the recorded mask (full, sliding-window
or Gemma's hybrid layers alike) is sliced to the replayed queries.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field

import torch

from ..errors import UnsupportedModelError
from .layout import execution_device
from .trace import Hook, first_tensor, intervene, replace_positions, require_finite
from .wrapping import LoadedModel

# attention implementations whose masks effdepth can slice (flash kernels take no mask)
_PREFIX_ATTENTION = ("sdpa", "eager")
# the keyword decoder layers take a cache under: ``cache`` from transformers 5.24 (``past_key_values``
# is deprecated there), ``past_key_values`` before, ``layer_past`` in GPT-NeoX layers
_CACHE_ARGS = ("cache", "past_key_values", "layer_past")
_POSITION_ARGS = ("position_ids", "cache_position")  # [..., token]


@dataclass
class CleanRun:
    """One prompt's clean forward pass: ``hidden[l]`` is h_l ``[1, token, d_model]`` for l = 0..L;
    ``keys_values[l]`` layer l's cached (keys, values) ``[1, kv_head, token, head_dim]``."""

    input_ids: torch.Tensor  # [1, token]
    hidden: list[torch.Tensor]
    layer_kwargs: list[dict]
    keys_values: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    cache_arg: str | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def reuses_prefixes(self) -> bool:
        """Whether ``run_suffix_layer`` can replay a suffix against cached prefix keys/values."""
        return bool(self.keys_values) and self.cache_arg is not None


def _prefix_supported(loaded: LoadedModel, kwargs: list[dict], cache_arg: str | None) -> bool:
    if cache_arg is None or getattr(loaded.model.config, "_attn_implementation", None) not in _PREFIX_ATTENTION:
        return False
    known = {"attention_mask", "use_cache", *_CACHE_ARGS, *_POSITION_ARGS}
    for layer_kwargs in kwargs:
        for name, value in layer_kwargs.items():
            tensors = value if isinstance(value, tuple) else (value,)
            if name not in known and not name.startswith("position_embeddings"):
                if any(isinstance(x, torch.Tensor) for x in tensors):
                    return False  # a per-token argument effdepth does not know how to slice
        mask = layer_kwargs.get("attention_mask")
        if mask is not None and not (isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[0] == 1):
            return False
    return True


@functools.cache
def _model_cache_keyword(forward) -> str:
    """The keyword a decoder stack's ``forward`` takes its cache under: ``cache`` where the installed
    transformers has it (5.24 and newer warn on ``past_key_values``), else ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def cache_keyword(module: torch.nn.Module) -> str:
    """``_model_cache_keyword`` of ``module``'s class (a model or its base model)."""
    return _model_cache_keyword(type(module).forward)


def recording_hooks(loaded: LoadedModel, hidden: list, on_input=None) -> list[Hook]:
    """Hooks that store h_l, each layer's input (l < L), and h_L, the last layer's output, into
    ``hidden[l]``; ``on_input(l, kwargs)`` also sees each layer's keyword arguments."""

    def record(index: int):
        def fn(h: torch.Tensor, call_kwargs: dict) -> None:
            hidden[index] = h
            if on_input is not None and index < loaded.n_layers:
                on_input(index, call_kwargs)

        return fn

    hooks = [Hook(layer, "input", record(i)) for i, layer in enumerate(loaded.layers)]
    hooks.append(Hook(loaded.layers[-1], "output", record(loaded.n_layers)))
    return hooks


def recorded_forward(
    loaded: LoadedModel, input_ids: torch.Tensor, interventions: list[Hook]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One full forward pass of ``input_ids`` ``[1, token]`` with ``interventions`` hooked in,
    recorded as ``clean_run`` records: h_0..h_L (seeing the interventions: they are registered
    first, and hooks run in registration order) and the logits ``[1, token, vocab]``."""
    hidden: list[torch.Tensor | None] = [None] * (loaded.n_layers + 1)
    with intervene([*interventions, *recording_hooks(loaded, hidden)]), torch.inference_mode():
        logits = loaded.model(input_ids=input_ids, use_cache=False).logits
    return hidden, logits


def clean_run(loaded: LoadedModel, ids: torch.Tensor) -> CleanRun:
    """Run ``ids`` ``[token]`` once and record what every decoder layer received and returned."""
    hidden: list[torch.Tensor | None] = [None] * (loaded.n_layers + 1)
    kwargs: list[dict] = [{} for _ in range(loaded.n_layers)]
    from transformers import DynamicCache  # imported here: `effdepth grid --dry-run` needs no transformers

    cache = DynamicCache()  # no config: full layers keep every position, sliding ones included
    cache_arg: list[str] = []

    def keep_kwargs(index: int, call_kwargs: dict) -> None:
        kwargs[index] = {k: v for k, v in call_kwargs.items() if k != "hidden_states"}
        for name, value in kwargs[index].items():
            if value is cache:  # replays get a cache of their own, never this one
                kwargs[index][name] = None
                cache_arg.append(name)

    hooks = recording_hooks(loaded, hidden, keep_kwargs)
    input_ids = ids.view(1, -1).to(loaded.input_device)
    base = loaded.base_model()
    try:
        with intervene(hooks), torch.no_grad():  # not inference_mode: replays may differentiate through these
            base(input_ids=input_ids, use_cache=True, **{cache_keyword(base): cache})
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError, AttributeError, KeyError):
        # a cache of layers the plain DynamicCache lacks (a sparse-attention indexer's keys, a
        # linear-attention state): recorded without a cache; replays then run whole prompts
        cache_arg.clear()
        kwargs[:] = [{} for _ in range(loaded.n_layers)]
        cache = DynamicCache()
        try:
            with intervene(hooks), torch.no_grad():
                base(input_ids=input_ids, use_cache=False)
        except (RuntimeError, ValueError, TypeError, IndexError, AttributeError, KeyError) as exc:
            raise ReplayError(
                f"model {loaded.name!r} ({loaded.model_type}) cannot be recorded for a replay "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else 'no message'}), which "
                f"{REPLAY_PROBES} need; the probes that only read a forward pass are unaffected"
            ) from None
    for index, h in enumerate(hidden):
        require_finite(h, "the embedding output" if index == 0 else f"the output of layer {index - 1}", loaded.name)
    keys_values = [(layer.keys, layer.values) for layer in cache.layers]
    arg = cache_arg[0] if len(cache_arg) == loaded.n_layers and len(keys_values) == loaded.n_layers else None
    if arg is None or not loaded.prefix_replays or not _prefix_supported(loaded, kwargs, arg):
        keys_values, arg = [], None
    run = CleanRun(input_ids, [h.clone() for h in hidden], kwargs, keys_values, arg)
    if run.n_tokens > loaded.replay_checked_tokens:  # each new longest prompt: a look-ahead may start there
        check_replay(loaded, run)
    return run


def check_replay(loaded: LoadedModel, run: CleanRun) -> None:
    """Before any replay probe trusts a replay of a prompt longer than any checked on this model
    (a sparse indexer's top-k starts to choose only beyond its k keys): a position of the residual zeroed at
    the input of one layer and replayed from there (whole prompt, and from that position on against
    the cached prefix where the model allows it) must give the model's own forward with the same
    zeroing through a hook, and the states of all but the last position must not change when the
    last token is dropped (the probes' causality). A model that fails — a state passed from block to
    block besides the residual, a sparse-attention indexer that looks ahead — is refused in one
    line for the replay probes; those that only read a forward pass are unaffected."""
    from .checks import PADDING_TOLERANCE  # the same rounding allowance as the padding check

    if run.n_tokens < 3:
        return  # too short to tell; a later, longer prompt checks
    tolerance = PADDING_TOLERANCE.get(run.hidden[0].dtype, 2e-2)
    layer, position = 0, run.n_tokens // 2  # from layer 0: every later block's arguments are replayed
    rows = torch.ones(1, dtype=torch.bool)
    zero = torch.zeros(())
    hook = Hook(
        loaded.layers[layer], "input", lambda h, _: replace_positions(h, rows, slice(position, position + 1), zero)
    )
    with torch.no_grad():
        own = recorded_forward(loaded, run.input_ids, [hook])[0][-1]  # [1, token, d]
        zeroed = run.hidden[layer].clone()
        zeroed[:, position] = 0
        replays = {"whole-prompt": run_layers(loaded, run, layer, zeroed)}
        scale = max(float(own.abs().max()), 1e-12)
        if run.reuses_prefixes:  # one that fails or is off: this model replays whole prompts instead
            try:
                suffix = zeroed[:, position:]
                for index in range(layer, loaded.n_layers):
                    suffix, _ = run_suffix_layer(loaded, run, index, suffix, position)
                prefix = torch.cat([run.hidden[-1][:, :position], suffix.to(own.device)], dim=1)
                exact = float((prefix - own).abs().max()) <= tolerance * scale
            except ReplayError:
                exact = False
            if not exact:
                loaded.prefix_replays = False
                run.keys_values, run.cache_arg = [], None
        shorter = recorded_forward(loaded, run.input_ids[:, :-1], [])[0]
    problems = [
        f"its {kind} replay is off by {float((replayed - own).abs().max()) / scale:.1%} of the residual"
        for kind, replayed in replays.items()
        if float((replayed.to(own.device) - own).abs().max()) > tolerance * scale
    ]
    moved = max(float((a[:, :-1] - b.to(a.device)).abs().max()) for a, b in zip(run.hidden, shorter, strict=True))
    if moved > tolerance * scale:
        problems.append(f"dropping its last token moves the earlier positions' states by {moved / scale:.1%}")
    if problems:
        raise ReplayError(
            f"model {loaded.name!r} ({loaded.model_type}) does not replay as it runs ({'; '.join(problems)}), "
            f"which {REPLAY_PROBES} rely on; the probes that only read a forward pass are unaffected"
        )
    loaded.replay_checked_tokens = run.n_tokens


def run_layer(loaded: LoadedModel, run: CleanRun, layer: int, hidden: torch.Tensor) -> torch.Tensor:
    """Layer ``layer`` applied to ``hidden`` ``[rows, token, d_model]`` (same tokens as ``run``)."""
    module = loaded.layers[layer]
    kwargs = _for_rows(loaded, run.layer_kwargs[layer], hidden.shape[0])
    return _call_layer(loaded, module, hidden.to(execution_device(module)), kwargs)


def _for_rows(loaded: LoadedModel, kwargs: dict, rows: int) -> dict:
    """A layer's recorded keyword arguments (batch 1) for ``rows`` rows: a 4-D attention mask
    expanded to them (XGLM checks its size), an argument with the batch folded into its first
    dimension (``Adapter.folded_kwargs``: BLOOM's ALiBi) repeated per row; the rest broadcast."""
    if rows == 1:
        return kwargs
    out = dict(kwargs)
    mask = out.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[0] == 1:
        out["attention_mask"] = mask.expand(rows, -1, -1, -1)
    for name in loaded.adapter.folded_kwargs:
        if isinstance(out.get(name), torch.Tensor):
            out[name] = out[name].repeat(rows, *([1] * (out[name].dim() - 1)))
    return out


class ReplayError(UnsupportedModelError):
    """A model whose decoder layers cannot be re-run one by one on recorded arguments."""


REPLAY_PROBES = "the probes that re-run its layers one by one"  # the registry names probes; this, what they share


def _call_layer(loaded: LoadedModel, module: torch.nn.Module, hidden: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """``module(hidden, **kwargs)``'s hidden state; a layer that fails on recorded arguments is a
    model effdepth cannot replay, said in one line (never a traceback from inside the model)."""
    try:
        return first_tensor(module(hidden, **kwargs))
    except torch.OutOfMemoryError:  # memory, not the model's layout: the caller's budget decides
        raise
    except (RuntimeError, ValueError, TypeError, IndexError, AttributeError, KeyError) as exc:
        raise ReplayError(
            f"model {loaded.name!r} ({loaded.model_type}) cannot have its layers replayed one by one "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else 'no message'}), which "
            f"{REPLAY_PROBES} need; the probes that only read a forward pass are unaffected"
        ) from None


def run_layers(loaded: LoadedModel, run: CleanRun, start: int, hidden: torch.Tensor, stop: int | None = None):
    """Layers ``start``..``stop-1`` (default: to the last) applied to ``hidden``; returns h_stop."""
    for layer in range(start, loaded.n_layers if stop is None else stop):
        hidden = run_layer(loaded, run, layer, hidden)
    return hidden


def _suffix_mask(mask: torch.Tensor | None, cut: int, stop: int, device: torch.device) -> torch.Tensor:
    """Queries cut..stop-1 against keys 0..stop-1: the recorded mask sliced, or (where the model
    recorded none, meaning plain causal) a boolean causal mask ``[1, 1, query, key]``; none again
    without a prefix, where SDPA's own (top-left aligned) causal flag is right and faster."""
    if mask is not None:
        return mask[:, :, cut:stop, :stop]
    if cut == 0:
        return None
    query = torch.arange(cut, stop, device=device).view(-1, 1)
    return (torch.arange(stop, device=device).view(1, -1) <= query).view(1, 1, stop - cut, stop)


def suffix_kwargs(run: CleanRun, layer: int, cut: int, stop: int, cache=None) -> dict:
    """Layer ``layer``'s recorded keyword arguments for positions cut..stop-1, with ``cache``."""
    out = {}
    for name, value in run.layer_kwargs[layer].items():
        if name == run.cache_arg:
            value = cache
        elif name == "attention_mask":
            value = _suffix_mask(value, cut, stop, run.hidden[layer].device)
        elif name in _POSITION_ARGS and value is not None:
            value = value[..., cut:stop]
        elif name.startswith("position_embeddings") and value is not None:  # (cos, sin) or one tensor
            value = tuple(x[:, cut:stop] for x in value) if isinstance(value, tuple) else value[:, cut:stop]
        out[name] = value
    return out


def run_suffix_layer(
    loaded: LoadedModel,
    run: CleanRun,
    layer: int,
    hidden: torch.Tensor,
    cut: int,
    prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Layer ``layer`` on ``hidden`` ``[rows, n, d_model]`` = positions cut..cut+n-1, attending to
    the keys/values of positions < cut: ``prefix`` ``[1 or rows, kv_head, cut, head_dim]``, by
    default the clean run's. Returns the output and the layer's keys/values of all cut+n positions
    ``[rows, kv_head, cut+n, head_dim]``. Needs ``run.reuses_prefixes``."""
    if not run.reuses_prefixes:
        raise ValueError("this run recorded no keys/values to reuse (see CleanRun.reuses_prefixes)")
    rows, stop = hidden.shape[0], cut + hidden.shape[1]
    from transformers import DynamicCache

    cache = DynamicCache()
    if cut:
        keys, values = prefix if prefix is not None else (kv[:, :, :cut] for kv in run.keys_values[layer])
        cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), layer)
    module = loaded.layers[layer]
    kwargs = _for_rows(loaded, suffix_kwargs(run, layer, cut, stop, cache), rows)
    out = _call_layer(loaded, module, hidden.to(execution_device(module)), kwargs)
    return out, (cache.layers[layer].keys, cache.layers[layer].values)
