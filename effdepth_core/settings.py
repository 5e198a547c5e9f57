"""A run's settings, their checks and their cache key (and the cross-model map's settings).

``RunSettings`` holds the settings every run has (``CORE_SETTINGS``) and, as attributes of the same
object, every registered probe's options (``registry.py``): ``RunSettings("smollm2-135m",
"gsm8k", igrad_tol=0.02)``. The cache key hashes what changes the numbers; ``COMPATIBILITY`` lists,
in one place, the exceptions that keep results cached by earlier versions loading unchanged.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import __version__
from .errors import EffdepthError, OptionError
from .measurement import registry
from .measurement.probes.spec import CORE_SETTINGS, ProbeSpec, spelled
from .options import CORE_OPTIONS, MAP_OPTIONS, MAX_GENERATED
from .paths import NAME_BYTES, exists, names_path, short_name  # noqa: F401 (NAME_BYTES: part of this module's API)
from .task_loading import check_task, count_examples
from .tasks import ANSWER_FORMAT, ARITHMETIC, DEFAULT_N, TASKS

CORE_DEFAULTS: dict[str, Any] = {
    "n": None,
    "seed": 0,
    "source": "local",
    "level": None,
    "digits": 6,
    "max_tokens": None,  # drop longer prompts (aime24 defaults to 400, as in the paper)
    "positions": None,  # measure each text's first N tokens only (the exact length control)
    "device": "auto",
    "dtype": "auto",
    "batch_size": 4,
    "method": "fast",  # "slow": the one-forward-per-intervention oracles (same numbers)
    "device_map": None,
    "progress": True,
}
assert tuple(["model", "task", *CORE_DEFAULTS]) == CORE_SETTINGS
assert all(CORE_DEFAULTS[name] == option.default for name, option in CORE_OPTIONS.items() if name != "n")
_NOT_IN_KEY = ("device", "batch_size", "progress", "method", "device_map")  # how, not what, is computed
_KEYED_WHEN_SET = ("positions",)  # core settings added after the first release: old keys stay

# The cache key's compatibility exceptions: every rule that keeps an older version's key, and every
# deliberate break. tests/test_settings.py loads a run directory written before the probe registry
# (tests/data/legacy-run) and checks its key and numbers are unchanged.
COMPATIBILITY: tuple[tuple[str, str], ...] = (
    (
        "first-release options",
        "top_k, skip_positions, skip_parts, igrad_steps, igrad_quadrature and igrad_baseline enter every key "
        "(Option.key = KEY_ALWAYS); every option added since enters it only when set to other than its default "
        "(KEY_WHEN_SET), so adding an option or a probe never changes an existing key; so does the core "
        "setting positions",
    ),
    ("shown, not computed", "device, batch_size, progress, method, device_map and the ED thresholds never enter it"),
    ("dtype", "--dtype auto adds `auto:<dtype>` only when it resolves to other than float32 (older keys: CPU runs)"),
    ("device type", "a run on other than the CPU adds `device_type` (GPU kernels round otherwise)"),
    (
        "resolved options",
        "an option that resolves on the machine (head_dtype auto: bfloat16 where the hardware has fast bfloat16) "
        "enters the keys as what it resolves to, and only when that differs from what runs computed before it "
        "(head_dtype: float32), so float32 runs keep their keys; a record written before the option read back "
        "(RunSettings.recorded) takes that value",
    ),
    ("task files", "a task file adds the sha256 of its content (`task_sha256`)"),
    (
        "model paths",
        "a local model adds its resolved path (`model_path`) and, since run-directory format 2, the sha256 of "
        "each of its files (`model_files`): results of local models cached before format 2 are recomputed once "
        "(their weights were not fingerprinted)",
    ),
    (
        "run-directory format 1",
        "directories written before format 2 carry no sha256 per file: they are read after structural checks "
        "alone and never serve as donors of examples to a larger run",
    ),
)


def _default_n(task: str) -> int:
    """The examples a run takes when no ``n`` is given: ``DEFAULT_N`` of a data set, every line of a
    user's ``.jsonl`` file (``DEFAULT_N`` where the file cannot be read: its check says why)."""
    if task in TASKS:
        return DEFAULT_N
    try:
        return count_examples(task)
    except (OSError, EffdepthError, ValueError):
        return DEFAULT_N


def names_of(text: str) -> list[str]:
    """The names in a comma list (spaces around them ignored)."""
    return [name.strip() for name in str(text).split(",") if name.strip()]


class RunSettings:
    """Everything that determines a run's numbers (and so its cache key), plus how to show it.

    Core settings are ``CORE_SETTINGS``; every registered probe's options are attributes too, with
    their spec's defaults."""

    __slots__ = ("_options", *CORE_SETTINGS)

    def __init__(self, model: str, task: str, **values: Any):
        known = registry.options()
        unknown = sorted(set(values) - set(CORE_DEFAULTS) - set(known))
        if unknown:
            raise TypeError(f"RunSettings got unknown setting(s) {', '.join(unknown)}")
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "task", task)
        for name, default in CORE_DEFAULTS.items():
            object.__setattr__(self, name, values.get(name, default))
        if self.n is None:  # 10 of a data set, every line of a user's file (as load_task and --n)
            object.__setattr__(self, "n", _default_n(task))
        options = {}
        for name, option in known.items():
            value = values.get(name, option.default)
            options[name] = option.normalize(value) if option.normalize else value
        object.__setattr__(self, "_options", options)

    def __getattr__(self, name: str) -> Any:
        options = object.__getattribute__(self, "_options")
        if name in options:
            return options[name]
        if name in registry.options():  # a probe registered after these settings were made
            return registry.options()[name].default
        raise AttributeError(f"RunSettings has no setting {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in CORE_SETTINGS:
            object.__setattr__(self, name, value)
        elif name in registry.options():
            option = registry.options()[name]
            self._options[name] = option.normalize(value) if option.normalize else value
        else:
            raise AttributeError(f"RunSettings has no setting {name!r}")

    def __reduce__(self):  # pickling (worker processes, Ray): rebuilt from its values
        values = self.as_dict()
        return (_rebuild, (values,))

    @classmethod
    def recorded(cls, values: Mapping[str, Any]) -> RunSettings:
        """The settings a run's ``metadata.json`` records (``numbers()``), as that run computed: an
        option that resolves on the machine and is missing from an older record takes its
        ``key_absent`` (head_dtype: float32, what every run multiplied in before the option)."""
        values = {k: v for k, v in values.items() if k != "progress"}
        for name, option in registry.options().items():
            if option.resolve is not None and name not in values:
                values[name] = option.key_absent
        return cls(values.pop("model"), values.pop("task"), **values)

    def as_dict(self) -> dict[str, Any]:
        """Every setting by name: the core ones, then each probe option."""
        core = {name: getattr(self, name) for name in CORE_SETTINGS}
        options = {name: getattr(self, name) for name in registry.options()}
        return {**core, **options}

    def replace(self, **changes: Any) -> RunSettings:
        values = {**self.as_dict(), **changes}
        return RunSettings(values.pop("model"), values.pop("task"), **values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunSettings) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash(json.dumps(self.as_dict(), sort_keys=True, default=str))

    def __repr__(self) -> str:
        defaults = {"n": _default_n(self.task)}
        changed = {
            k: v for k, v in self.as_dict().items() if k in ("model", "task") or v != defaults.get(k, _default(k))
        }
        return f"RunSettings({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    # --- the cache key ---------------------------------------------------------------------------

    def _base_fields(self, by_name: bool = True) -> dict:
        """What pins the examples and the model, whatever the probes (not ``n``; see COMPATIBILITY).
        ``by_name=False``: the model was given in memory and is keyed by its content, which the
        caller adds; its label (``model``) is then left out, so a renamed model shares its cache."""
        fields = {k: getattr(self, k) for k in CORE_SETTINGS if k not in _NOT_IN_KEY}
        for name in _KEYED_WHEN_SET:
            if fields[name] == CORE_DEFAULTS[name]:
                del fields[name]
        if not by_name:
            del fields["model"]
        task_path = names_path(self.task) if self.task not in TASKS else None  # a built-in task, never a file
        if task_path is not None and exists(task_path, "file"):
            fields["task_sha256"] = hashlib.sha256(task_path.read_bytes()).hexdigest()
        model_path = names_path(self.model) if by_name else None
        if model_path is not None:  # a path: the same spelling elsewhere is another model
            from .cache import model_files_digest

            fields["model_path"] = str(model_path.resolve())
            fields["model_files"] = model_files_digest(model_path)
        from .models import resolve_device, resolve_dtype

        try:
            device = resolve_device(self.device)
        except EffdepthError:
            device = "cpu"  # an unusable device is refused before the run starts
        if self.dtype == "auto":  # the dtype it resolves to changes the numbers (bf16 on a GPU)
            resolved = str(resolve_dtype("auto", device)).removeprefix("torch.")
            if resolved != "float32":
                fields["dtype"] = f"auto:{resolved}"
        import torch

        device_type = "cuda" if self.device_map and torch.cuda.is_available() else torch.device(device).type
        if device_type != "cpu":
            fields["device_type"] = device_type
        fields["version"] = __version__
        return fields

    def base_fields(self, by_name: bool = True) -> dict:
        """What pins the examples and the model (the task file's and model folder's content read
        now): computed once per run and passed to ``key_fields``/``probe_key``, so every key of the
        run is of the same bytes."""
        return self._base_fields(by_name)

    def key_fields(self, by_name: bool = True, base: Mapping | None = None) -> dict:
        """The fields the run's key hashes (COMPATIBILITY says which and why); ``base``: the run's
        ``base_fields`` (read now when not given)."""
        fields = dict(base) if base is not None else self._base_fields(by_name)
        for name, option in registry.options().items():
            enters, value = option.keyed(getattr(self, name), self)
            if enters:
                fields[name] = value
        return fields

    def key(self, by_name: bool = True) -> str:
        """Hash of the settings that change a run's numbers (not device, batch size, or display)."""
        return hashlib.sha256(json.dumps(self.key_fields(by_name), sort_keys=True).encode()).hexdigest()[:16]

    def probe_key(
        self, spec: ProbeSpec, identity: Mapping | None = None, by_name: bool = True, base: Mapping | None = None
    ) -> str:
        """Hash of what one probe's per-example rows depend on: the examples' source and the model
        (not ``n``), the probe's options and revision, and its ``identity`` (a tuned lens's sha256).
        Two runs with equal probe keys and a common first k examples share those examples' rows."""
        base = {k: v for k, v in (base if base is not None else self._base_fields(by_name)).items() if k != "n"}
        keyed = {o.name: o.keyed(getattr(self, o.name), self, probe=True) for o in spec.options}
        options = {name: value for name, (enters, value) in keyed.items() if enters}
        payload = {"base": base, "probe": spec.name, "revision": spec.revision, "options": options}
        if spec.needs_answers:  # which tokens are the answer changes its numbers
            payload["answer_format"] = ANSWER_FORMAT
        if identity:
            payload["identity"] = dict(identity)
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def numbers(self) -> dict:
        """The settings as stored in ``metadata.json`` (display-only fields left out)."""
        return {k: v for k, v in self.as_dict().items() if k != "progress"}


def _rebuild(values: dict) -> RunSettings:
    values = dict(values)
    return RunSettings(values.pop("model"), values.pop("task"), **values)


def _default(name: str) -> Any:
    if name in CORE_DEFAULTS:
        return CORE_DEFAULTS[name]
    option = registry.options().get(name)
    return option.default if option else None


def setting_names() -> list[str]:
    """Every setting a task spec (params/) or ``RunSettings`` may name, but model and task."""
    return [*CORE_DEFAULTS, *registry.options()]


def parse_probes(probes: str | Sequence[str], settings: RunSettings | None = None) -> list[str]:
    """The probe names to run, each spec's ``expand`` applied (``--lens tuned`` turns the logit
    lens into the tuned lens); one-line error for an unknown name or an empty list."""
    names = [p.strip() for p in probes.split(",")] if isinstance(probes, str) else [str(p) for p in probes]
    names = [p for p in names if p]
    known = registry.names()
    unknown = [p for p in names if p not in known]
    if unknown or not names:
        raise EffdepthError(f"unknown probe(s) {', '.join(unknown) or '(none given)'}; available: {', '.join(known)}")
    expanded: list[str] = []
    for name in names:
        spec = registry.get(name)
        expanded += spec.expand(settings) if spec.expand and settings is not None else [name]
    return list(dict.fromkeys(expanded))


def check_settings(settings: RunSettings, probes: Sequence[str], facts: Mapping[str, Any] | None = None) -> None:
    """One-line errors for values that cannot work, found before any model loads (``facts``: what
    is known of the model already: ``vocab_size``, ``n_layers``)."""
    facts = dict(facts or {})
    for name in ("model", "task"):  # what a run records, effdepth table must be able to show (display.py)
        value = getattr(settings, name)
        if not isinstance(value, str) or not value.isprintable():
            raise OptionError(
                f"{name} {value!r} holds a character no record can show (a tab, newline, escape or direction "
                f"mark): rename the {'file or folder' if '/' in str(value) else name} to printable characters"
            )
    for name, option in CORE_OPTIONS.items():  # each core setting's type and bounds, declared once
        option.check(getattr(settings, name))
    if settings.task in ARITHMETIC and settings.n > MAX_GENERATED:
        raise OptionError(
            f"{spelled('n', settings.n)} is more {settings.task} problems than a run can probe; use "
            f"{spelled('n', MAX_GENERATED)} or fewer"
        )
    from .models import resolve_device

    resolve_device(settings.device)  # a device torch cannot name or does not have
    check_task(settings.task)
    if settings.max_tokens is not None and settings.task in ARITHMETIC:
        raise EffdepthError(
            f"{spelled('max_tokens')} applies to data-set tasks, not {settings.task} (its prompts are short)"
        )
    if settings.positions is not None and settings.task in ARITHMETIC:
        raise OptionError(
            f"{spelled('positions')} applies to data-set tasks, not {settings.task} (its prompts are a few tokens)"
        )
    if settings.level is not None and settings.task != "math":
        raise OptionError(f"{spelled('level')} applies to the math task only, not {settings.task!r}")
    for name in probes:
        spec = registry.get(name)
        for option in spec.options:
            option.check(getattr(settings, option.name))
        if spec.check is not None:
            spec.check(settings, facts)


def slug(text: str) -> str:
    """A file-name-safe form of a model or task spec (never hidden: no leading dot): a path by its
    own name — a file's stem, a folder's name (a ``dequantized-*`` folder by its model's) — not the
    whole path; at most ``NAME_BYTES`` bytes."""
    path = names_path(text) or Path(text)
    is_path, is_file = "/" in text and (exists(path) or text.startswith(("/", "~", "."))), exists(path, "file")
    if is_path:
        name = path.parent.name if path.name.startswith("dequantized-") else path.stem if is_file else path.name
    else:
        name = Path(text).stem if text.endswith((".jsonl", ".gguf")) else text
    return short_name(re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_.") or "model", text)


def run_name(settings: RunSettings) -> str:
    """``<task>-n<N>-seed<S>[-level<l>][-digits<d>][-pos<p>]``: a run directory's name without its key."""
    name = f"{slug(settings.task)}-n{settings.n}-seed{settings.seed}"
    if settings.level is not None:
        name += f"-level{settings.level}"
    if settings.task in ARITHMETIC:
        name += f"-digits{settings.digits}"
    if settings.positions is not None:
        name += f"-pos{settings.positions}"
    return name


def default_out_dir(
    settings: RunSettings, root: Path | str = "results", hashed: bool = True, key: str | None = None
) -> Path:
    """``results/<model>/<task>-n<N>-seed<S>[-level<l>][-digits<d>]-<key>``: the short key hash makes
    the name differ whenever anything that changes the numbers differs (a task file's content, a
    model's files, ``--top-k``, ``--dtype``, ``--max-tokens``, …). ``hashed=False`` leaves it out
    (the book's results tree, whose parameters live in params/)."""
    name = run_name(settings)
    key = (key or settings.key())[:8]
    leaf = f"{short_name(name, settings.task)}-{key}" if hashed else short_name(name, settings.task)
    return Path(root) / slug(settings.model) / leaf


# bump when the same map settings give other numbers (2: the self-map check fits without a ridge;
# 3: the ridge is a share of each dimension's Gram diagonal entry, not of their mean)
MAP_REVISION = 3


@dataclass
class MapSettings:
    """A cross-model linear map (method.md §7): two models sharing a tokenizer and one task's prompts,
    split into ``n`` test prompts, ``n_validation`` prompts that choose each map's ridge, and training
    prompts until they hold ``tokens_per_width`` × the small model's width tokens. A fixed ``ridge``
    (an absolute penalty) skips the validation and fits on the first half of ``n`` prompts, testing on
    the rest (the map of effdepth before the measurement)."""

    small: str
    big: str
    task: str = "gsm8k"
    n: int = 20
    n_validation: int = 10
    tokens_per_width: int = 10
    seed: int = 0
    digits: int | None = None
    max_tokens: int | None = None
    ridge: float | None = None
    device: str = "auto"
    dtype: str = "auto"
    progress: bool = True

    def task_options(self, n: int | None = None) -> dict:
        return dict(n=self.n if n is None else n, seed=self.seed, digits=self.digits or 6, max_tokens=self.max_tokens)

    def check(self) -> None:
        """One-line errors for everything that can be checked before a model loads."""
        from .models import preflight_model
        from .task_loading import load_task

        for name, option in MAP_OPTIONS.items():  # each number's type and bounds, declared once
            option.check(getattr(self, name))
        check_task(self.task)
        if self.digits is not None and self.task not in ARITHMETIC:
            raise EffdepthError(f"--digits applies to addition and multiplication only, not {self.task!r}")
        if self.max_tokens is not None and self.task in ARITHMETIC:
            raise EffdepthError(f"--max-tokens applies to data-set tasks, not {self.task} (its prompts are short)")
        for spec in (self.small, self.big):
            preflight_model(spec)
        load_task(self.task, **self.task_options())  # the task and n
        size = self.pool_size()
        held = self.n + (self.n_validation if self.ridge is None else 0)
        if self.ridge is None and size is not None and held >= size:
            raise EffdepthError(
                f"--n {self.n} test and --n-validation {self.n_validation} prompts take all {size} prompts of "
                f"{self.task}, leaving none to fit the map on: lower them (their sum below {size})"
            )

    def pool_size(self) -> int | None:
        """How many prompts the task has (None: a generated task, as many as asked)."""
        from .task_loading import task_pool

        return None if self.task in ARITHMETIC else len(task_pool(self.task))

    def name(self) -> str:
        """A run directory name that spells every setting that changes the numbers (and the key)."""
        name = f"{slug(self.small)}--{slug(self.big)}-{slug(self.task)}-n{self.n}-seed{self.seed}"
        if self.task in ARITHMETIC:
            name += f"-digits{self.digits or 6}"
        if self.max_tokens:
            name += f"-max{self.max_tokens}"
        if self.ridge is not None:
            name += f"-ridge{self.ridge:g}"
        return f"{short_name(name, f'{self.small}--{self.big}--{self.task}')}-{self.key()[:8]}"

    def key(self) -> str:
        fields = {k: v for k, v in asdict(self).items() if k not in ("device", "progress")}
        for name in ("small", "big"):
            path = names_path(getattr(self, name))  # None: a name, or one no file system could hold
            if path is not None:
                from .cache import model_files_digest

                fields[f"{name}_files"] = model_files_digest(path)
        fields["version"] = __version__
        fields["answer_format"] = ANSWER_FORMAT
        fields["map_revision"] = MAP_REVISION
        return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]
