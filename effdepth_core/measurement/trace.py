"""Hooks on a decoder stack — the one mechanism every probe uses to read or change a module's
input or output (``intervene``) — plus tokenizing and batching prompts."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from ..errors import EffdepthError, NonFiniteActivationError
from .checks import arguments_by_name, named_arguments, sublayer_write
from .identity import model_configs
from .wrapping import LoadedModel


@dataclass
class LayerTrace:
    """What one decoder layer read and wrote for a batch, each ``[batch, token, d_model]``."""

    layer: int
    h_in: torch.Tensor  # h_l
    attn: torch.Tensor | None  # a_l, what attention adds to the residual (its group's writes, method.md §1)
    mlp: torch.Tensor | None  # m_l, what the MLP adds to the residual (with any further writes of the block)
    h_out: torch.Tensor  # h_{l+1}
    attention: torch.Tensor | None = None  # its attention weights per head [batch, head, query, key]; attention=True


def first_tensor(value) -> torch.Tensor:
    # Decoder layers and attention modules return a tensor in some transformers versions and a
    # tuple (tensor, extras...) in others.
    return value[0] if isinstance(value, (tuple, list)) else value


# the finite checks of the block ``finite_checks_deferred`` is running: (flag on the device, what, model)
_DEFERRED: ContextVar[list | None] = ContextVar("effdepth_deferred_finite_checks", default=None)
_CHECKED_AT_ONCE = ("cpu",)  # device types whose checks cost no host wait: never deferred


def require_finite(tensor: torch.Tensor, what: str, model: str) -> None:
    """Raise a one-line error naming ``what`` (a layer, module or probe value) if ``tensor`` holds
    NaN or inf: no probe reports or caches a non-finite number. Inside ``finite_checks_deferred``,
    a tensor on an accelerator is checked at the end of the block instead (no host wait per call)."""
    pending = _DEFERRED.get()
    if pending is not None and tensor.device.type not in _CHECKED_AT_ONCE:
        pending.append((torch.isfinite(tensor).all(), what, model))
        return
    if not torch.isfinite(tensor).all():
        raise NonFiniteActivationError(
            f"{what} of model {model!r} contains NaN or inf; try float32 (dtype='float32', --dtype float32) "
            "or check the weights"
        )


@contextmanager
def finite_checks_deferred() -> Iterator[None]:
    """Collect the ``require_finite`` checks of accelerator tensors made inside the block and
    raise the first failing one when it ends: one host synchronisation per block (a batch) instead
    of one per layer. On a CPU every check runs at once, as outside."""
    pending: list = []
    token = _DEFERRED.set(pending)
    try:
        yield
    finally:
        _DEFERRED.reset(token)
    if pending:
        device = pending[0][0].device
        flags = torch.stack([flag.to(device) for flag, _, _ in pending]).tolist()
        for ok, (_, what, model) in zip(flags, pending, strict=True):
            if not ok:
                require_finite(torch.tensor(float("nan")), what, model)


# --- interventions: the one way effdepth reads or changes a module's input or output -------------

HookFn = Callable[[torch.Tensor, dict], "torch.Tensor | None"]


class Hook(NamedTuple):
    """Call ``fn(hidden, kwargs)`` on ``module``'s hidden-state input (``where="input"``) or output
    (``"output"``; the tensor, whatever tuple the module wraps it in), or on every output as the
    module returns it (``"outputs"``: the whole tuple, an attention's weights included). ``kwargs``
    are the keyword arguments of the call. ``fn`` returns a replacement (a tensor; for
    ``"outputs"``, the whole output), or None to leave it (a read)."""

    module: nn.Module
    where: str
    fn: HookFn


def _input_hook(fn: HookFn):
    def hook(module, args, kwargs):
        try:
            kwargs, rest = arguments_by_name(module, args, kwargs), ()
        except RuntimeError:  # a forward(*args) names none of them: they stay positional
            rest = args[1:]
        args = args[:1]
        hidden = args[0] if args else kwargs["hidden_states"]
        new = fn(hidden, kwargs)
        if new is None:
            return None
        return ((new, *rest), kwargs) if args else (args, {**kwargs, "hidden_states": new})

    return hook


def _output_hook(fn: HookFn):
    def hook(module, args, kwargs, output):
        new = fn(first_tensor(output), named_arguments(module, args, kwargs))
        if new is None:
            return None
        return (new, *output[1:]) if isinstance(output, tuple) else new

    return hook


def _outputs_hook(fn: HookFn):
    def hook(module, args, kwargs, output):
        return fn(output, named_arguments(module, args, kwargs))

    return hook


@contextmanager
def intervene(hooks: Sequence[Hook]) -> Iterator[None]:
    """While active, every hook runs on each forward pass (hooks on one module run in the order
    given); all are removed on exit, also after an error."""
    handles = []
    try:
        for module, where, fn in hooks:
            if where == "input":
                handles.append(module.register_forward_pre_hook(_input_hook(fn), with_kwargs=True))
            elif where == "output":
                handles.append(module.register_forward_hook(_output_hook(fn), with_kwargs=True))
            elif where == "outputs":
                handles.append(module.register_forward_hook(_outputs_hook(fn), with_kwargs=True))
            else:
                raise ValueError(f"where must be 'input', 'output' or 'outputs', got {where!r}")
        yield
    finally:
        for handle in handles:
            handle.remove()


def replace_positions(hidden: torch.Tensor, rows: torch.Tensor, positions: slice, value: torch.Tensor) -> torch.Tensor:
    """``hidden`` ``[batch, token, d]`` with ``value`` (broadcastable) at ``positions`` of the batch
    rows where ``rows`` (bool ``[batch]``) is true, elsewhere unchanged."""
    mask = torch.zeros((*hidden.shape[:2], 1), dtype=torch.bool, device=hidden.device)
    mask[rows.to(hidden.device), positions] = True
    return torch.where(mask, value.to(hidden.device, hidden.dtype), hidden)


def attention_modules(loaded: LoadedModel) -> list[nn.Module]:
    """Each decoder layer's attention module: the outermost module of the block whose class is
    named an attention (``…Attention``), the one that returns the attention weights."""
    found = []
    for index, layer in enumerate(loaded.layers):
        module = next((m for m in layer.modules() if m is not layer and "attention" in type(m).__name__.lower()), None)
        if module is None:
            raise EffdepthError(
                f"layer {index} of model {loaded.name!r} has no module named an attention (…Attention): its attention "
                "weights cannot be read; trace it with attention=False"
            )
        found.append(module)
    return found


@contextmanager
def eager_attention(loaded: LoadedModel) -> Iterator[None]:
    """Inside the block the model runs transformers' eager attention kernel (the one that computes
    and returns the attention weights), its own implementation restored on exit, also after an
    error."""
    configs = model_configs(loaded.model)  # the config first, its sub-configs after: restored in that order
    before = [getattr(config, "_attn_implementation", None) for config in configs]
    try:
        for config in configs:
            config._attn_implementation = "eager"
        yield
    finally:
        for config, implementation in zip(configs, before, strict=True):
            config._attn_implementation = implementation


@contextmanager
def trace_layers(
    loaded: LoadedModel,
    on_layer: Callable[[LayerTrace], None],
    sublayers: bool = True,
    check_finite: bool = True,
    attention: bool = False,
) -> Iterator[None]:
    """Call ``on_layer`` once per decoder layer during every forward pass inside the block. With
    ``attention``, each ``LayerTrace`` also holds the layer's attention weights per head
    (``[batch, head, query, key]``): the model runs the eager attention kernel inside the block
    (``eager_attention``: its own is restored after) and a hook on each attention module reads its
    every output (``Hook(where="outputs")``)."""
    state: dict[int, dict[str, torch.Tensor]] = {}

    def record(index: int, key: str) -> HookFn:
        def fn(hidden: torch.Tensor, kwargs: dict) -> None:
            if key == "h_in":
                if check_finite and index == 0:
                    require_finite(hidden, "the embedding output", loaded.name)
                state[index] = {}
            else:  # a sublayer's write: its output (less a residual it includes) times the residual multiplier
                hidden = sublayer_write(loaded.adapter, hidden, kwargs, state[index]["h_in"].shape)
                if loaded.write_scale is not None:
                    hidden = hidden * loaded.write_scale
                if key in state[index]:  # a further write of the same group (Adapter.attn_also / mlp_also)
                    hidden = state[index][key] + hidden
            state[index][key] = hidden

        return fn

    def weights(index: int) -> HookFn:
        def fn(output, kwargs: dict) -> None:
            found = output[1] if isinstance(output, tuple | list) and len(output) > 1 else None
            if not isinstance(found, torch.Tensor) or found.dim() != 4:
                raise EffdepthError(
                    f"the attention of layer {index} of model {loaded.name!r} returned no weights [batch, head, query, "
                    "key] under the eager kernel: its attention weights cannot be read"
                )
            state[index]["weights"] = found

        return fn

    def emit(index: int) -> HookFn:
        def fn(h_out: torch.Tensor, kwargs: dict) -> None:
            if check_finite:
                require_finite(h_out, f"the output of layer {index}", loaded.name)
            record = state.pop(index)
            attn, mlp = record.get("attn"), record.get("mlp")
            if scales[index] is not None:  # h_(l+1) = s · (h_l + writes): each write as the block adds it
                attn, mlp = (w * scales[index].to(w.device, w.dtype) if w is not None else None for w in (attn, mlp))
            on_layer(LayerTrace(index, record["h_in"], attn, mlp, h_out, record.get("weights")))

        return fn

    hooks = []
    scales = [loaded.residual_scale(index) if sublayers else None for index in range(loaded.n_layers)]
    attentions = attention_modules(loaded) if attention else []
    for index, layer in enumerate(loaded.layers):
        hooks.append(Hook(layer, "input", record(index, "h_in")))
        if sublayers:
            attn, rest = loaded.write_modules(index)
            hooks += [Hook(module, "output", record(index, "attn")) for module in attn]
            hooks += [Hook(module, "output", record(index, "mlp")) for module in rest]
        if attention:
            hooks.append(Hook(attentions[index], "outputs", weights(index)))
        hooks.append(Hook(layer, "output", emit(index)))
    try:
        with contextlib.ExitStack() as stack:
            if attention:
                stack.enter_context(eager_attention(loaded))
            stack.enter_context(intervene(hooks))
            yield
    finally:
        state.clear()


@dataclass
class Batch:
    """Right-padded token ids of several prompts (right padding keeps every real token's
    position, so causal attention makes batched and one-at-a-time results agree)."""

    input_ids: torch.Tensor  # [batch, token]
    attention_mask: torch.Tensor  # [batch, token], 1 for real tokens
    examples: list[int]  # index of each row in the caller's prompt list

    @property
    def mask(self) -> torch.Tensor:
        return self.attention_mask.bool()


def show_progress(progress: bool | None) -> bool:
    """Progress bars as asked, or (None, the probes' default) when a person is watching: a terminal,
    or a notebook (tqdm.auto draws a widget there)."""
    if progress is not None:
        return progress
    return bool(getattr(sys.stderr, "isatty", lambda: False)()) or "ipykernel" in sys.modules


# what every probe of prompts takes (``as_prompts``): one prompt, or several
Prompts = Any  # str | Example | Sequence[str | Example | Tensor | Sequence[int]] | Tensor | BatchEncoding | (ids, mask)


def _token_ids(value: Any) -> torch.Tensor:
    """Token ids as a long tensor; anything but whole numbers is refused (a float tensor cast to
    ids would silently probe other tokens)."""
    try:
        ids = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise EffdepthError(f"token ids must be whole numbers, got {type(value).__name__} ({exc})") from exc
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise EffdepthError(
            f"token ids must be whole numbers, got a {str(ids.dtype).removeprefix('torch.')} tensor; "
            "pass text, or the input_ids a tokenizer returns"
        )
    return ids.long()


def _masked_rows(ids: Any, mask: Any | None) -> list[torch.Tensor]:
    """Each row of a ``[batch, token]`` id tensor, without the positions its attention mask leaves
    out (padding on either side)."""
    ids = _token_ids(ids)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2:
        raise EffdepthError(f"token ids must be [token] or [batch, token], got shape {tuple(ids.shape)}")
    if mask is None:
        return list(ids)
    mask = torch.as_tensor(mask).bool().reshape(ids.shape)
    return [row[keep] for row, keep in zip(ids, mask, strict=True)]


def as_prompts(prompts: Prompts) -> list[str | torch.Tensor]:
    """One list of prompts (text or token ids) from what a probe is given: a string or an
    ``Example`` (one prompt); a list of strings, ``Example``s (their prompt), id tensors or lists
    of ids; a ``[batch, token]`` id tensor; a tokenizer's ``BatchEncoding`` (or a dict) or an
    ``(input_ids, attention_mask)`` pair, whose mask is respected (padding is not a token)."""
    if isinstance(prompts, str) or hasattr(prompts, "prompt"):
        return [getattr(prompts, "prompt", prompts)]
    if isinstance(prompts, Mapping):
        if "input_ids" not in prompts:
            raise EffdepthError("a dict of prompts needs input_ids (and attention_mask), as a tokenizer returns")
        return _masked_rows(prompts["input_ids"], prompts.get("attention_mask"))
    if torch.is_tensor(prompts):
        return _masked_rows(prompts, None)
    if isinstance(prompts, tuple) and len(prompts) == 2 and all(torch.is_tensor(p) for p in prompts):
        return _masked_rows(*prompts)
    if not isinstance(prompts, Iterable):
        raise EffdepthError(
            f"prompts must be text, an Example, token ids, a list of those or a tokenizer's batch; got "
            f"{type(prompts).__name__}"
        )
    items = list(prompts)
    if items and all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        return [torch.tensor(items, dtype=torch.long)]  # one prompt's ids
    out: list[str | torch.Tensor] = []
    for item in items:
        item = getattr(item, "prompt", item)
        if isinstance(item, str):
            out.append(item)
        elif torch.is_tensor(item) or isinstance(item, Sequence):
            out.append(_token_ids(item).flatten())
        else:
            raise EffdepthError(
                f"a prompt must be text, an Example, or token ids, got {type(item).__name__}; see as_prompts"
            )
    return out


def tokenize(loaded: LoadedModel, prompts: Prompts, truncate: bool = False) -> list[torch.Tensor]:
    """Token ids for each prompt (``as_prompts``: text is encoded, ids pass through, a mask is
    respected); checks lengths, or with ``truncate`` cuts a prompt longer than the model's context
    to it (for corpus text)."""
    prompts = as_prompts(prompts)
    if len(prompts) == 0:
        raise EffdepthError("no prompts to probe: the task gave 0 examples")
    token_lists = []
    for index, prompt in enumerate(prompts):
        ids = loaded.encode(prompt) if isinstance(prompt, str) else _token_ids(prompt)
        if ids.numel() == 0:
            raise EffdepthError(f"prompt {index} is empty after tokenization")
        vocabulary = loaded.model.get_input_embeddings().num_embeddings
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocabulary:
            bad = low if low < 0 else high
            raise EffdepthError(
                f"prompt {index} has token id {bad}, outside the vocabulary of {loaded.name!r} (0..{vocabulary - 1}); "
                "were the ids made by another model's tokenizer?"
            )
        if truncate and loaded.max_positions:
            ids = ids.flatten()[: loaded.max_positions]
        if loaded.max_positions and ids.numel() > loaded.max_positions:
            raise EffdepthError(
                f"prompt {index} has {ids.numel()} tokens but model {loaded.name!r} takes at most "
                f"{loaded.max_positions}; use shorter prompts or a task filter"
            )
        token_lists.append(ids.flatten())
    return token_lists


def iter_batches(
    token_lists: Sequence[torch.Tensor],
    batch_size: int,
    device: torch.device | str,
    max_tokens: int | None = None,
) -> Iterator[Batch]:
    """Group prompts (in order) into right-padded batches of at most ``batch_size`` rows and, if
    given, at most ``max_tokens`` real tokens (a single longer prompt still gets its own batch)."""
    for group in batch_groups(token_lists, batch_size, max_tokens):
        yield padded_batch(token_lists, group, device)


def batch_groups(
    token_lists: Sequence[torch.Tensor], batch_size: int, max_tokens: int | None = None
) -> tuple[tuple[int, ...], ...]:
    """The prompts of each batch ``iter_batches`` forms, by index."""
    if batch_size < 1:
        raise EffdepthError(f"batch size must be at least 1, got {batch_size}")
    groups: list[tuple[int, ...]] = []
    group: list[int] = []
    tokens = 0
    for index, ids in enumerate(token_lists):
        over_budget = max_tokens is not None and group and tokens + ids.numel() > max_tokens
        if len(group) == batch_size or over_budget:
            groups.append(tuple(group))
            group, tokens = [], 0
        group.append(index)
        tokens += ids.numel()
    return (*groups, tuple(group)) if group else tuple(groups)


def padded_batch(token_lists: Sequence[torch.Tensor], group: Sequence[int], device) -> Batch:
    """The prompts ``group`` (indices into ``token_lists``) as one right-padded batch."""
    width = max(token_lists[i].numel() for i in group)
    input_ids = torch.zeros(len(group), width, dtype=torch.long)
    attention_mask = torch.zeros(len(group), width, dtype=torch.long)
    for row, index in enumerate(group):
        ids = token_lists[index]
        input_ids[row, : ids.numel()] = ids
        attention_mask[row, : ids.numel()] = 1
    return Batch(input_ids.to(device), attention_mask.to(device), list(group))


def forward(loaded: LoadedModel, batch: Batch, head: bool = False):
    """One inference forward pass (no cache); without ``head`` only the decoder stack runs."""
    module = loaded.model if head else loaded.base_model()
    with torch.inference_mode():
        return module(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)


def residual_states(
    loaded: LoadedModel, token_lists: Sequence[torch.Tensor], batch_size: int = 4
) -> Iterator[torch.Tensor]:
    """h_0..h_L of every real token, batch by batch: ``[token, L+1, d_model]`` float32."""
    for batch in iter_batches(token_lists, loaded.rows(batch_size, token_lists), loaded.input_device):
        layers: list[torch.Tensor | None] = [None] * (loaded.n_layers + 1)

        def on_layer(trace: LayerTrace, mask: torch.Tensor = batch.mask, layers: list = layers) -> None:
            layers[trace.layer] = trace.h_in[mask].float().cpu()
            if trace.layer == loaded.n_layers - 1:
                layers[-1] = trace.h_out[mask].float().cpu()

        with trace_layers(loaded, on_layer, sublayers=False):
            forward(loaded, batch)
        yield torch.stack(layers, dim=1)
