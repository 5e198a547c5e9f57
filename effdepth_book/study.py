"""Grids of runs for the book: several models × several task specs, gathered into long frames.

A *task spec* is a dict such as ``{"task": "math", "level": 3, "n": 5, "probes": ["cosine"]}``;
``task_settings`` turns one into the ``RunSettings`` that ``results.run`` caches under, so the
notebooks, the CLI and the book runner share one cache. A model that cannot be loaded (a hub id
on an offline machine) is recorded with its reason instead of failing the whole study.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from effdepth_core.acquire import needs_download
from effdepth_core.errors import EffdepthError
from effdepth_core.map_run import run_map
from effdepth_core.measurement import registry
from effdepth_core.measurement.depth import N_BOOTSTRAP_RUN
from effdepth_core.measurement.probes import rule_comparison
from effdepth_core.models import LoadedModel, load_model, quiet_libraries
from effdepth_core.results import RunResult, run
from effdepth_core.rundir import is_complete
from effdepth_core.settings import MapSettings, RunSettings, default_out_dir, parse_probes, setting_names

from .precision import PreciseRun, Precision, precise_run
from .reference import RULE_LABELS, TUNED_RULE_LABELS

RULES = RULE_LABELS
MIN_INTERVAL_N = 20  # a bootstrap over fewer prompts gives intervals that look precise and are not
_SETTING_NAMES = set(setting_names())
_SPEC_ONLY = {"task", "probes", "label", "precision"}
# The book's lens multiplies its head in float32 on every machine (``effdepth run`` defaults to
# ``auto``: bfloat16 where the hardware has it): its committed results were, and their keys stay.
BOOK_HEAD_DTYPE = "float32"


def task_label(spec: Mapping) -> str:
    """How a task spec is named in tables and charts: ``gsm8k``, ``MATH level 3``, ``addition 6 digits``,
    ``MATH level 3, first 80 tokens``."""
    if "label" in spec:
        return str(spec["label"])
    task = str(spec["task"])
    if task == "math" and spec.get("level") is not None:
        task = f"MATH level {spec['level']}"
    elif task in ("addition", "multiplication"):
        task = f"{task} {spec.get('digits', 6)} digits"
    if spec.get("positions") is not None:
        return f"{task}, first {spec['positions']} tokens"
    return task


def task_settings(model: str, spec: Mapping, defaults: Mapping | None = None) -> RunSettings:
    """The run settings of ``model`` on one task spec; ``defaults`` (seed, device, dtype, …) fill in
    what the spec leaves out. Unknown keys are an error, so a typo in params/ cannot pass silently."""
    merged = {**(defaults or {}), **spec}
    unknown = sorted(set(merged) - _SETTING_NAMES - _SPEC_ONLY - {"results_dir", "reuse_from"})
    if unknown:
        raise EffdepthError(
            f"unknown task-spec key(s) {', '.join(unknown)}; use task, probes, label or a run setting: "
            f"{', '.join(sorted(_SETTING_NAMES))}"
        )
    if "task" not in merged:
        raise EffdepthError(f"task spec {dict(spec)} has no 'task'")
    values = {k: v for k, v in merged.items() if k in _SETTING_NAMES}
    values.setdefault("head_dtype", BOOK_HEAD_DTYPE)
    return RunSettings(model=model, task=str(merged["task"]), **values)


def expand_levels(spec: Mapping, key: str, setting: str) -> list[dict]:
    """``{"task": "math", "levels": [1, 2]}`` → one spec per level (``key`` → ``setting``)."""
    values = spec.get(key)
    if values is None:
        return [dict(spec)]
    base = {k: v for k, v in spec.items() if k != key}
    return [{**base, setting: value} for value in values]


@dataclass(repr=False)
class RunRecord:
    """One (model, task spec): its settings and result, or why it could not run."""

    model: str
    label: str
    settings: RunSettings
    probes: list[str]
    result: RunResult | None = None
    error: str | None = None
    precision: Precision | None = None  # the sample-size rule, when ``n`` grows by precision
    walk: PreciseRun | None = None  # where the rule stopped

    def asked(self, frame: str) -> bool:
        """Whether this run's spec asked for the probe that saves ``frame`` (a probe name or one of its
        frames). A run also holds what its probes needed (early exit: the EDs it exits at, on its own
        few prompts): those rows are not what the book counts for that probe, the run that asked is."""
        owners = [name for name, saved in registry.frames().items() if frame == name or frame in saved]
        return any(name in self.probes for name in owners)

    def __repr__(self) -> str:
        state = "finished" if self.result is not None else f"failed: {self.error}" if self.error else "not run"
        return f"RunRecord({self.model!r}, {self.label!r}, probes {', '.join(self.probes)}, {state})"


@dataclass(repr=False)
class Study:
    """The runs of a grid, with long frames across all of them."""

    records: list[RunRecord] = field(default_factory=list)

    def __repr__(self) -> str:
        models = sorted({r.model for r in self.records})
        failed = self.unavailable()
        return (
            f"Study({len(self.finished)} of {len(self.records)} runs finished, models {', '.join(models)}"
            + (f"; could not run: {', '.join(failed)}" if failed else "")
            + ")"
        )

    @property
    def finished(self) -> list[RunRecord]:
        return [r for r in self.records if r.result is not None]

    def unavailable(self) -> dict[str, str]:
        """Model → reason, for models that could not be run."""
        return {r.model: r.error for r in self.records if r.error is not None}

    def summary(self) -> pl.DataFrame:
        """ED per (model, task, rule): ``ed, ratio, ci_low, ci_high, reason``, the interval's
        ``width`` and whether it counts (``n_examples`` ≥ ``MIN_INTERVAL_N``), why the ED is
        ``degenerate`` (``depth.degenerate``; null when it is not), the primary statistic (``statistic,
        depth, depth_ratio, depth_low, depth_high``, ``depth_degenerate`` by the same test: the one that
        decides the verdicts), where the sample-size rule
        stopped (``precision``: met, cap, data; null for a fixed n), plus model facts."""
        from effdepth_core.measurement.depth import degenerate

        rows = []
        for r in self.finished:
            s, meta = r.result.summary, r.result.metadata
            n_layers = int(s["n_layers"])
            for rule, (spec, spec_rule) in registry.rules().items():  # every rule the run asked for
                if rule not in s or not r.asked(spec.name):
                    continue
                entry = s[rule]
                ratio = lambda v, n=n_layers: None if v is None else (v + 1) / n  # noqa: E731
                low, high, ed = entry.get("ci_low"), entry.get("ci_high"), entry.get("ed")
                why = degenerate(ed, low, high, n_layers)
                depth, d_low, d_high = (entry.get(k) for k in ("depth", "depth_low", "depth_high"))
                rows.append(
                    {
                        "model": r.model,
                        "task": r.label,
                        "rule": spec_rule.label,
                        "ed": ed,
                        "ratio": entry.get("ratio"),
                        "ci_low": low,
                        "ci_high": high,
                        "ratio_low": ratio(low),
                        "ratio_high": ratio(high),
                        "width": None if low is None or high is None else high - low,
                        "interval_counts": int(s["n_examples"]) >= MIN_INTERVAL_N,
                        "degenerate": why,
                        "statistic": entry.get("statistic"),
                        "depth": depth,
                        "depth_ratio": ratio(depth),
                        "depth_low": d_low,
                        "depth_high": d_high,
                        "depth_degenerate": degenerate(depth, d_low, d_high, n_layers),
                        "precision": r.walk.stopped if r.walk is not None else None,
                        "reason": entry.get("reason"),
                        "n_layers": n_layers,
                        "n_params": meta.get("n_params"),
                        "n_examples": s["n_examples"],
                    }
                )
        schema = {
            "model": pl.String,
            "task": pl.String,
            "rule": pl.String,
            "ed": pl.Int64,
            "ratio": pl.Float64,
            "ci_low": pl.Int64,
            "ci_high": pl.Int64,
            "ratio_low": pl.Float64,
            "ratio_high": pl.Float64,
            "width": pl.Int64,
            "interval_counts": pl.Boolean,
            "degenerate": pl.String,
            "statistic": pl.String,
            "depth": pl.Float64,
            "depth_ratio": pl.Float64,
            "depth_low": pl.Float64,
            "depth_high": pl.Float64,
            "depth_degenerate": pl.String,
            "precision": pl.String,
            "reason": pl.String,
            "n_layers": pl.Int64,
            "n_params": pl.Int64,
            "n_examples": pl.Int64,
        }
        return pl.DataFrame(rows, schema=schema)

    def sensitivity(self) -> pl.DataFrame:
        """ED of every rule with a threshold (the lens rules) as the threshold varies, per run:
        ``model, task, rule, setting, threshold, ed, ratio`` (``depth.threshold_sensitivity``)."""
        from effdepth_core.measurement.depth import threshold_sensitivity

        parts = []
        for r in self.finished:
            n_layers = int(r.result.summary["n_layers"])
            for spec, rule in registry.rules().values():
                frame = r.result.per_example.get(rule.frame or spec.name)
                if frame is None or rule.thresholds is None or not r.asked(spec.name):
                    continue
                table = threshold_sensitivity(rule, frame, n_layers, r.settings)
                parts.append(
                    table.with_columns(
                        pl.lit(r.model).alias("model"),
                        pl.lit(r.label).alias("task"),
                        pl.lit(rule.label).alias("rule"),
                        pl.lit(rule.thresholds[0]).alias("setting"),
                    )
                )
        if not parts:
            return pl.DataFrame()
        return pl.concat(parts).select("model", "task", "rule", "setting", "threshold", "ed", "ratio")

    def record(self, model: str, label: str, probe: str) -> RunRecord | None:
        """The finished run of ``model`` on ``label`` that asked for ``probe`` (None when there is none)."""
        for r in self.finished:
            if r.model == model and r.label == label and probe in r.result.per_example and r.asked(probe):
                return r
        return None

    def frame(self, probe: str, per_example: bool = False) -> pl.DataFrame:
        """A probe's saved frame (curves, or the per-example frame) of every run that asked for it, with
        ``model``, ``task``, ``n_layers`` and ``rel_depth`` (layer / L) columns."""
        parts = []
        for r in self.finished:
            source = r.result.per_example if per_example else r.result.curves
            if probe not in source or not r.asked(probe):
                continue
            n_layers = int(r.result.summary["n_layers"])
            frame = source[probe].with_columns(
                pl.lit(r.model).alias("model"), pl.lit(r.label).alias("task"), pl.lit(n_layers).alias("n_layers")
            )
            if "layer" in frame.columns:
                frame = frame.with_columns((pl.col("layer") / n_layers).alias("rel_depth"))
            parts.append(frame)
        return pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()

    def examples(self, model: str, label: str) -> list[dict]:
        """The exact prompts of one run (``examples.jsonl``)."""
        import json

        for r in self.finished:
            if r.model == model and r.label == label:
                from effdepth_core.cache import read_regular

                lines = read_regular(r.result.out_dir / "examples.jsonl", 1 << 30).decode("utf-8").splitlines()
                return [json.loads(line) for line in lines if line.strip()]
        raise KeyError(f"no finished run for {model} / {label}")


def difficulty_specs(
    math: Mapping | None, arithmetic: Mapping | None, skip: Mapping | None, separate_skip: bool = False
) -> list[dict]:
    """The difficulty section's runs: one spec per MATH level and per operand length, each with the
    correlational probes and the skip probe (for the depth score) under the ``skip`` settings. With
    ``separate_skip`` the skip probe is a run of its own per level, whose ``n`` (in ``skip``) stays
    fixed while the correlational runs grow theirs by the page's precision rule."""
    levels = []
    if math:
        levels += [{**s, "task": "math"} for s in expand_levels(math, "levels", "level")]
    if arithmetic:
        levels += expand_levels(arithmetic, "digits", "digits")
    if not separate_skip:
        return [{**level, "probes": ["cosine", "logit_lens", "skip"], **(skip or {})} for level in levels]
    specs = []
    for level in levels:
        specs.append({**level, "probes": ["cosine", "logit_lens"]})
        if skip:
            specs.append({**level, "probes": ["skip"], "precision": False, **skip})
    return specs


def difficulty_trend(
    frame: pl.DataFrame, order: Sequence[str], value: str, by: Sequence[str] = ("model",)
) -> pl.DataFrame:
    """Spearman correlation between difficulty rank (position in ``order``) and ``value`` per
    ``by`` group: positive means more depth used on harder inputs. Null when a group has fewer
    than 3 levels or a constant column."""
    rank = {label: i for i, label in enumerate(order)}
    ranked = frame.filter(pl.col("task").is_in(list(order)), pl.col(value).is_not_null()).with_columns(
        pl.col("task").replace_strict(rank, return_dtype=pl.Int64).alias("difficulty")
    )
    out = ranked.group_by(list(by), maintain_order=True).agg(
        pl.len().alias("levels"),
        pl.corr("difficulty", value, method="spearman").alias("spearman"),
    )
    return out.with_columns(pl.when(pl.col("levels") >= 3).then(pl.col("spearman").fill_nan(None)).alias("spearman"))


def run_study(
    models: Sequence[str],
    specs: Sequence[Mapping],
    *,
    defaults: Mapping | None = None,
    results_dir: str | Path = "results",
    n_bootstrap: int = N_BOOTSTRAP_RUN,
    download: bool = True,
    specs_by_model: Mapping[str, Sequence[Mapping]] | None = None,
    cached_only: bool = False,
    reuse_from: Sequence[str | Path] = (),
) -> Study:
    """Run every task spec on every model (cached runs are only read), loading each model at most
    once and only if some run needs it. ``defaults`` holds settings shared by all specs; with
    ``download=False`` a hub model that is not cached locally is reported instead of fetched;
    ``specs_by_model`` gives some models their own specs instead of ``specs``; with ``cached_only``
    no model is loaded at all (what is not cached is reported as not computed). A spec with
    ``precision`` grows its ``n`` by that rule (``precision.precise_run``); ``reuse_from`` names
    other results folders whose runs may lend their first examples' rows."""
    study = Study()
    quiet_libraries(progress=bool((defaults or {}).get("progress", True)))
    for model in models:
        records = [record_of(model, spec, defaults) for spec in (specs_by_model or {}).get(model, specs)]
        loader = ModelLoader(model, download=download, cached_only=cached_only)
        for record in records:
            try:
                compute_record(record, results_dir, loader.bind(record), n_bootstrap, reuse_from, cached_only)
            except NotComputed as exc:  # this cell only: the model's other cells may be cached
                record.error = str(exc)
            except Unavailable as exc:  # the model itself: none of its cells can run
                for r in records:
                    if r.result is None and r.error is None:
                        r.error = str(exc)
                break
        study.records += records
        loader.release()
    return study


class Unavailable(EffdepthError):
    """A model that cannot be run here (offline hub model, or not computed in a cached-only study)."""


class NotComputed(Unavailable):
    """A cell the cache does not hold yet, read without computing (``cached_only``)."""


class ModelLoader:
    """Loads one model the first time a run needs it, and keeps it for the other runs of that model."""

    def __init__(self, model: str, download: bool = True, cached_only: bool = False):
        self.model, self.download, self.cached_only = model, download, cached_only
        self.loaded: LoadedModel | None = None

    def __call__(self, settings: RunSettings) -> LoadedModel:
        if self.loaded is None:
            if self.cached_only and needs_download(self.model):
                raise Unavailable("a hub model that is not downloaded here (needs internet)")
            if self.cached_only:
                raise NotComputed("not computed yet (run `effdepth book` or `effdepth grid` for its page)")
            if not self.download and needs_download(self.model):
                raise Unavailable(f"{self.model} is not downloaded (this profile sets download: false)")
            try:
                self.loaded = load_model(self.model, device=settings.device, dtype=settings.dtype)
            except EffdepthError as exc:
                raise Unavailable(str(exc)) from exc
        return self.loaded

    def bind(self, record: RunRecord):
        return lambda: self(record.settings)

    def release(self) -> None:
        self.loaded = None


def record_of(model: str, spec: Mapping, defaults: Mapping | None = None) -> RunRecord:
    """The run record of one (model, task spec): its settings, probes and precision rule."""
    settings = task_settings(model, spec, defaults)
    probes = parse_probes(spec.get("probes", registry.DEFAULT), settings)
    rule = Precision.from_spec({**(defaults or {}), **spec}.get("precision"))
    if rule is not None and not all(registry.get(p).rules for p in probes):
        rule = None  # the rule sizes runs by their ED intervals: runs of probes without ED rules keep their n
    return RunRecord(model, task_label(spec), settings, probes, precision=rule)


def compute_record(
    record: RunRecord,
    results_dir: str | Path,
    load,
    n_bootstrap: int = N_BOOTSTRAP_RUN,
    reuse_from: Sequence[str | Path] = (),
    cached_only: bool = False,
    renew_outdated: bool = False,
) -> None:
    """Fill ``record.result``: its cached run, or computed (``load()`` gives the model when needed);
    ``renew_outdated`` computes again what the cache holds from an earlier revision of a probe."""
    if record.precision is not None:
        walk = precise_run(
            record.settings,
            record.probes,
            record.precision,
            results_dir,
            reuse_from=reuse_from,
            cached_only=cached_only,
            load=load,
            n_bootstrap=n_bootstrap,
            renew_outdated=renew_outdated,
        )
        if walk.result is None:  # only when cached_only: the loader says why (a hub model, or not computed)
            load()
            raise NotComputed("not computed yet (run `effdepth book` or `effdepth grid` for its page)")
        record.result, record.walk = walk.result, walk
        return
    out_dir = default_out_dir(record.settings, results_dir, hashed=False)
    complete = is_complete(out_dir, record.settings.key(), record.probes)
    stale = renew_outdated and complete and bool(outdated_probes(out_dir, record))
    loaded = None if complete and not stale else load()
    record.result = run(
        record.settings,
        record.probes,
        out_dir,
        loaded=loaded,
        n_bootstrap=n_bootstrap,
        overwrite=True,
        reuse_from=(*reuse_from, out_dir.parent),  # the book's own runs of this model lend their prompts' rows
        renew_outdated=renew_outdated,
    )


def outdated_probes(out_dir: Path, record: RunRecord) -> list[str]:
    """The probes of a cached run that are a revision behind (``results.outdated``)."""
    from effdepth_core.results import outdated
    from effdepth_core.rundir import read_metadata

    probes = (read_metadata(out_dir) or {}).get("probes", {})
    return [p for p in record.probes if p in probes and outdated(registry.get(p), probes[p], record.settings)]


def pruning_comparison(study: Study) -> pl.DataFrame:
    """``rule_comparison`` of every run with the pruning probe, with the EDs of the same model and task
    (every rule it has, tuned lens included), plus ``model`` and ``task`` columns. Each ED is the one
    the book counts: from the run of the same model and task that asked for its probe (its own few
    prompts' ED only when there is none). A degenerate ED (``depth.degenerate``) places no block."""
    from effdepth_core.measurement.depth import degenerate

    parts = []
    labels = {**RULES, **TUNED_RULE_LABELS}
    for r in study.finished:
        if "prune" not in r.result.curves or not r.asked("prune"):
            continue
        eds = {}
        for rule, label in labels.items():
            spec, _ = registry.rules()[rule]
            counted = study.record(r.model, r.label, spec.name)
            s = counted.result.summary if counted is not None else r.result.summary
            entry = s.get(rule)
            if isinstance(entry, dict) and not degenerate(
                entry.get("ed"), entry.get("ci_low"), entry.get("ci_high"), int(s["n_layers"])
            ):
                eds[label] = entry.get("ed")  # a degenerate ED places no block: never shown as one that counts
        table = rule_comparison(r.result.curves["prune"], eds, int(r.result.summary["n_layers"]))
        parts.append(table.with_columns(pl.lit(r.model).alias("model"), pl.lit(r.label).alias("task")))
    return pl.concat(parts).select("model", "task", pl.exclude("model", "task")) if parts else pl.DataFrame()


def map_settings(pair: Mapping, defaults: Mapping | None, results_dir: str | Path) -> tuple[MapSettings, Path]:
    """The map's settings and its run directory under ``<results_dir>/map``."""
    keys = {"small", "big", "task", "n", "n_validation", "tokens_per_width", "ridge", "digits", "max_tokens", "seed"}
    unknown = sorted(set(pair) - keys)
    if unknown:
        raise EffdepthError(f"unknown map key(s) {', '.join(unknown)}; use {', '.join(sorted(keys))}")
    shared = {k: v for k, v in (defaults or {}).items() if k in ("seed", "device", "dtype", "progress")}
    settings = MapSettings(**{**shared, **pair})
    return settings, Path(results_dir) / "map" / settings.name()


def map_study(pair: Mapping, defaults: Mapping | None, results_dir: str | Path, cached_only: bool = False):
    """The cross-model linear map of ``pair`` (``small``, ``big``, ``task``, ``n`` test prompts,
    optional ``n_validation``, ``tokens_per_width``, ``ridge``, ``digits``, ``max_tokens``), kept in a
    run directory under ``<results_dir>/map``; with ``cached_only`` an empty frame when it is not
    computed yet."""
    settings, out = map_settings(pair, defaults, results_dir)
    if cached_only and not is_complete(out, settings.key(), ["map"], summary=False):
        return pl.DataFrame()
    return run_map(settings, out)


__all__ = [
    "RULES",
    "RunRecord",
    "Study",
    "difficulty_specs",
    "difficulty_trend",
    "expand_levels",
    "map_settings",
    "map_study",
    "pruning_comparison",
    "run_study",
    "task_label",
    "task_settings",
]
