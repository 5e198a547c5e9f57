"""What a probe is, as data (docs/probes.md): its function, options, frames, ED rules, summary,
end-of-run cell, progress unit and chart. The command line (``--probes`` and each probe's flags),
settings validation, the cache key, the run directory's files, ``effdepth table`` columns,
``effdepth plot`` charts and the book's summaries are all generated from these specs
(``registry.py`` collects them, built-in and from plugins).

Import-light on purpose (no torch): a spec module may import its probe's heavy code freely, but
this module is shared by all of them and by the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...options import CORE_SETTINGS, KEY_ALWAYS, KEY_NEVER, KEY_WHEN_SET, Option, spelled  # noqa: F401 (this module's API)


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
    # (loaded, context) → its measurement as a part of one forward pass per batch (``shared/activations.py``'s
    # ``PassPart``), giving the per-example frame ``compute`` gives: probes of a run computed together that
    # have one share each batch's forward pass (``shared_pass_means``), e.g. the residual cosine and the lens
    pass_part: Callable[[Any, Context], Any] | None = None

    @property
    def frames(self) -> tuple[str, ...]:
        """Every frame it saves, each as ``<frame>.parquet``: the saved one, the per-example one,
        the extra and the derived ones."""
        return (self.name, f"{self.name}_by_example", *self.extra_frames, *self.derived)
