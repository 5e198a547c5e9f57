"""The probe registry: effdepth's own probes (one line each in ``BUILTIN``) and those of other
packages, found through the ``effdepth.probes`` entry-point group — a plugin adds a probe with one
line in its own pyproject::

    [project.entry-points."effdepth.probes"]
    norm = "my_package.norm:SPEC"

Names are known without importing anything (``names``); the specs load on first use, so the
command line's ``--help`` starts without torch.
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..errors import EffdepthError, EffdepthWarning

if TYPE_CHECKING:  # the spec classes load with the probes, not with the command line
    from .probes.spec import Option, ProbeSpec, Rule

ENTRY_POINT_GROUP = "effdepth.probes"

# name → "module:attribute" of its ProbeSpec; the order is the order of tables and of a run
BUILTIN: dict[str, str] = {
    "cosine": "effdepth_core.measurement.probes.cosine:SPEC",
    "logit_lens": "effdepth_core.measurement.probes.logit_lens:SPEC",
    "skip": "effdepth_core.measurement.probes.skip:SPEC",
    "erasure": "effdepth_core.measurement.probes.erasure:SPEC",
    "igrad": "effdepth_core.measurement.probes.igrad:SPEC",
    "tuned_lens": "effdepth_core.measurement.probes.tuned_lens:SPEC",
    "prune": "effdepth_core.measurement.probes.prune:SPEC",
    "early_exit": "effdepth_core.measurement.probes.early_exit:SPEC",
    "norm": "effdepth_core.measurement.probes.norm:SPEC",
    "attention_entropy": "effdepth_core.measurement.probes.attention_entropy:SPEC",
}
DEFAULT = ("cosine", "logit_lens")  # what `effdepth run` measures unless told otherwise

_EXTRA: dict[str, ProbeSpec] = {}  # registered in process (tests, notebooks): ``register``
_LEFT_OUT: dict[str, str] = {}  # plugin name → why it was left out (``get`` says so)
# a probe's or frame's name becomes a file name, a flag and a JSON key: a plain identifier
PLAIN_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
# flags and settings of the commands a plugin's options join (run, plot, grid): never a plugin's
CORE_FLAGS = frozenset(
    {"--out", "--overwrite", "--help", "--debug", "--version", "--probes", "--reuse-from", "--slow", "--no-progress",
     "--chart", "--root", "--dry-run", "--executor", "--address", "--cpus-per-cell", "--memory-per-cell",
     "--shard", "--section", "--model", "--task", "--n", "--seed", "--source", "--level", "--digits",
     "--max-tokens", "--device", "--device-map", "--dtype", "--batch-size", "--format"}
)  # fmt: skip


def _left_out(name: str, why: str) -> None:
    """A plugin that cannot join: one line naming it and why (once per process)."""
    if name not in _LEFT_OUT:
        _LEFT_OUT[name] = why
        warnings.warn(f"the probe plugin {name!r} was left out: {why}", EffdepthWarning, stacklevel=3)


@functools.cache
def _entry_points() -> dict[str, object]:
    from importlib.metadata import entry_points

    found = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name in BUILTIN:
            _left_out(point.name, f"its name is a built-in probe's ({point.value})")
        elif not PLAIN_NAME.match(point.name):
            _left_out(point.name, "a probe name must be a plain lower-case identifier (letters, digits, _)")
        else:
            found.setdefault(point.name, point)
    return found


def names() -> tuple[str, ...]:
    """Every probe's name (built-in first), as ``get`` knows them once the probes are loaded; before,
    without importing any probe, the plugins whose names are valid and not yet left out (``get`` then
    says in one line why one that fails to load is missing)."""
    if _all.cache_info().currsize:
        return tuple(_all())
    plugins = (n for n in _entry_points() if n not in BUILTIN and n not in _LEFT_OUT)
    return (*BUILTIN, *plugins, *(n for n in _EXTRA if n not in BUILTIN))


def _load(name: str, target: str) -> ProbeSpec:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


@functools.cache
def _all() -> dict[str, ProbeSpec]:
    specs: dict[str, ProbeSpec] = {name: _load(name, target) for name, target in BUILTIN.items()}
    for name, point in _entry_points().items():
        try:
            spec = point.load()
            _check_plugin(name, spec, specs)
        except (Exception, SystemExit) as exc:  # a broken plugin must not break effdepth: left out, loudly
            message = " ".join(str(exc).split())[:300]
            _left_out(name, f"{point.value} raised {type(exc).__name__}" + (f": {message}" if message else ""))
            continue
        specs[name] = spec
    for name, spec in _EXTRA.items():
        _check_plugin(name, spec, specs)
        specs[name] = spec
    return specs


def _check_plugin(name: str, spec: object, known: Mapping[str, ProbeSpec]) -> None:
    from .probes.spec import CORE_SETTINGS, KEY_ALWAYS, ProbeSpec

    if not isinstance(spec, ProbeSpec):
        raise EffdepthError(f"{name}: the entry point must name a ProbeSpec, found {type(spec).__name__}")
    if spec.name != name:
        raise EffdepthError(f"the entry point {name!r} names a probe called {spec.name!r}")
    if not PLAIN_NAME.match(name):
        raise EffdepthError(f"a probe name must be a plain lower-case identifier (letters, digits, _), got {name!r}")
    if name in known:
        raise EffdepthError(f"a probe called {name!r} exists already")
    bad_frames = [f for f in (*spec.extra_frames, *spec.derived) if not isinstance(f, str) or not PLAIN_NAME.match(f)]
    if bad_frames:
        raise EffdepthError(f"frame names must be plain lower-case identifiers, got {bad_frames!r}")
    taken_frames = {f for s in known.values() for f in s.frames} & set(spec.frames)
    if taken_frames:
        raise EffdepthError(f"frame name(s) {', '.join(sorted(taken_frames))} are another probe's")
    theirs = {o.name: o for s in known.values() for o in s.options}
    flags = {o.cli_flag: o for s in known.values() for o in s.options}
    for option in spec.options:
        if not isinstance(option.name, str) or not PLAIN_NAME.match(option.name):
            raise EffdepthError(f"option name {option.name!r} is not a plain lower-case identifier")
        if option.name in CORE_SETTINGS or (option.name in theirs and theirs[option.name] != option):
            raise EffdepthError(f"option {option.name!r} is taken by effdepth or another probe")
        flag = option.cli_flag
        if (
            not re.match(r"^--[a-z][a-z0-9-]{0,63}$", flag)
            or flag in CORE_FLAGS
            or option.name in {f.removeprefix("--").replace("-", "_") for f in CORE_FLAGS}
        ):
            raise EffdepthError(f"option {option.name!r} (flag {flag}) clashes with one of effdepth's flags")
        if flag in flags and flags[flag] != option:
            raise EffdepthError(f"option {option.name!r} (flag {flag}) is another probe's flag")
        if option.key == KEY_ALWAYS and option.name not in theirs:
            raise EffdepthError(f"{name}: option {option.name!r} must not enter every cache key (use KEY_WHEN_SET)")
    rules = {r.key for s in known.values() for r in s.rules}
    clash = [r.key for r in spec.rules if r.key in rules]
    if clash:
        raise EffdepthError(f"{name}: rule key(s) {', '.join(clash)} are taken")


def register(spec: ProbeSpec) -> None:
    """Add a probe for this process (tests, a notebook): as if a plugin had declared it."""
    _EXTRA[spec.name] = spec
    reload()


def unregister(name: str) -> None:
    _EXTRA.pop(name, None)
    reload()


def reload() -> None:
    """Forget what was loaded (after installing a plugin in this process)."""
    _LEFT_OUT.clear()
    _entry_points.cache_clear()
    _all.cache_clear()
    options.cache_clear()


def specs() -> dict[str, ProbeSpec]:
    """Every probe's spec, by name, in ``names`` order."""
    return dict(_all())


def get(name: str) -> ProbeSpec:
    found = _all().get(name)
    if found is None:
        if name in _LEFT_OUT:
            raise EffdepthError(f"the probe plugin {name!r} was left out ({_LEFT_OUT[name]}); fix or uninstall it")
        raise EffdepthError(f"unknown probe {name!r}; available: {', '.join(_all())}")
    return found


@functools.cache
def options() -> dict[str, Option]:
    """Every probe option by name (an option two probes share is one object)."""
    found: dict[str, Option] = {}
    for spec in _all().values():
        for option in spec.options:
            found.setdefault(option.name, option)
    return found


def rules() -> dict[str, tuple[ProbeSpec, Rule]]:
    """Every ED rule by key, with the probe it belongs to."""
    return {rule.key: (spec, rule) for spec in _all().values() for rule in spec.rules}


def frames() -> dict[str, tuple[str, ...]]:
    """Probe → the frames it saves (how a run directory knows its own files)."""
    return {name: spec.frames for name, spec in _all().items()}
