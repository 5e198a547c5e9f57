"""What a probe is, as data (docs/probes.md): its function, options, frames, ED rules, summary,
end-of-run cell, progress unit and chart. The command line (``--probes`` and each probe's flags),
settings validation, the cache key, the run directory's files, ``effdepth table`` columns,
``effdepth plot`` charts and the book's summaries are all generated from these specs
(``registry.py`` collects them, built-in and from plugins).

Import-light on purpose (no torch): a spec module may import its probe's heavy code freely, but
this module is shared by all of them and by the registry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import EffdepthError

KEY_ALWAYS = "always"  # in every cache key (options of the first release: their keys must not change)
KEY_WHEN_SET = "when set"  # in the key only when not at the default (so adding an option keeps old keys)
KEY_NEVER = "never"  # never in the key (how a result is shown, not what it is)
# the settings every run has (``settings.RunSettings``): no probe option may take these names
CORE_SETTINGS = (
    "model",
    "task",
    "n",
    "seed",
    "source",
    "level",
    "digits",
    "max_tokens",
    "device",
    "dtype",
    "batch_size",
    "method",
    "device_map",
    "progress",
)


def spelled(name: str, value: object = None) -> str:
    """An option as both callers write it, for messages: ``igrad_steps=16 (--igrad-steps 16)``."""
    flag = "--" + name.replace("_", "-")
    if value is None:
        return f"{name}= ({flag})"
    return f"{name}={value!r} ({flag} {value})"


@dataclass(frozen=True)
class Option:
    """One setting of a probe: its default, command-line flag and help, valid values, and whether it
    enters the cache key. ``name`` is the attribute of ``RunSettings`` (and the params/ key)."""

    name: str
    default: Any
    help: str
    type: Callable[[str], Any] = str  # how the command line reads it
    choices: tuple | None = None
    minimum: float | None = None  # inclusive, unless ``open_interval``
    maximum: float | None = None
    open_interval: bool = False
    key: str = KEY_WHEN_SET
    flag: str | None = None  # default: --<name with dashes>
    check_value: Callable[[Any], str | None] | None = None  # further check: a message, or None when fine
    normalize: Callable[[Any], Any] | None = None  # one spelling per value (before checks and the key)

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not valid for this option (None when it is)."""
        if value is None and self.default is None:
            return None
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}, got {value!r}"
        if self.minimum is not None or self.maximum is not None:
            low, high = self.minimum, self.maximum
            fraction = self.open_interval and (low, high) == (0, 1)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                return (
                    f"must be a fraction between 0 and 1 (exclusive), got {value}"
                    if fraction
                    else (f"must be a number, got {value!r}")
                )
            if self.type is int and not isinstance(value, int):
                return f"must be a whole number, got {value!r}"
            if fraction and not 0 < value < 1:
                return f"must be a fraction between 0 and 1 (exclusive), got {value}"
            if self.open_interval and not ((low is None or value > low) and (high is None or value < high)):
                if high is None:
                    return f"must be greater than {low:g}, got {value!r}"
                if low is None:
                    return f"must be less than {high:g}, got {value!r}"
                return f"must be in ({low:g}, {high:g}), got {value!r}"
            if not self.open_interval and ((low is not None and value < low) or (high is not None and value > high)):
                bounds = f"at least {low:g}" if high is None else f"in {low:g}..{high:g}"
                return f"must be {bounds}, got {value!r}"
        if self.check_value is not None:
            return self.check_value(value)
        return None

    def check(self, value: Any) -> None:
        problem = self.problem(value)
        if problem:
            raise EffdepthError(f"{self.name} ({self.cli_flag}) {problem}")

    def parse(self, text: str) -> Any:
        """The command line's reading of ``text`` (a ValueError says why it is not valid; an empty
        text is never a value: leaving the option out gives its default)."""
        if not text.strip():
            raise ValueError("is empty; give a value or leave the option out (its default)")
        try:
            value = self.type(text)
        except (TypeError, ValueError):
            kind = {int: "a whole number", float: "a number"}.get(self.type, "a value")
            raise ValueError(f"must be {kind}, got {text!r}") from None
        problem = self.problem(value)
        if problem:
            raise ValueError(problem)
        return value


@dataclass(frozen=True)
class Rule:
    """An effective-depth rule: ``find(curves, settings)`` → ED (a layer index) or None, where
    ``curves`` holds each of ``metrics`` as an array over layers 0..L-1 (0..L with
    ``needs_final_layer``) of the token-weighted mean. ``reason`` says why no layer was found.

    Its continuous statistics (``depth.py``, method.md §12): ``crossing(curves, settings)`` is the
    same crossing read between layers (linear interpolation; a float, None where ``find`` finds
    none), averaged over ``thresholds``; ``centroid(curves)`` a threshold-free depth (the lens
    rules: the mean layer at which the distance to the output is removed). The primary statistic
    is the centroid where the rule has one, else the threshold-averaged crossing."""

    key: str  # as in effective_depth.json
    label: str  # tables and charts
    metrics: tuple[str, ...]
    find: Callable[[Mapping[str, Any], Any], int | None]
    reason: Callable[[Any], str]
    needs_final_layer: bool = False
    frame: str | None = None  # the probe's per-example frame it reads (default: the probe's own)
    thresholds: tuple[str, tuple[float, ...]] | None = None  # (setting, values): the book's sensitivity view
    crossing: Callable[[Mapping[str, Any], Any], float | None] | None = None
    centroid: Callable[[Mapping[str, Any]], float | None] | None = None
    # optional fast paths for the bootstrap: ``find`` / ``crossing`` / ``centroid`` on many curves at once
    # (``{metric: [row, layer]}`` → ``[row]``, NaN where undefined), equal to them row by row (tested)
    find_rows: Callable[[Mapping[str, Any], Any], Any] | None = None
    crossing_rows: Callable[[Mapping[str, Any], Any], Any] | None = None
    centroid_rows: Callable[[Mapping[str, Any]], Any] | None = None


@dataclass(frozen=True)
class Chart:
    """An ``effdepth plot`` chart drawn from one of the probe's frames: ``builder`` names a function of
    the book's ``plots`` (``"metric_curves"`` draws any probe's curves) or is a callable
    ``(frame, model=, task=, **options)`` → Altair chart (a plugin's own)."""

    name: str
    builder: str | Callable[..., Any]
    frame: str  # a saved frame name (``<probe>``, ``<probe>_by_example``, a derived one)
    options: Callable[[Any], dict] | None = None  # frame → extra keyword arguments


@dataclass
class Context:
    """What a probe's ``compute`` gets besides the model and examples: the run's settings, whether
    to show progress, and the index of its first example (a run that extends an earlier one
    computes only the new examples; index-seeded sampling must use the true index)."""

    settings: Any
    first_example: int = 0

    @property
    def progress(self) -> bool:
        return bool(getattr(self.settings, "progress", False))


Frames = Any  # pl.DataFrame, or (per-example frame, {extra frame name: frame})


@dataclass(frozen=True)
class Shape:
    """A model's size as the cost model sees it (``book/cost.py``)."""

    n_layers: int
    d_model: int
    vocab_size: int
    n_params: int

    @property
    def forward(self) -> float:
        """Operations of one forward pass, per token."""
        return 2.0 * self.n_params

    @property
    def unembed(self) -> float:
        """Operations of decoding one residual into the vocabulary (the final norm is negligible)."""
        return 2.0 * self.d_model * self.vocab_size


def forward_work(shape: Shape, settings: Any, lengths: Sequence[int]) -> float:
    """One forward pass over every prompt (the default of ``ProbeSpec.work``)."""
    return shape.forward * sum(lengths)


def prompts_of(examples: Sequence[Any]) -> list[Any]:
    """Each example's prompt (an ``Example``'s text; plain prompts and token ids as they are)."""
    return [getattr(e, "prompt", e) for e in examples]


def on_prompts(function: Callable[..., Any], **options: str) -> Callable[..., Any]:
    """A spec's ``compute`` for a probe of the prompts' text alone: ``function(loaded, prompts,
    batch_size=…, progress=…, **{argument: settings.<option>})`` on each example's prompt."""

    def compute(loaded: Any, examples: Sequence[Any], context: Context) -> Any:
        settings = context.settings
        chosen = {argument: getattr(settings, option) for argument, option in options.items()}
        return function(
            loaded, prompts_of(examples), batch_size=settings.batch_size, progress=context.progress, **chosen
        )

    return compute


@dataclass(frozen=True)
class ProbeSpec:
    """A probe, declared next to its function (docs/probes.md has a worked example).

    ``compute(loaded, examples, context)`` returns the per-example frame (long format with an
    ``example`` column), or that frame and a dict of extra frames. ``aggregate`` reduces it to the
    saved ``<name>.parquet`` (None: the per-example frame is saved as such); ``derived`` frames are
    computed from the per-example frame and the examples (None: not applicable to this run)."""

    # --- the science: what it measures, on what, and how an ED is read from it
    name: str
    title: str  # what progress bars and messages call it
    compute: Callable[..., Frames]
    options: tuple[Option, ...] = ()
    aggregate: Callable[[Any], Any] | None = None
    rules: tuple[Rule, ...] = ()
    needs_answers: bool = False  # examples need a question/answer split
    min_tokens: int = 2  # shortest prompt its definition is meaningful for
    description: str = ""
    # --- what it saves and shows besides (most probes need none of these)
    derived: Mapping[str, Callable[[Any, Sequence[Any]], Any]] = field(default_factory=dict)
    extra_frames: tuple[str, ...] = ()  # extra frames ``compute`` returns (per run, not per example)
    summarize: Callable[[Mapping[str, Any]], dict] | None = None  # saved frames → keys of effective_depth.json
    cell: Callable[[Mapping[str, Any], Mapping[str, Any]], str] | None = None  # (summary, saved frames) → text
    cell_label: str | None = None  # its column in the end-of-run table (default: ``title``)
    charts: tuple[Chart, ...] = ()
    unit: str = "prompt"  # what its progress bar counts
    # --- caching, checks and scheduling (the defaults fit a probe of the prompts alone)
    reusable: bool = False  # an example's rows depend on that example alone: reused when n grows
    revision: int = 1  # bump when the same settings give other numbers: enters the probe's own key
    check: Callable[[Any, Mapping[str, Any]], None] | None = None  # (settings, model facts) → raise on a bad mix
    expand: Callable[[Any], tuple[str, ...]] | None = None  # settings → the probes asking for this one runs
    identity: Callable[[Any, Any], dict] | None = None  # (loaded, context) → what else pins its numbers
    outdated: Callable[[Mapping[str, Any], Any], str | None] | None = None  # (cached record, settings) → warning
    # (shape, settings, prompt lengths in tokens) → its operations, up to a constant the cost model
    # measures per model (``book/cost.py``): what must scale with layers, vocabulary and settings
    work: Callable[[Shape, Any, Sequence[int]], float] = forward_work

    @property
    def frames(self) -> tuple[str, ...]:
        """Every frame it saves, each as ``<frame>.parquet``: the saved one, the per-example one,
        the extra and the derived ones."""
        return (self.name, f"{self.name}_by_example", *self.extra_frames, *self.derived)
