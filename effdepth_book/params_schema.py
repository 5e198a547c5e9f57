"""The schema of ``params/``: what each file may hold, checked before any work (``effdepth grid``,
``effdepth book``, ``--print-params`` alike). A file is read as a bounded regular file of UTF-8 text,
its YAML may not expand (aliases) beyond ``MAX_VALUES`` values, and every key must be one the file's
place allows, with a value of the right type and within what a cell can use. Errors name
``params/<file>``, the key's path and the fix, in one line."""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from effdepth_core.cache import NotARegularFile, read_regular
from effdepth_core.errors import EffdepthError
from effdepth_core.options import CORE_OPTIONS
from effdepth_core.paths import NAME_BYTES

MAX_BYTES = 1 << 20  # a parameter file is a few KB; a larger one is not one
MAX_VALUES = 100_000  # values after expanding YAML aliases (a billion-laughs file expands to 10^9)
MAX_N = 100_000  # what `effdepth run --n` allows on generated tasks
MAX_SEED = 2**63 - 1
PROFILES = ("quick", "full")
# page parameters every section's template has that params/ never set (effdepth book fills them)
FILLED = frozenset({"profile", "tasks_by_model", "causal_by_model", "cached_only"})
COMMON_KEYS = frozenset(
    {"tasks", "length_tasks", "precision", "seed", "bootstrap_seed", "device", "dtype", "results_dir", "analysis"}
)
DTYPES = ("auto", "float32", "bfloat16", "float16")
MAP_KEYS = frozenset(
    {"small", "big", "task", "n", "n_validation", "tokens_per_width", "seed", "digits", "max_tokens", "ridge"}
)


class ParamsError(EffdepthError):
    """A parameter file breaks the schema."""


def shown(path: Path) -> str:
    """``params/<file>`` (how errors name a parameter file)."""
    return f"params/{path.name}" if path.parent.name == "params" else str(path)


def load(path: Path) -> dict:
    """A parameter file's mapping, read safely (regular file, bounded size, UTF-8, bounded aliases)."""
    name = shown(path)
    try:
        data = read_regular(path, MAX_BYTES, "parameter file")
    except FileNotFoundError:
        raise ParamsError(f"missing parameter file {name}; run from the effdepth checkout (or pass --root)") from None
    except NotARegularFile as exc:
        raise ParamsError(f"{name} cannot be read as a parameter file: {exc}") from None
    except OSError as exc:
        raise ParamsError(f"cannot read {name} ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParamsError(f"{name} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None and _expanded_size(node, {}) > MAX_VALUES:
            raise ParamsError(
                f"{name} expands to more than {MAX_VALUES} values through YAML aliases; write the values out"
            )
        duplicate = _duplicate_key(node) if node is not None else None
        if duplicate is not None:
            raise ParamsError(f"{name} names the key {duplicate!r} twice in one mapping (line {duplicate.line})")
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{name} is not valid YAML: {_short(' '.join(str(exc).split()))}") from None
    except RecursionError:
        raise ParamsError(f"{name} nests too deeply to be a parameter file; flatten it") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ParamsError(f"{name} must hold a mapping at the top level (title, profiles)")
    return loaded


class _Key(str):
    line: int = 0


def _duplicate_key(node: yaml.Node) -> _Key | None:
    """The first key a mapping of ``node`` names twice (YAML would keep the last silently)."""
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, yaml.MappingNode):
            names: set = set()
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in names:
                        found = _Key(key.value)
                        found.line = key.start_mark.line + 1
                        return found
                    names.add(key.value)
                stack += [key, value]
        elif isinstance(current, yaml.SequenceNode):
            stack += current.value
    return None


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _expanded_size(node: yaml.Node, seen: dict[int, int]) -> int:
    """How many values ``node`` stands for once every alias is expanded (shared nodes counted once
    per use, computed once each)."""
    if id(node) in seen:
        return seen[id(node)]
    seen[id(node)] = MAX_VALUES + 1  # a recursive alias expands without end
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, seen) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, seen) + _expanded_size(v, seen) for k, v in node.value)
    else:
        size = 1
    seen[id(node)] = min(size, MAX_VALUES + 1)
    return seen[id(node)]


# The page parameters every section's notebook declares (its ``parameters`` cell), less those
# ``effdepth book`` fills in; a section's spec adds its own (``SectionSpec.keys``). A test reads the
# templates and checks these agree, so the schema and the notebooks cannot drift apart.
PAGE_KEYS = frozenset(
    {"precision", "seed", "bootstrap_seed", "device", "dtype", "results_dir", "title", "tasks", "length_tasks",
     "analysis"}
)  # fmt: skip


def section_keys(section: str) -> frozenset[str]:
    """The keys the defaults and sets of ``params/<section>.yml`` may use."""
    from .sections import get

    return PAGE_KEYS | get(section).keys


def template_keys(template: Path) -> frozenset[str]:
    """The names a notebook's ``parameters`` cell assigns, less those ``effdepth book`` fills in."""
    notebook = json.loads(read_regular(template, 16 << 20, "notebook").decode("utf-8"))
    cell = next(c for c in notebook["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    tree = ast.parse("".join(cell["source"]))
    assigned = [t for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    names = {t.id for t in assigned if isinstance(t, ast.Name)}
    return frozenset(names - FILLED)


# --- values ------------------------------------------------------------------------------------


def _fail(where: str, message: str) -> ParamsError:
    return ParamsError(f"{where} {_short(message, 300)}")


def _whole(value: Any, where: str, low: int = 1, high: int = MAX_N) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(where, f"must be a whole number in {low}..{high}, got {value!r}")


def _number(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(where, f"must be a finite number, got {value!r}")


def _text(value: Any, where: str) -> None:
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise _fail(where, f"must be a non-empty printable string, got {value!r}")


def _scalar(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, str | int | float | bool):
        raise _fail(where, f"must be a single value (text, number, true/false), got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _fail(where, f"must be a finite number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SEED:
        raise _fail(where, f"is beyond what a setting can hold, got {value!r}")


def _mapping(value: Any, where: str, allowed: frozenset[str] | None, fix: str = "") -> Mapping:
    if not isinstance(value, dict):
        raise _fail(where, f"must be a mapping, got {type(value).__name__} {value!r}")
    for key in value:
        if not isinstance(key, str):
            raise _fail(where, f"has a key {key!r} that is not a name")
        if allowed is not None and key not in allowed:
            raise _fail(f"{where}.{key}", f"is not a known key; use one of: {', '.join(sorted(allowed))}{fix}")
    return value


def _list(value: Any, where: str, fix: str) -> list:
    if not isinstance(value, list):
        raise _fail(where, f"must be a list, got {type(value).__name__} {value!r}; {fix}")
    return value


def _int_setting_names() -> dict[str, tuple[int, int]]:
    from effdepth_core.measurement import registry

    bounds = {
        "n": (1, MAX_N),
        "digits": (1, 1000),
        "level": (1, 5),
        "max_tokens": (1, 1 << 20),
        "batch_size": (1, 4096),
    }
    for name, option in CORE_OPTIONS.items():  # the core's own bounds where this schema sets none
        if option.type is int and name not in bounds:
            bounds[name] = (option.minimum, option.maximum)
    for name, option in registry.options().items():
        if option.type is int and name not in bounds:
            bounds[name] = (-MAX_SEED, MAX_SEED)
    return bounds


def check_task_spec(value: Any, where: str) -> None:
    """One task spec (a run's settings): its task, its probes, settings by name."""
    from effdepth_core.settings import setting_names

    spec = _mapping(value, where, frozenset({"task", "probes", "precision", "label", *setting_names()}))
    if "task" not in spec:
        raise _fail(where, "needs a task (e.g. {task: gsm8k})")
    _text(spec["task"], f"{where}.task")
    probes = spec.get("probes")
    if probes is not None and not isinstance(probes, str):
        for i, probe in enumerate(_list(probes, f"{where}.probes", "write probes: [cosine, logit_lens]")):
            _text(probe, f"{where}.probes[{i}]")
    if "precision" in spec:
        check_precision(spec["precision"], f"{where}.precision")
    ints = _int_setting_names()
    for key, item in spec.items():
        if key in ("task", "probes", "precision"):
            continue
        if key == "label":
            _text(item, f"{where}.label")
            continue
        _scalar(item, f"{where}.{key}")
        if key in ints and item is not None:
            _whole(item, f"{where}.{key}", *ints[key])
        if key == "seed":
            _whole(item, f"{where}.seed", -MAX_SEED, MAX_SEED)


def check_precision(value: Any, where: str) -> None:
    if value is None or isinstance(value, bool):
        return
    rule = _mapping(value, where, frozenset({"halfwidth", "n_min", "n_max", "step", "n_at_least"}))
    for key, item in rule.items():
        (_number if key == "halfwidth" else _whole)(item, f"{where}.{key}")


def _models(value: Any, where: str) -> None:
    if value == "all":
        return
    fix = "write models: [name, …] (a list, even of one model), or models: all"
    for i, model in enumerate(_list(value, where, fix)):
        _text(model, f"{where}[{i}]")


def _tasks(value: Any, where: str) -> None:
    for i, spec in enumerate(_list(value, where, "write tasks: [{task: gsm8k}, …]")):
        check_task_spec(spec, f"{where}[{i}]")


def _length_tasks(value: Any, where: str) -> None:
    """The exact length control's cells: task specs that each cut their texts (``positions``)."""
    _tasks(value, where)
    for i, spec in enumerate(value):
        if spec.get("positions") is None:
            fix = "needs positions (each text's first N tokens), e.g. {task: gsm8k, positions: 32}"
            raise _fail(f"{where}[{i}]", fix)


def _levels(value: Any, where: str) -> None:
    spec = _mapping(value, where, frozenset({"levels", "n", "max_tokens"}))
    for i, level in enumerate(_list(spec.get("levels", []), f"{where}.levels", "write levels: [1, 2, 3]")):
        _whole(level, f"{where}.levels[{i}]", 1, 5)
    for key in ("n", "max_tokens"):
        if key in spec:
            _whole(spec[key], f"{where}.{key}", 1, MAX_N if key == "n" else 1 << 20)


def _level_length(value: Any, where: str) -> None:
    """The MATH levels' length control: each level's texts cut to their first ``positions`` tokens."""
    if value is None:
        return
    spec = _mapping(value, where, frozenset({"positions", "n"}))
    if "positions" not in spec:
        raise _fail(where, "needs positions (each text's first N tokens), e.g. {positions: 80, n: 100}")
    ints = _int_setting_names()
    for key, item in spec.items():
        _whole(item, f"{where}.{key}", *ints[key])


def _arithmetic(value: Any, where: str) -> None:
    spec = _mapping(value, where, frozenset({"task", "digits", "n"}))
    if "task" in spec and spec["task"] not in ("addition", "multiplication"):
        raise _fail(f"{where}.task", f"must be addition or multiplication, got {spec['task']!r}")
    for i, digits in enumerate(_list(spec.get("digits", []), f"{where}.digits", "write digits: [2, 4, 6]")):
        _whole(digits, f"{where}.digits[{i}]", 1, 1000)
    if "n" in spec:
        _whole(spec["n"], f"{where}.n")


def _settings(value: Any, where: str) -> None:
    from effdepth_core.settings import setting_names

    for key, item in _mapping(value, where, frozenset(setting_names())).items():
        _scalar(item, f"{where}.{key}")


def _pairs(value: Any, where: str) -> None:
    for i, pair in enumerate(_list(value, where, "write pairs: [{base: …, long_cot: …}]")):
        spec = _mapping(pair, f"{where}[{i}]", frozenset({"base", "long_cot"}))
        for key in ("base", "long_cot"):
            if key not in spec:
                raise _fail(f"{where}[{i}]", f"needs {key}")
            _text(spec[key], f"{where}[{i}].{key}")


def _pair(value: Any, where: str) -> None:
    if value is None:
        return
    spec = _mapping(value, where, MAP_KEYS)
    for key in ("small", "big"):
        if key not in spec:
            raise _fail(where, f"needs {key} (the two models of the map)")
        _text(spec[key], f"{where}.{key}")
    for key in ("n", "n_validation"):
        if key in spec:
            _whole(spec[key], f"{where}.{key}")
    for key in ("tokens_per_width", "ridge"):
        if spec.get(key) is not None:
            _number(spec[key], f"{where}.{key}")


def _seed(value: Any, where: str) -> None:
    _whole(value, where, -MAX_SEED, MAX_SEED)


def _dtype(value: Any, where: str) -> None:
    if value not in DTYPES:
        raise _fail(where, f"must be one of {', '.join(DTYPES)}, got {value!r}")


def _analysis(value: Any, where: str) -> None:
    """The pre-registered primary analysis (``specification.Analysis``)."""
    from .specification import Analysis

    try:
        Analysis.from_params(_mapping(value, where, None))
    except (TypeError, ValueError) as error:
        raise _fail(where, str(error)) from None


def _flag(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        raise _fail(where, f"must be true or false, got {value!r}")


CHECKS: dict[str, Callable[[Any, str], None]] = {
    "models": _models,
    "level_models": _models,
    "sensitivity_models": _models,
    "tasks": _tasks,
    "sensitivity_tasks": _tasks,
    "length_tasks": _length_tasks,
    "bootstrap_seed": _seed,
    "causal": check_task_spec,
    "precision": check_precision,
    "seed": _seed,
    "device": _text,
    "dtype": _dtype,
    "results_dir": _text,
    "math": _levels,
    "level_length": _level_length,
    "arithmetic": _arithmetic,
    "skip": _settings,
    "pairs": _pairs,
    "pair": _pair,
    "download": _flag,
    "title": _text,
    "analysis": _analysis,
}


def _page_values(values: Mapping, where: str, allowed: frozenset[str]) -> None:
    for key, value in _mapping(values, where, allowed).items():
        CHECKS.get(key, _scalar)(value, f"{where}.{key}")


def _profiles(data: Mapping, name: str) -> Mapping:
    _mapping(data, name + ":", frozenset({"title", "profiles"}))
    if "title" in data:
        _text(data["title"], f"{name}: title")
    if "profiles" not in data:
        raise ParamsError(f"{name} has no profiles (write profiles: {{full: …, quick: …}})")
    return _mapping(data["profiles"], f"{name}: profiles", frozenset(PROFILES))


def check_common(data: Mapping, path: Path) -> None:
    """``params/common.yml``: per profile, the settings every section shares."""
    name = shown(path)
    for profile, values in _profiles(data, name).items():
        _page_values(values or {}, f"{name}: profiles.{profile}", COMMON_KEYS)


def check_section(data: Mapping, path: Path, keys: frozenset[str]) -> None:
    """``params/<section>.yml``: per profile, defaults and parameter sets of the page keys ``keys``."""
    name = shown(path)
    for profile, values in _profiles(data, name).items():
        where = f"{name}: profiles.{profile}"
        own = _mapping(values or {}, where, frozenset({"defaults", "sets"}))
        _page_values(own.get("defaults") or {}, f"{where}.defaults", keys)
        sets = _list(own.get("sets") or [], f"{where}.sets", "write sets: [{name: …, …}]")
        pages: set[str] = set()
        for i, entry in enumerate(sets):
            at = f"{where}.sets[{i}]"
            entry = _mapping(entry, at, None)
            if "name" not in entry:
                raise _fail(at, "needs a name (the page's file name)")
            page = entry["name"]
            if not isinstance(page, str) or not page or not all(c.isalnum() or c in "._-" for c in page):
                raise _fail(f"{at}.name", f"must be a file name of letters, digits, '.', '_' and '-', got {page!r}")
            if page.startswith("."):
                raise _fail(f"{at}.name", f"must not start with a dot, got {page!r}")
            if len(page.encode()) > NAME_BYTES:
                raise _fail(
                    f"{at}.name", f"names the page's file: at most {NAME_BYTES} bytes, got {len(page.encode())}"
                )
            if page.replace(".", "_") in pages:
                raise _fail(f"{at}.name", f"{page!r} names a page another set of the profile names; rename one")
            pages.add(page.replace(".", "_"))
            _page_values({k: v for k, v in entry.items() if k != "name"}, at, keys | {"title"})
