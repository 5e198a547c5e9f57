"""A model's identity, in one place for every route and every cache keyed on a model.

Routes: an offline alias by its pinned sha256, a folder or GGUF file by every file's sha256
(``model_files_digest``, records in the cache's ``fingerprints/``), a hub id by its revision
(``source_identity``); a ``LoadedModel`` exactly as ``load_model`` gave it by where it came from
(``is_as_loaded``), and anything else in memory — a plain transformers model, a model edited since
it loaded — by what it is (``model_fingerprint``: weights, config, tokenizer, layout).
Caches: the run key (``run_weights``, and ``settings`` hashes a local model's files through
``model_files_digest``), the tuned-lens cache (``model_identity``) and the load-time checks'
checked-once cache (``_what_checks_see``, whose verdict is reused only while the model's canary,
``_check_canary``, computes the same logits). Where a key cannot be complete (a model in memory:
its code, hooks, kernels), the caches verify by recomputation with the one canary here
(``canary_digest``: what the model computes now, bit for bit): a run of a model in memory
(``results``), a cached tuned lens, the checked-once verdict."""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from ..cache import model_files_digest
from ..errors import EffdepthError
from .layout import Adapter, execution_device


def model_configs(model: nn.Module) -> list:
    """The model's config and each of its sub-configs, once each."""
    configs, found, visited = [model.config], [], set()
    while configs:
        config = configs.pop()
        if id(config) in visited:
            continue
        visited.add(id(config))
        found.append(config)
        configs += [getattr(config, key) for key in getattr(config, "sub_configs", {}) if getattr(config, key, None)]
    return found


def attention_key(model: nn.Module) -> tuple:
    """What the model's attention runs, per config and sub-config: its attention and experts
    implementations and the kernels transformers' registries hold under those names (an entry of
    ``ALL_ATTENTION_FUNCTIONS`` or ``ALL_MASK_ATTENTION_FUNCTIONS`` swapped is another attention)."""
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:  # pragma: no cover - transformers always ships them
        ALL_ATTENTION_FUNCTIONS = ALL_MASK_ATTENTION_FUNCTIONS = {}
    key = []
    for config in model_configs(model):
        implementation = getattr(config, "_attn_implementation", None)
        kernels = (None, None)
        if isinstance(implementation, str):
            kernels = tuple(
                _held(registry.get(implementation))
                for registry in (ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS)
            )
        key.append((implementation, getattr(config, "_experts_implementation", None), kernels))
    return tuple(key)


def _held(obj: object) -> object:
    """``obj`` as a key part that never matches another object: a weak reference (dead once the
    object is freed, so a new object at the same address differs), else the object's id and type."""
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return (id(obj), type(obj))


def _what_checks_see(model: nn.Module, adapter: Adapter | None) -> tuple:
    """What a layout check's outcome depends on, cheaply: the adapter asked for; the config, with
    the attention and experts implementations of it and of each sub-config and the kernels
    registered under those names (``attention_key``; its digest leaves them out); each module's
    settings, class (the class object and its ``forward``, so a class patched or redefined in place
    counts), identity, own or compiled ``forward`` and hooks; torch's global module hooks; every
    weight's storage, dtype and version counter. What these miss (an edit of a module-level function
    the forward calls, a closure cell, a hook's function replaced under its id) the check's canary
    sees (``_check_canary``)."""
    from torch.nn.modules import module as torch_module

    modules = tuple(
        (_held(m), _held(type(m)), _held(type(m).forward), _held(vars(m).get("forward")),
         _held(vars(m).get("_compiled_call_impl")), tuple(m._forward_hooks), tuple(m._forward_pre_hooks))
        for m in model.modules()
    )  # fmt: skip
    global_hooks = (tuple(torch_module._global_forward_hooks), tuple(torch_module._global_forward_pre_hooks))
    implementations = attention_key(model)  # the kernels the registries hold under those names too
    return (adapter, implementations, config_digest(model), weights_state(model), modules, global_hooks)


# --- the canary: identity by recomputation, where a key cannot be complete -----------------------

CANARY_DEFINITION = 3  # bump when the digest changes: a record of another definition reads as from elsewhere


def canary_digest(model: nn.Module, ids: torch.Tensor, final_norm: nn.Module | None = None) -> str:
    """What ``model`` computes now on ``ids`` ``[token]`` (one prompt, unpadded): the sha256 of the
    ids, the final residual h_L (``final_norm``'s input: the norm hides a rescale of it from the
    logits) and the logits at every position, bit for bit. Equal digests on one machine mean the same
    computation, whatever changed: a weight byte, a patched forward, a hook, an attention kernel."""
    import hashlib

    ids = torch.as_tensor(ids).reshape(-1)
    seen: list[torch.Tensor] = []

    def keep(module, args, kwargs):
        seen.append((args[0] if args else next(iter(kwargs.values()))).detach().float().cpu())

    handle = final_norm.register_forward_pre_hook(keep, with_kwargs=True) if final_norm is not None else None
    try:  # not output_hidden_states: transformers records them with hooks it leaves on the model
        with torch.inference_mode():
            out = model(input_ids=ids[None].to(execution_device(model)), use_cache=False, return_dict=True)
    finally:
        if handle is not None:
            handle.remove()
    logits = getattr(out, "logits", None)
    if logits is None or logits.shape[-2] != ids.numel():
        raise EffdepthError(
            f"the canary needs the model's logits at every position of its {ids.numel()} tokens; its forward "
            f"returned {None if logits is None else tuple(logits.shape)}: call it with its default output"
        )
    digest = hashlib.sha256()
    for tensor in (ids.cpu(), *seen[-1:], logits.detach().float().cpu()):
        digest.update(f"{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def canary_where() -> str:
    """Where a canary is computed bit for bit the same: this host, torch, thread count and canary
    definition (another machine's kernels may round otherwise, so a canary recorded elsewhere is not
    compared: what it keys is trusted on its key, as every cached result is)."""
    import socket

    host = socket.gethostname()
    return f"{host} torch {torch.__version__} threads {torch.get_num_threads()} canary {CANARY_DEFINITION}"


def canary_record(model: nn.Module, ids: torch.Tensor, final_norm: nn.Module | None = None) -> dict:
    """The canary as a cache records it: its digest and where it was computed."""
    return {"canary": canary_digest(model, ids, final_norm), "canary_where": canary_where()}


def canary_comparable(record: Mapping | None) -> bool:
    """Whether a recorded canary can be compared bit for bit here (recorded on this machine, with
    this definition); one recorded elsewhere, or none, leaves the cache trusted on its key."""
    record = record or {}
    return isinstance(record.get("canary"), str) and record.get("canary_where") == canary_where()


def _check_canary(model: nn.Module) -> str | None:
    """The canary on the layout check's probe input (9 tokens of ids 1..): a checked-once verdict is
    reused only while it is unchanged, so what fingerprints miss — a forward replaced through a
    closure cell, a hook's function replaced under the same id, a module-level function edited — is
    seen by recomputing. None where the forward fails (the checks then run again)."""
    vocab = int(getattr(model.config, "vocab_size", 8) or 8)
    try:
        return canary_digest(model, torch.arange(9) % max(vocab - 1, 1) + 1)
    except Exception:  # a forward that cannot run here: no canary, so no verdict is reused
        return None


STATE_SAMPLE = 64  # values per tensor summed into its state: cheap at any size


def weights_state(model: nn.Module) -> tuple:
    """Each parameter's and buffer's storage, dtype, in-place version counter and the sum of a
    strided sample of ``STATE_SAMPLE`` of its values: cheap, and changed by any edit of a weight
    through autograd's view (``mul_``, ``copy_``, ``load_state_dict``), a cast (``.to``,
    ``.half()``), and — through the sample — most edits that bypass the counter (``.data.mul_``, a
    numpy write); an edit of a few unsampled values escapes it (a full hash at every call would cost
    seconds per billion weights)."""
    state = []
    for tensor in (*model.parameters(), *model.buffers()):
        flat = tensor.detach().reshape(-1)
        sample = 0.0
        if flat.numel() and flat.device.type != "meta":
            sample = float(flat[:: max(1, flat.numel() // STATE_SAMPLE)][:STATE_SAMPLE].double().sum())
        try:
            version = tensor._version
        except RuntimeError:  # an inference tensor (made under inference_mode) keeps no counter
            version = -1
        state.append((tensor.data_ptr(), tensor.dtype, version, sample))
    return tuple(state)


_CONFIG_IGNORED = ("_name_or_path", "transformers_version", "_commit_hash")  # where it came from, not what it is


_PLAIN = (bool, int, float, str, type(None), torch.dtype)


def _plain(value: object) -> bool:
    return isinstance(value, _PLAIN) or (isinstance(value, tuple | list) and all(isinstance(v, _PLAIN) for v in value))


def module_settings(model: nn.Module) -> list:
    """Each module's class and its own plain settings (``vars`` entries that are numbers, strings,
    dtypes or tuples of them: a norm's ``variance_epsilon``, an attention's ``scaling``,
    a rotary embedding's ``rope_type``), in module order: what a config digest misses when a
    setting is edited on a module in place, or a module is swapped for another class."""
    found = []
    for name, module in model.named_modules():
        settings = sorted(
            (key, repr(value)) for key, value in vars(module).items() if not key.startswith("_") and _plain(value)
        )
        found.append((name, f"{type(module).__module__}.{type(module).__qualname__}", settings))
    return found


def config_digest(model: nn.Module) -> str:
    """The sha256 of a model's full configuration (every field that can change a number: activation,
    norm epsilon, rope, soft-caps, …) and of its modules' own settings (``module_settings``), not
    where it was loaded from."""
    import hashlib
    import json

    config = getattr(model, "config", None)
    fields = config.to_dict() if config is not None and hasattr(config, "to_dict") else {}
    fields = {k: v for k, v in fields.items() if k not in _CONFIG_IGNORED}
    text = json.dumps([fields, module_settings(model)], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def tokenizer_digest(tokenizer: object | None) -> str:
    """The sha256 of what a tokenizer does: a fast tokenizer's whole serialized pipeline, else its
    class, vocabulary and special tokens (None: no tokenizer, token ids only)."""
    import hashlib
    import json

    if tokenizer is None:
        return "none"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        text = backend.to_str()
    else:
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        special = getattr(tokenizer, "special_tokens_map", {})
        text = json.dumps([type(tokenizer).__name__, sorted(vocab.items()), special], sort_keys=True, default=repr)
    extra = [getattr(tokenizer, name, None) for name in ("add_bos_token", "add_eos_token", "padding_side")]
    return hashlib.sha256((text + json.dumps(extra, default=repr)).encode()).hexdigest()


def user_hooks(model: nn.Module) -> str | None:
    """Where a hook is registered on the model (``"layers.3 (forward)"``), or None: a hook can change
    every number a probe reads, and nothing about it can be keyed."""
    import torch.nn.modules.module as module_state

    kinds = {
        "forward": "_forward_hooks",
        "forward pre": "_forward_pre_hooks",
        "backward": "_backward_hooks",
        "backward pre": "_backward_pre_hooks",
    }
    for name, module in model.named_modules():
        for kind, attribute in kinds.items():
            if any(not _library_hook(hook) for hook in (getattr(module, attribute, None) or {}).values()):
                return f"{name or 'the model'} ({kind} hook)"
        if "forward" in vars(module) and not _placement_only(module):  # forward replaced on the instance
            return f"{name or 'the model'} (its forward replaced)"
    for kind, attribute in {"forward": "_global_forward_hooks", "forward pre": "_global_forward_pre_hooks",
                            "backward": "_global_backward_hooks",
                            "backward pre": "_global_backward_pre_hooks"}.items():  # fmt: skip
        if getattr(module_state, attribute, None):
            return f"every module (a global {kind} hook)"
    return None


PLACEMENT_HOOKS = ("AlignDevicesHook", "CpuOffload", "UserCpuOffloadHook")  # accelerate's device_map dispatch


def _placement_only(module: nn.Module) -> bool:
    """Whether a module's replaced forward is accelerate's device placement (``device_map``) and
    nothing else: its ``_hf_hook`` moves tensors between devices, it computes nothing."""
    hook = getattr(module, "_hf_hook", None)
    hooks = getattr(hook, "hooks", (hook,)) if hook is not None else ()
    return bool(hooks) and all(type(h).__name__ in PLACEMENT_HOOKS for h in hooks)


LIBRARY_HOOKS = ("transformers.", "accelerate.")  # their hooks record outputs or place tensors


@functools.cache
def _library_roots() -> tuple[Path, ...]:
    """The folders of the packages whose hooks are machinery (``LIBRARY_HOOKS``) where installed."""
    import importlib.util

    roots = []
    for package in LIBRARY_HOOKS:
        spec = importlib.util.find_spec(package.rstrip("."))
        if spec is not None and spec.origin:
            roots.append(Path(spec.origin).resolve().parent)
    return tuple(roots)


def _library_hook(hook: object) -> bool:
    """Whether a hook is transformers' or accelerate's own machinery (transformers 5 records
    ``output_hidden_states`` through forward hooks it leaves on every layer), not a user's: judged
    by the file its code is in — a name or ``__module__`` can claim anything."""
    function = getattr(hook, "func", hook)  # a functools.partial
    call = type(function).__call__ if callable(function) else None  # a callable object's method
    code = getattr(function, "__code__", None) or getattr(call, "__code__", None)
    filename = getattr(code, "co_filename", None)
    if not filename:
        return False
    where = Path(filename).resolve()
    return any(where.is_relative_to(root) for root in _library_roots())


def model_fingerprint(loaded: Wrapped) -> str:
    """What keys a run of a model given in memory: the sha256 of its weights (``weights_fingerprint``),
    its full configuration (``config_digest``), its tokenizer (``tokenizer_digest``) and the layout
    the probes read it by (the adapter's module names and scales: another adapter reads other writes)."""
    import hashlib
    import json

    layout = {  # every field of the adapter; its callables by the values they give this model
        field.name: getattr(loaded.adapter, field.name) for field in dataclasses.fields(loaded.adapter)
    }
    layout.update(write_scale=loaded.write_scale, logit_scale=loaded.logit_scale)
    parts = (
        weights_fingerprint(loaded),
        config_digest(loaded.model),
        tokenizer_digest(loaded.tokenizer),
        hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest(),
    )
    return hashlib.sha256(":".join(parts).encode()).hexdigest()


def weights_fingerprint(loaded: Wrapped) -> str:
    """The sha256 of a model's parameters and buffers (names, dtypes, shapes and bytes): what keys a
    run of a model given in memory, whose name says nothing of its weights."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in [*loaded.model.named_parameters(), *loaded.model.named_buffers()]:
        data = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)};".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


class Wrapped(Protocol):
    """What identity reads of a ``LoadedModel`` (``wrapping.LoadedModel``, which sits above this module)."""

    model: nn.Module
    tokenizer: object | None
    adapter: Adapter
    write_scale: float | None
    logit_scale: float | None
    source: str | None
    source_sha256: str | None
    loaded_weights: tuple | None
    loaded_config: str | None
    loaded_tokenizer: object | None

    @property
    def dtype(self) -> torch.dtype: ...


def is_as_loaded(loaded: Wrapped, spec: str, dtype: torch.dtype) -> bool:
    """Whether ``loaded`` is exactly what ``load_model(spec)`` gives in ``dtype``, untouched since: only
    then may it be keyed by where it came from (``source_identity``); any other model — load_model's
    other arguments, a weight or a config field edited in place, a cast, another tokenizer — is keyed
    by what it is (``model_fingerprint``)."""
    return (
        loaded.source == spec
        and loaded.dtype == dtype
        and loaded.loaded_weights is not None
        and weights_state(loaded.model) == loaded.loaded_weights
        and loaded.loaded_config == config_digest(loaded.model)
        and loaded.loaded_tokenizer is loaded.tokenizer
    )


def source_identity(spec: str, pinned_sha256: str | None = None, revision: str | None = None) -> dict:
    """What pins a model by where it comes from: an offline alias by its pinned sha256
    (``pinned_sha256``, the zoo's), a folder or GGUF file by every file's sha256 (a change to any is
    another model), a hub id by its revision."""
    from ..paths import names_path

    if pinned_sha256 is not None:
        return {"alias": spec, "sha256": pinned_sha256}
    path = names_path(spec) or Path(spec).expanduser()
    if path.exists():
        return {"path": str(path.resolve()), "files_sha256": model_files_digest(path)}
    return {"hub": spec, "revision": revision}


def model_identity(spec: str, loaded: Wrapped) -> dict:
    """A model's identity for every route: where ``load_model(spec)`` took it from
    (``source_identity``: an alias's pinned sha256, recorded when it loaded, a path's files, a hub
    revision) when it is exactly that model (``is_as_loaded``), else what it is in memory
    (``model_fingerprint``: a model built or edited in memory, another tokenizer, a name that says
    nothing). The tuned-lens cache keys by it."""
    if not is_as_loaded(loaded, spec, loaded.dtype):
        return {"in_memory": model_fingerprint(loaded)}
    return source_identity(spec, loaded.source_sha256, getattr(loaded.model.config, "_commit_hash", None))


def run_weights(loaded: Wrapped, spec: str, dtype: torch.dtype, canary: str | None = None) -> str | None:
    """What a run's key adds for a model given in memory: None where it is exactly what
    ``load_model(spec)`` gives (the run is keyed by the name, whose files the settings hash), else
    its ``model_fingerprint`` — with, where given, the ``canary`` (what it computes now, beyond what
    its weights and config say)."""
    import hashlib

    weights = None
    if canary is not None or not is_as_loaded(loaded, spec, dtype):
        weights = model_fingerprint(loaded)
    if canary is not None:
        weights = hashlib.sha256(f"{weights}:canary:{canary}".encode()).hexdigest()
    return weights
