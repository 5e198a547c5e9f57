"""Sample sizes set by precision: grow a run's ``n`` until the 95 % bootstrap interval of each rule's
primary depth statistic (``depth.primary_statistic``, in layers) is at most ±``halfwidth`` layers,
or a cap. The integer ED's interval is not the yardstick: it is often zero-width at any ``n`` and
jumps by whole layers where it is not. A bootstrap over a handful of prompts gives
intervals that look precise and are not, so an interval counts only from ``n_min`` (20) prompts on.

Each step is an ordinary cached run (``results.run``) whose directory is named by its ``n``; a
larger step reuses the smaller one's examples (the task's sampling is prefix-stable), so growing
``n`` from 20 to 40 computes 20 new prompts. Walking the steps again reads them from the cache, so
the book and the grid find the same final ``n`` without any model work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from effdepth_core.errors import EffdepthError
from effdepth_core.measurement import registry
from effdepth_core.measurement.depth import N_BOOTSTRAP_RUN
from effdepth_core.models import LoadedModel
from effdepth_core.results import RunResult, run
from effdepth_core.rundir import is_complete
from effdepth_core.settings import RunSettings, default_out_dir


@dataclass(frozen=True)
class Precision:
    """The rule: every primary statistic's interval width ``depth_high − depth_low`` (layers) at most
    ``2 × halfwidth``, counted from ``n_min`` prompts; at most ``n_max`` prompts; steps of at least
    ``step`` prompts; never settled below ``n_at_least`` prompts (a pre-registered cell size: the
    walk doubles towards it, each step a finished run, so a killed walk resumes at its last step;
    ``None``: ``n_min``)."""

    halfwidth: float = 0.5
    n_min: int = 20
    n_max: int = 100
    step: int = 10
    n_at_least: int | None = None

    @property
    def floor(self) -> int:
        """The fewest prompts the walk settles on (when the data set has them)."""
        return max(self.n_min, self.n_at_least or 0)

    @classmethod
    def from_spec(cls, value: Mapping | bool | None) -> Precision | None:
        if value in (None, False):
            return None
        if value is True:
            return cls()
        if not isinstance(value, Mapping):
            raise EffdepthError(
                f"precision must be a mapping (halfwidth, n_min, n_max, step, n_at_least) or true, got {value!r}"
            )
        unknown = sorted(set(value) - set(asdict(cls())))
        if unknown:
            raise EffdepthError(
                f"unknown precision key(s) {', '.join(unknown)}; use halfwidth, n_min, n_max, step, n_at_least"
            )
        rule = cls(**value)
        if not (rule.halfwidth > 0 and 1 <= rule.n_min <= rule.n_max and rule.step >= 1 and rule.floor <= rule.n_max):
            raise EffdepthError(
                f"precision {value} is not a rule: halfwidth > 0, 1 <= n_min <= n_max, step >= 1, n_at_least <= n_max"
            )
        return rule

    def widths(self, result: RunResult) -> dict[str, float]:
        """Interval width in layers per rule whose statistic is defined (nothing else to make precise)."""
        return {
            key: depth.depth_high - depth.depth_low
            for key, depth in result.depth.items()
            if depth.depth_low is not None and depth.depth_high is not None
        }

    def met(self, result: RunResult) -> bool:
        n = int(result.summary["n_examples"])
        return n >= self.floor and all(w <= 2 * self.halfwidth for w in self.widths(result).values())

    def next_n(self, n: int, widths: Mapping[str, float]) -> int:
        """The next step: the n at which the widest interval would meet the rule if it shrinks as
        1/√n (or ``floor``, if larger), at least ``step`` more, at most twice ``n``, rounded up to a
        multiple of ``step``."""
        widest = max(widths.values(), default=0)
        wanted = n * (widest / (2 * self.halfwidth)) ** 2 if widest else n + self.step
        wanted = max(wanted, self.floor)
        grown = min(2 * n, max(n + self.step, wanted))
        return min(self.n_max, int(math.ceil(grown / self.step) * self.step))


@dataclass
class PreciseRun:
    """The run a precision rule settled on, the steps it took and why it stopped."""

    result: RunResult | None
    steps: list[int]
    stopped: str  # "met", "cap", "data", "pending" (cached only: a step still to compute), "not computed"
    widths: dict[str, float]

    @property
    def n(self) -> int:
        return int(self.result.summary["n_examples"]) if self.result is not None else 0

    def reason(self, rule: Precision) -> str:
        widest = max(self.widths.values(), default=0)
        if self.stopped == "met":
            return f"every depth interval within ±{rule.halfwidth:g} layers at n = {self.n}"
        if self.stopped == "cap":
            return f"the cap of {rule.n_max} prompts reached; widest interval {_layers(widest)}"
        if self.stopped == "data":
            return f"the data set has only {self.n} prompts here; widest interval {_layers(widest)}"
        if self.stopped == "pending":
            return f"pending: n = {self.n} so far, the walk's next step not yet computed (`effdepth grid full`)"
        return "not computed yet"


def _layers(width: float) -> str:
    return f"{width:.2f} layers"


def precise_run(
    settings: RunSettings,
    probes: Sequence[str],
    rule: Precision,
    results_dir: Path | str,
    loaded: LoadedModel | None = None,
    reuse_from: Sequence[Path | str] = (),
    cached_only: bool = False,
    load=None,
    n_bootstrap: int = N_BOOTSTRAP_RUN,
    renew_outdated: bool = False,
) -> PreciseRun:
    """Walk ``n`` = ``rule.n_min``, … until the rule is met, the cap is reached or the data set runs
    out. Each step is ``run`` into ``<results_dir>/<model>/<task>-n<N>-…``; steps already finished are
    read. ``load()`` gives the model when a step must be computed (``loaded`` if given); with
    ``cached_only`` nothing is computed and the walk stops at the first missing step."""
    n, steps = rule.n_min, []
    result, widths = None, {}
    while True:
        step = settings.replace(n=n)
        out = default_out_dir(step, results_dir, hashed=False)
        if not is_complete(out, step.key(), probes):
            if cached_only:
                return PreciseRun(result, steps, "pending" if result is not None else "not computed", widths)
            if loaded is None and load is not None:
                loaded = load()
        result = run(
            step,
            probes,
            out,
            loaded=loaded,
            n_bootstrap=n_bootstrap,
            overwrite=True,
            reuse_from=(*reuse_from, out.parent),  # the walk's own smaller steps lend their prompts' rows
            renew_outdated=renew_outdated,
        )
        steps.append(n)
        widths = rule.widths(result)
        if int(result.summary["n_examples"]) < n:
            return PreciseRun(result, steps, "data", widths)
        if rule.met(result):
            return PreciseRun(result, steps, "met", widths)
        if n >= rule.n_max:
            return PreciseRun(result, steps, "cap", widths)
        n = rule.next_n(n, widths)


def _cached_widths(out: Path, key: str, probes: Sequence[str]) -> tuple[int, dict[str, float]] | None:
    """A finished step's example count and interval widths, from its ``effective_depth.json`` (its
    sha256 checked against the metadata): what the walk decided on, without a bootstrap."""
    from effdepth_core.rundir import SUMMARY, read_metadata, verified_files

    if not is_complete(out, key, probes):
        return None
    metadata = read_metadata(out)
    recorded = (metadata or {}).get("files", {}).get(SUMMARY)
    if recorded is None or verified_files(out, {SUMMARY: recorded}) is not None:
        return None
    from effdepth_core.cache import read_json

    try:
        summary = read_json(out / SUMMARY)
    except (OSError, ValueError, EffdepthError):
        return None
    if not isinstance(summary, dict):
        return None
    widths = {}
    for rule in registry.rules():
        entry = summary.get(rule)
        if isinstance(entry, dict) and entry.get("depth_low") is not None and entry.get("depth_high") is not None:
            widths[rule] = float(entry["depth_high"]) - float(entry["depth_low"])
    return int(summary["n_examples"]), widths


def walk_plan(settings: RunSettings, probes: Sequence[str], rule: Precision, results_dir: Path | str) -> WalkPlan:
    """Where a precision walk stands in the cache, read from its summaries (no bootstrap, no model):
    the steps finished, and the n it computes next (None when it stopped). A step whose summary
    cannot be read is planned as the next (``precise_run`` then reads or recomputes it)."""
    n, steps = rule.n_min, []
    while True:
        step = settings.replace(n=n)
        cached = _cached_widths(default_out_dir(step, results_dir, hashed=False), step.key(), probes)
        if cached is None:
            return WalkPlan(steps, n)
        count, widths = cached
        steps.append(n)
        met = count >= rule.floor and all(w <= 2 * rule.halfwidth for w in widths.values())
        if count < n or met or n >= rule.n_max:
            return WalkPlan(steps, None)
        n = rule.next_n(n, widths)


@dataclass(frozen=True)
class WalkPlan:
    steps: list[int]
    next_n: int | None

    @property
    def state(self) -> str:
        if self.next_n is None:
            return "cached"
        return "partial" if self.steps else "missing"
