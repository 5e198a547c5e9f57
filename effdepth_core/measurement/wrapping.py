"""A model in memory made measurable: ``LoadedModel`` (a causal LM plus what the probes read and decode
it by), ``wrap_model`` and the decorator that lets a probe take a plain transformers model."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import EffdepthError, UnsupportedModelError, nearest_name
from ..paths import exists
from .adapters import _REJECTED, _checked_layout, _unsupported_message
from .checks import key_selection, pads_safely
from .identity import attention_key, is_as_loaded
from .layout import Adapter, _get, decoder_stack, execution_device, residual_scale, write_modules


@dataclass(repr=False)
class LoadedModel:
    """A causal LM plus everything the probes need to read and decode its residual stream."""

    model: nn.Module
    tokenizer: object | None
    name: str
    adapter: Adapter
    layers: nn.ModuleList
    final_norm: nn.Module
    lm_head: nn.Module
    logit_softcap: float | None
    head_transform: nn.Module | None
    max_positions: int | None
    source: str | None = None  # the name load_model loaded it from (None: a model wrapped in memory)
    source_sha256: str | None = None  # the pinned sha256 of the offline alias it was loaded from
    loaded_weights: tuple | None = None  # ``weights_state`` when load_model returned it
    loaded_config: str | None = None  # ``config_digest`` then (a field edited in place is another model)
    loaded_tokenizer: object | None = None  # the tokenizer it came with (another one is another model)
    pads_safely: bool = True  # False: a padded batch changes a prompt's numbers; measured one at a time
    replay_checked_tokens: int = 0  # the longest prompt ``replay.check_replay`` passed on
    prefix_replays: bool = True  # False: ``replay.check_replay`` found its prefix replay off; whole prompts
    write_scale: float | None = None  # ``Adapter.write_scale`` of this model's config
    logit_scale: float | None = None  # ``Adapter.logit_scale`` of this model's config
    padding_key: tuple | None = None  # ``attention_key`` when ``pads_safely`` was found (another: not known)
    # (attention_key, the prompts checked) → whether padding them together kept each prompt's
    # numbers (``padding_holds``); shared by the copies ``dataclasses.replace`` makes (the same model)
    padding_verdicts: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def rows(self, batch_size: int, token_lists: Sequence[torch.Tensor] | None = None) -> int:
        """The prompts a padded batch may hold: ``batch_size``, or 1 where padding changes numbers —
        for ``token_lists`` (a run's prompts) verified at their own lengths (``padding_holds``)."""
        if batch_size <= 1:
            return batch_size
        if token_lists is None:
            return batch_size if self.pads_safely and self.padding_key in (None, attention_key(self.model)) else 1
        return batch_size if self.padding_holds(token_lists, batch_size) else 1

    def padding_holds(self, token_lists: Sequence[torch.Tensor], batch_size: int) -> bool:
        """Whether right-padding these prompts in batches of ``batch_size`` leaves each one's hidden
        states as they are alone, verified on the run's own prompts: its first batch, with its longest
        and shortest prompt added, padded together against each prompt alone (``pads_safely``: one
        forward of that batch and one per prompt, once per attention and set of prompts). False, with
        a warning once, where the load-time check failed under the same attention, where this check
        fails, or where a sparse-attention indexer keeps fewer keys than the longest prompt has
        (``key_selection``: which keys it keeps under padding differs batch by batch, so no batch
        verifies the others)."""
        from ..errors import EffdepthWarning

        lengths = [int(ids.numel()) for ids in token_lists]
        if len(set(lengths)) <= 1:
            return True  # every batch is as wide as each of its prompts: nothing is padded
        key = attention_key(self.model)
        if key == self.padding_key and not self.pads_safely:
            return False  # found at load under this attention, and said then
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        long = lengths[order[-1]]
        selection = key_selection(self.model)
        if selection is not None and long > selection:
            verdict_key: tuple = (key, "selection", selection)
            why = (
                f"its sparse attention keeps {selection} keys per query (index_topk) and this run's prompts have "
                f"up to {long} tokens: which keys a padded batch keeps differs from the prompt alone"
            )
            verdict = False
        else:
            rows = sorted({*range(min(batch_size, len(lengths))), order[0], order[-1]})
            prompts = [token_lists[row].flatten().cpu() for row in rows]
            verdict_key = (key, tuple(tuple(ids.tolist()) for ids in prompts))
            why = (
                f"a padded batch of this run's prompts ({min(lengths)} to {long} tokens) changes a shorter one's "
                "hidden states (its attention reads padded positions)"
            )
            verdict = self.padding_verdicts.get(verdict_key)
            if verdict is None:
                verdict = pads_safely(self.model, self.base_model(), self.layers[0], prompts)
        if verdict_key not in self.padding_verdicts:
            self.padding_verdicts[verdict_key] = verdict
            if not verdict:
                warnings.warn(
                    f"model {self.name!r}: {why}; effdepth measures it one prompt at a time",
                    EffdepthWarning,
                    stacklevel=3,
                )
        return verdict

    def is_as_loaded(self, spec: str, dtype: torch.dtype) -> bool:
        """Whether this is exactly what ``load_model(spec)`` gives in ``dtype``, untouched since
        (``identity.is_as_loaded``): only then may a run be keyed by the name."""
        return is_as_loaded(self, spec, dtype)

    def __repr__(self) -> str:
        return (
            f"LoadedModel({self.name!r}, {self.model_type}, {self.n_layers} layers, d_model={self.d_model}, "
            f"vocab={self.vocab_size}, {str(self.dtype).removeprefix('torch.')} on {self.input_device})"
        )

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def d_model(self) -> int:
        return int(self.model.config.get_text_config().hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    @property
    def model_type(self) -> str:
        return str(self.model.config.model_type)

    @property
    def input_device(self) -> torch.device:
        return execution_device(self.model.get_input_embeddings())

    @property
    def head_device(self) -> torch.device:
        return execution_device(self.lm_head)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def base_model(self) -> nn.Module:
        """The decoder stack without the LM head (saves the vocab projection when only h is needed)."""
        return decoder_stack(self.model, self.adapter)

    def head(self, residual: torch.Tensor) -> torch.Tensor:
        """Logits from a residual-stream state: Head(FinalNorm(h)), soft-capping included."""
        return self.head_of_normed(self.final_norm(residual.to(self.head_device)))

    def head_of_normed(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits from a state the final norm has already been applied to."""
        normed = normed.to(self.head_device)
        logits = self.lm_head(self.head_transform(normed) if self.head_transform is not None else normed)
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        if self.logit_softcap:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits

    def head_into(
        self, residual: torch.Tensor, out: torch.Tensor, product_dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """``head(residual)`` as float32 written into the preallocated ``out`` ``[token, vocab]``
        (reusing one buffer across layers avoids re-faulting fresh pages for every layer).
        ``product_dtype=torch.bfloat16`` (float32 weights only): the head matmul alone takes bfloat16
        inputs — the normed residual and a bfloat16 copy of the head made once — and its bfloat16
        output is widened into ``out``; the norm, bias, scale and soft-cap stay float32."""
        out = out[: residual.shape[0]]
        normed = self.final_norm(residual.to(self.head_device))
        if self.head_transform is not None:
            normed = self.head_transform(normed)
        weight = self.lm_head.weight
        # offloaded, the weight is a meta tensor until lm_head's own forward loads it
        plain = weight.dtype == torch.float32 and out.dtype == torch.float32 and weight.device == out.device
        if plain and product_dtype == torch.bfloat16:
            made = (weight.data_ptr(), weight._version)  # a weight edited in place is copied again
            if getattr(self, "_head_bf16", (None,))[0] != made:
                self._head_bf16 = (made, weight.detach().to(torch.bfloat16))
            out.copy_(torch.matmul(normed.to(torch.bfloat16), self._head_bf16[1].t()))
            if getattr(self.lm_head, "bias", None) is not None:
                out.add_(self.lm_head.bias)
        elif plain:
            torch.matmul(normed, weight.t(), out=out)
            if getattr(self.lm_head, "bias", None) is not None:
                out.add_(self.lm_head.bias)
        else:
            out.copy_(self.lm_head(normed))
        if self.logit_scale is not None:
            out.mul_(self.logit_scale)
        if self.logit_softcap:
            out.div_(self.logit_softcap).tanh_().mul_(self.logit_softcap)
        return out

    def sublayers(self, layer: int) -> tuple[nn.Module, nn.Module]:
        """The modules whose outputs are the attention and MLP contributions of ``layer``."""
        block = self.layers[layer]
        return _get(block, self.adapter.attn_out), _get(block, self.adapter.mlp_out)

    def write_modules(self, layer: int) -> tuple[tuple[nn.Module, ...], tuple[nn.Module, ...]]:
        """Every module whose output ``layer`` adds to the residual: (the attention's group, the rest)."""
        return write_modules(self.layers[layer], self.adapter)

    def residual_scale(self, layer: int) -> torch.Tensor | None:
        """What ``layer`` multiplies its output by (``Adapter.residual_scale``), or None."""
        return residual_scale(self.layers[layer], self.adapter)

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of ``text`` as the model's tokenizer (with its special tokens) gives them."""
        if self.tokenizer is None:
            raise EffdepthError(
                f"model {self.name!r} has no tokenizer; pass tokenizer= (with a transformers model) or token id "
                "tensors instead of text"
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise EffdepthError(
                "a prompt holds a lone surrogate (an unpaired \\ud800-\\udfff), no text a tokenizer can read; fix the "
                "string (text.encode('utf-16', 'surrogatepass').decode('utf-16') joins a split pair)"
            ) from None
        ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)


def readable_name(name_or_path: str, model_type: str) -> str:
    """A model's label from where transformers loaded it: a hub id as it is; a folder by its name, an
    offline alias's cached copy (``…/models/<alias>/dequantized-float32``, as ``acquire`` lays it out) by
    its alias."""
    if not name_or_path:
        return model_type
    path = Path(name_or_path).expanduser()
    if not (path.is_absolute() or name_or_path.startswith((".", "~")) or exists(path)):
        return name_or_path  # a hub id
    parts = path.parts
    if len(parts) >= 3 and parts[-3] == "models" and parts[-1].startswith("dequantized-"):
        return parts[-2]
    return path.name or name_or_path


def wrap_model(
    model: nn.Module, tokenizer: object | None = None, name: str | None = None, adapter: Adapter | None = None
) -> LoadedModel:
    """Describe an already-built HF causal LM: its layout from the adapter table, from ``adapter``
    (where a model keeps its layers, final norm and sublayer writes, for an architecture effdepth
    does not know), or inferred; whichever it is, it is verified on a probe input (the attention and
    MLP writes add up to each block's change, the final norm and head give the model's logits) and
    refused in one line when it does not fit. The model is put in eval mode with its parameters'
    gradients off — the probes differentiate activations, never parameters; ``measure`` restores the
    caller's state afterwards, a direct caller of ``wrap_model`` may call ``model.train()`` again.

    Args:
        model: a transformers causal LM (any ``nn.Module`` with ``config`` and the layout's modules).
        tokenizer: its tokenizer (None: probes then take token-id tensors only).
        name: the label of the model in results (None: its ``name_or_path``).
        adapter: the layout, for an architecture the table does not know.

    Returns:
        The verified ``LoadedModel``.

    Raises:
        UnsupportedModelError: a layout that does not verify, in one line saying what is off.
    """
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):  # PEFT wraps the model it adapts
        raise UnsupportedModelError(
            f"{type(model).__name__} is a PEFT model: its adapters change the layers effdepth reads; merge them "
            "into the model first (model = model.merge_and_unload()) and measure that"
        )
    check_tokenizer(tokenizer)
    config = getattr(model, "config", None)
    if config is None:
        raise UnsupportedModelError(
            f"wrap_model takes a transformers causal LM (a model with a .config), got {type(model).__name__}"
        )
    model_type = str(getattr(config, "model_type", "unknown"))
    name = name or readable_name(str(getattr(config, "_name_or_path", "") or ""), model_type)
    if model_type in _REJECTED or getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(_unsupported_message(model_type, name))
    lm_head = model.get_output_embeddings()
    if lm_head is None:
        raise UnsupportedModelError(f"model {name!r} has no output head; load it as a causal LM")
    model.eval()  # before any check runs the model: dropout would move what the checks compare
    model.requires_grad_(False)  # probes differentiate activations, never parameters
    adapter, padding = _checked_layout(model, adapter, model_type, name)
    max_positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if not padding:
        from ..errors import EffdepthWarning

        warnings.warn(
            f"model {name!r} changes a prompt's hidden states when it shares a padded batch (its attention reads "
            "padded positions); effdepth measures it one prompt at a time",
            EffdepthWarning,
            stacklevel=2,
        )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        adapter=adapter,
        layers=_get(model, adapter.layers),
        final_norm=_get(model, adapter.final_norm),
        lm_head=lm_head,
        logit_softcap=getattr(config.get_text_config(), "final_logit_softcapping", None),
        head_transform=_get(model, adapter.head_transform) if adapter.head_transform else None,
        max_positions=int(max_positions) if max_positions else None,
        pads_safely=padding,
        padding_key=attention_key(model),
        write_scale=float(adapter.write_scale(config.get_text_config())) if adapter.write_scale else None,
        logit_scale=float(adapter.logit_scale(config.get_text_config())) if adapter.logit_scale else None,
    )


# model -> (what its checks saw, its name, the layout, whether it pads safely, the warnings they gave):
@contextmanager
def as_the_caller_had(model: nn.Module):
    """Restore the training mode of ``model`` and of each submodule, and its parameters'
    ``requires_grad``, on exit (``wrap_model``
    puts the model in eval mode with gradients off; a caller's model is left as it was given)."""
    modes = [(module, module.training) for module in model.modules()]  # each submodule's own mode
    grads = [(p, p.requires_grad) for p in model.parameters()]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
        for p, requires_grad in grads:
            p.requires_grad_(requires_grad)


def _nearest_keyword(exc: TypeError, signature: inspect.Signature) -> str:
    """ " (did you mean skip_variants?)" for a keyword that is another spelling of a parameter."""
    import re

    found = re.search(r"keyword argument '(\w+)'", str(exc))
    close = nearest_name(found.group(1), list(signature.parameters)) if found else None
    return f" (did you mean {close}?)" if close else ""


def check_tokenizer(tokenizer: object) -> None:
    """One line for a ``tokenizer=`` that is no tokenizer: a name, a number, anything not callable."""
    if isinstance(tokenizer, str | Path):
        raise EffdepthError(
            f"tokenizer= takes a tokenizer object, not its name {str(tokenizer)!r}: pass "
            f"AutoTokenizer.from_pretrained({str(tokenizer)!r})"
        )
    if tokenizer is not None and not callable(tokenizer):
        raise EffdepthError(
            f"tokenizer= takes the model's tokenizer object (AutoTokenizer.from_pretrained(...)), got "
            f"{type(tokenizer).__name__} {tokenizer!r:.40}"
        )


def with_tokenizer(loaded: LoadedModel, tokenizer: object, caller: str) -> LoadedModel:
    """``loaded`` with ``tokenizer`` where it has none; refused where it has another one."""
    import dataclasses

    check_tokenizer(tokenizer)

    if loaded.tokenizer is None:
        return dataclasses.replace(loaded, tokenizer=tokenizer)
    if loaded.tokenizer is not tokenizer:
        raise EffdepthError(
            f"{caller}(): {loaded.name!r} was loaded with its own tokenizer; tokenizer= would measure other token "
            "ids under its name: drop tokenizer=, or wrap the model again with this one (wrap_model(model, tokenizer))"
        )
    return loaded


def takes_plain_models(*names: str):
    """Let a function whose parameters ``names`` (default: the first) take a ``LoadedModel`` also
    take a plain transformers causal LM, with ``tokenizer=`` (a keyword this adds): the model is
    wrapped (``wrap_model``) for the call and left in the state the caller gave it."""

    def decorate(fn):
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())
        wanted = names or (params[0].name,)
        adds_tokenizer = "tokenizer" not in signature.parameters
        if adds_tokenizer:
            keyword = inspect.Parameter(
                "tokenizer", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="object | None"
            )
            at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
            params.insert(at, keyword)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            tokenizer = kwargs.pop("tokenizer", None) if adds_tokenizer else kwargs.get("tokenizer")
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise EffdepthError(f"{fn.__name__}(): {exc}{_nearest_keyword(exc, signature)}") from None
            # warnings (the model's own included) are re-raised at the caller's line, also on an error
            caught: list = []
            try:
                with warnings.catch_warnings(record=True) as caught, contextlib.ExitStack() as stack:
                    warnings.simplefilter("always")
                    for name in wanted:
                        value = bound.arguments.get(name)
                        if value is None:
                            if adds_tokenizer and tokenizer is not None and len(wanted) == 1:
                                raise EffdepthError(
                                    f"{fn.__name__}(): tokenizer= goes with a model given in memory ({name}=), "
                                    "and none was given"
                                )
                            continue
                        if isinstance(value, LoadedModel):
                            if adds_tokenizer and tokenizer is not None:
                                bound.arguments[name] = with_tokenizer(value, tokenizer, fn.__name__)
                            continue
                        if not isinstance(value, nn.Module):
                            raise EffdepthError(
                                f"{fn.__name__}() takes a model (a transformers causal LM, or load_model/"
                                f"wrap_model's result) as {name}, got {type(value).__name__}"
                            )
                        stack.enter_context(as_the_caller_had(value))
                        bound.arguments[name] = wrap_model(value, tokenizer)
                    return fn(*bound.args, **bound.kwargs)
            finally:
                for warning in caught:
                    warnings.warn(warning.message, warning.category, stacklevel=2)

        wrapper.__signature__ = signature.replace(parameters=params)
        return wrapper

    return decorate


def truncate_layers(loaded: LoadedModel, n_layers: int) -> LoadedModel:
    """A copy of ``loaded`` that keeps only its first ``n_layers`` decoder layers (weights shared,
    final norm and head kept): for benchmarks that compare cost against depth."""
    import copy

    if not 1 <= n_layers <= loaded.n_layers:
        raise ValueError(f"n_layers must be in 1..{loaded.n_layers}, got {n_layers}")
    model = copy.copy(loaded.model)  # shallow: parameters are shared
    model.config = copy.deepcopy(loaded.model.config)
    model.config.num_hidden_layers = n_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:n_layers]
    parent_path, _, attr = loaded.adapter.layers.rpartition(".")
    parent = copy.copy(_get(model, parent_path))
    parent.config = model.config
    object.__setattr__(parent, "_modules", dict(parent._modules))
    parent._modules[attr] = nn.ModuleList(list(loaded.layers)[:n_layers])
    object.__setattr__(model, "_modules", dict(model._modules))
    model._modules[parent_path.split(".")[0]] = parent
    return wrap_model(model, loaded.tokenizer, name=f"{loaded.name}[:{n_layers}]")
