"""The models API in one place, re-exported from the modules that do each job: the layout and the
adapter table (``measurement.layout``, ``measurement.adapters``), the load-time checks (``measurement.checks``), a
model's identity (``measurement.identity``), a model in memory made measurable (``measurement.wrapping``) and
loading by name (``loading``). Import from here or from the module itself."""

from __future__ import annotations

from .cache import file_hashes, model_files_digest  # noqa: F401 (a model's files, hashed by the cache)
from .loading import (  # noqa: F401
    check_device,
    load_model,
    preflight_model,
    quiet_libraries,
    resolve_device,
    resolve_dtype,
)
from .measurement.adapters import (  # noqa: F401
    ADAPTERS,
    MAX_CANDIDATES,
    infer_adapter,
    supported_model_types,
)
from .measurement.checks import (  # noqa: F401
    KEY_SELECTION_FIELDS,
    PADDING_NOISE_FACTOR,
    PADDING_TOLERANCE,
    LayoutCheck,
    arguments_by_name,
    key_selection,
    layout_check,
    mixer_kind,
    named_arguments,
    pads_safely,
    sublayer_write,
    verify_adapter,
)
from .measurement.identity import (  # noqa: F401
    LIBRARY_HOOKS,
    PLACEMENT_HOOKS,
    STATE_SAMPLE,
    Wrapped,
    attention_key,
    config_digest,
    is_as_loaded,
    model_configs,
    model_fingerprint,
    model_identity,
    module_settings,
    run_weights,
    source_identity,
    tokenizer_digest,
    user_hooks,
    weights_fingerprint,
    weights_state,
)
from .measurement.layout import (  # noqa: F401
    Adapter,
    decoder_stack,
    execution_device,
    residual_scale,
    write_modules,
)
from .measurement.wrapping import (  # noqa: F401
    LoadedModel,
    as_the_caller_had,
    check_tokenizer,
    readable_name,
    takes_plain_models,
    truncate_layers,
    with_tokenizer,
    wrap_model,
)
