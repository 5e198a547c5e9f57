"""Loading a model by name: devices and dtypes, the checks that need no weights (``preflight_model``),
and ``load_model`` (an offline alias, a folder, a GGUF or a hub id, resolved by ``acquire``, then wrapped)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from .acquire import hub_error, resolve_model, save_dequantized
from .cache import read_json
from .devices import check_device, resolve_device, resolve_dtype  # noqa: F401 (this module's API)
from .errors import EffdepthError, ModelNotFoundError, UnsupportedModelError
from .measurement.adapters import _REJECTED, _unsupported_message
from .measurement.identity import config_digest, weights_state
from .measurement.wrapping import LoadedModel, wrap_model
from .paths import exists, user_path
from .zoo import ZOO, is_gguf


def _check_config(source: str, name: str, **kwargs) -> None:
    """Fail early, with a clear message, on an architecture the probes do not support."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, **kwargs)
    model_type = str(getattr(config, "model_type", "unknown"))
    if model_type in _REJECTED or getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(_unsupported_message(model_type, name))


def quiet_libraries(progress: bool = True) -> None:
    """Keep library warnings (config checks, hub retries) out of effdepth's own messages, and
    transformers' loading bars too when ``progress`` is off."""
    import logging
    import os

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    if not progress:
        hf_logging.disable_progress_bar()
        os.environ["TQDM_DISABLE"] = "1"  # loaders that use tqdm directly (GGUF dequantization)


@contextlib.contextmanager
def _loading_bars(progress: bool):
    """transformers' own loading bar ("Loading weights") only when ``progress``; the caller's
    setting is put back afterwards."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    if not progress and was_on:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not progress and was_on:
            hf_logging.enable_progress_bar()


def _looks_like_path(spec: str) -> bool:
    return Path(spec).suffix == ".gguf" or spec.startswith((".", "/", "~")) or spec.count("/") > 1


def preflight_model(spec: str) -> dict:
    """Check, without loading weights, that ``spec`` can name a model; returns what is known of it
    already (``vocab_size``, ``n_layers``, ``model_type``; None where only loading tells)."""
    aliases = ", ".join(ZOO)
    if spec in ZOO:
        entry = ZOO[spec]
        return {"vocab_size": entry.vocab_size, "n_layers": entry.n_layers, "model_type": None}
    path = user_path(spec)
    if exists(path, "dir"):
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ModelNotFoundError(f"directory {spec!r} has no config.json; is it a Hugging Face model folder?")
        try:
            config = read_json(config_path, what="model config")
        except (OSError, ValueError, EffdepthError) as exc:
            raise ModelNotFoundError(f"{config_path} is not a readable JSON model config ({exc})") from exc
        if not isinstance(config, dict):
            raise ModelNotFoundError(f"{config_path} is not a JSON object; is {spec!r} a Hugging Face model folder?")
        model_type = str(config.get("model_type", "unknown"))
        if model_type in _REJECTED or config.get("is_encoder_decoder"):  # others: inferred and verified at load
            raise UnsupportedModelError(_unsupported_message(model_type, spec))
        vocab, layers = config.get("vocab_size"), config.get("num_hidden_layers")
        return {
            "vocab_size": vocab if isinstance(vocab, int) else None,
            "n_layers": layers if isinstance(layers, int) else None,
            "model_type": model_type,
        }
    if path.is_file():
        if not is_gguf(path):
            raise ModelNotFoundError(
                f"{spec!r} is a file but not a GGUF model (no GGUF header); pass a .gguf file, a Hugging Face "
                f"model folder, an offline alias ({aliases}) or a hub id"
            )
        return {"vocab_size": None, "n_layers": None, "model_type": None}
    if path.exists():
        raise ModelNotFoundError(f"{spec!r} is neither a model file nor a model folder")
    if _looks_like_path(spec):
        raise ModelNotFoundError(f"no such model file or directory: {spec!r}. Offline aliases: {aliases}")
    return {"vocab_size": None, "n_layers": None, "model_type": None}  # a hub id: only loading tells


def load_model(
    spec: str,
    device: str = "auto",
    dtype: str | torch.dtype = "auto",
    device_map: str | dict[str, str | int] | None = None,
    progress: bool = True,
    cached_weights: bool = True,
    max_memory: dict[str | int, int | str] | None = None,
    offload_folder: str | Path | None = None,
    tokenizer: object | None = None,
    **from_pretrained: object,
) -> LoadedModel:
    """Load ``spec``: an offline alias (see ``effdepth models``), a local HF directory, a ``.gguf``
    file, or a Hugging Face hub id. ``device_map="auto"`` spreads a large model over devices (with
    ``max_memory`` per device and ``offload_folder`` for the layers that fit nowhere: accelerate).
    A GGUF model is parsed and dequantized once: its weights are cached as safetensors (per dtype,
    next to the GGUF; ``acquire.dequantized_dir``) and later loads read them (``cached_weights=False``
    parses the GGUF again). Where the weights come from is ``acquire.resolve_model``'s to say.
    ``tokenizer``: a tokenizer, or where to load one from (a folder without tokenizer files);
    ``from_pretrained``: passed to transformers (``revision``, ``trust_remote_code``, ``token``,
    ``attn_implementation``, ``quantization_config``…; the tokenizer gets the hub ones).

    Args:
        spec: what to load, as above.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``.
        dtype: ``"auto"`` (bfloat16 on a GPU, float32 on a CPU), a name (``"float16"``…) or a dtype.
        device_map, max_memory, offload_folder: accelerate's placement, as above.
        progress: show download and dequantization progress.
        cached_weights: read a GGUF's dequantized safetensors when they exist.
        tokenizer: as above.
        **from_pretrained: as above.

    Returns:
        The ``LoadedModel`` (verified layout, tokenizer, name).

    Raises:
        EffdepthError: a spec that names nothing loadable, or an architecture that is refused.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    tokenizer_given = tokenizer is not None
    preflight_model(spec)
    name = spec
    path = user_path(spec)
    resolved = resolve_model(spec, torch_dtype, cached_weights and device_map is None, progress)
    source, kwargs = resolved.source, resolved.kwargs
    hub = {k: v for k, v in from_pretrained.items() if k in ("revision", "trust_remote_code", "token", "cache_dir")}
    try:
        _check_config(source, name, **kwargs, **hub)
        load_kwargs = dict(kwargs, dtype=torch_dtype, **from_pretrained)
        if device_map is not None:
            load_kwargs["device_map"] = device_map
            if max_memory is not None:
                load_kwargs["max_memory"] = max_memory
            if offload_folder is not None:
                load_kwargs["offload_folder"] = str(offload_folder)
        with _loading_bars(progress):
            model = AutoModelForCausalLM.from_pretrained(source, **load_kwargs)
        if tokenizer is None or isinstance(tokenizer, str | Path):
            where = str(tokenizer) if tokenizer is not None else source
            try:
                tokenizer = AutoTokenizer.from_pretrained(where, **(kwargs if tokenizer is None else {}), **hub)
            except Exception as exc:  # a folder without tokenizer files: one line, and the way out
                raise ModelNotFoundError(
                    f"cannot load a tokenizer for {spec!r} from {where} ({type(exc).__name__}); pass "
                    "tokenizer= (a tokenizer, or the folder or hub id to load one from)"
                ) from exc
    except (UnsupportedModelError, ModelNotFoundError):
        raise
    except Exception as exc:  # loaders raise many types for a broken file; all mean "not loadable"
        if source == spec and not path.exists():
            raise hub_error(spec, exc) from exc
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ModelNotFoundError(f"cannot load model {spec!r} ({type(exc).__name__}: {first_line})") from exc
    if resolved.keep_in is not None:
        folder, sha256 = resolved.keep_in
        save_dequantized(model, tokenizer, folder, torch_dtype, sha256)
    if device_map is None:
        model = model.to(device)
    loaded = wrap_model(model, tokenizer, name=name)
    # the name says what was loaded only with load_model's defaults: another revision, tokenizer or
    # transformers argument (quantization, attention kernel) is another model, keyed by its weights
    loaded.source = spec if not from_pretrained and not tokenizer_given else None
    loaded.source_sha256 = ZOO[spec].sha256 if spec in ZOO else None  # an alias is pinned (identity.source_identity)
    loaded.loaded_weights = weights_state(model)
    loaded.loaded_config = config_digest(model)
    loaded.loaded_tokenizer = tokenizer
    return loaded
