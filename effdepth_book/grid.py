"""The book's grid of runs as a plan: every (page, model, task spec) cell of a params profile, its
state in the cache and its estimated cost (``book/cost.py``), and its computation — here one cell after
another (``run_local``), a slice of it (``shard``: one job of a Slurm array), or spread over a Ray
cluster (``executors.run_ray``). The cells are the runs the notebooks make (``sections.plans``), so
the pages then render from the cache without model work.

Cells that may share run directories or lend each other examples (one model on one task, any
probes, any n) form one *unit*: a unit is computed in plan order by one process, so every executor
writes the same bytes. Two processes never write one run directory at once (its lock); a cell whose
directory another process holds is left to it (``busy``) and picked up by a rerun."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from effdepth_core.errors import EffdepthError
from effdepth_core.results import peak_rss_mb
from effdepth_core.rundir import DirectoryBusyError, is_complete, read_metadata
from effdepth_core.settings import RunSettings, check_settings, default_out_dir, run_name, slug

from . import sections as book_sections
from .cost import GPU_OPS_PER_SECOND, NOTHING, Calibration, Estimate, estimate, shape_of, task_lengths
from .precision import Precision, walk_plan
from .runner import parameter_sets
from .sections import defaults, plans
from .study import ModelLoader, RunRecord, compute_record, map_settings, outdated_probes, record_of


@dataclass
class Cell:
    """One run of the book: a model on a task spec, as one page's study makes it."""

    section: str
    page: str
    study: str
    record: RunRecord
    results_dir: Path
    reuse_from: tuple[Path, ...] = ()
    download: bool = True

    @property
    def model(self) -> str:
        return self.record.model

    @property
    def settings(self) -> RunSettings:
        return self.record.settings

    @property
    def name(self) -> str:
        probes = ",".join(self.record.probes)
        n = f"n≤{self.record.precision.n_max}" if self.record.precision else f"n={self.settings.n}"
        return f"{self.model} · {self.record.label} · {probes} · {n}"

    @property
    def key(self) -> tuple:
        """Cells of two pages that make the same run are one cell."""
        rule = self.record.precision
        return (str(self.results_dir), self.settings.key(), tuple(self.record.probes), rule)

    @property
    def unit(self) -> tuple:
        """Cells of one unit share run directories or lend each other examples (the module's docstring)."""
        name = run_name(self.settings.replace(n=1)).replace("-n1-", "-")
        return (slug(self.model), name)

    def directories(self) -> dict[Path, str]:
        """Every run directory the cell may write (a precision walk: each n it may step to) → the
        settings key of the run written there."""
        rule = self.record.precision
        if rule is None:
            sizes = [self.settings.n]
        else:
            steps = range(rule.step, rule.n_max + 1, rule.step)
            sizes = sorted({rule.n_min, rule.n_max, *(n for n in steps if n > rule.n_min)})
        found = {}
        for n in sizes:
            step = self.settings.replace(n=n)
            found[default_out_dir(step, self.results_dir, hashed=False)] = step.key()
        return found

    def _todo(self) -> tuple[str, list[str], int]:
        """State, the probes still to compute and the examples already measured."""
        rule = self.record.precision
        if rule is not None:
            plan = walk_plan(self.settings, self.record.probes, rule, self.results_dir)
            done = max(plan.steps, default=0)
            if plan.next_n is None and plan.steps:  # finished: a probe a revision behind renews the walk
                last = default_out_dir(self.settings.replace(n=done), self.results_dir, hashed=False)
                stale = outdated_probes(last, self.record)
                return ("stale" if stale else "cached"), stale, 0
            return plan.state, (list(self.record.probes) if plan.next_n else []), done
        out = default_out_dir(self.settings, self.results_dir, hashed=False)
        if is_complete(out, self.settings.key(), self.record.probes):
            stale = outdated_probes(out, self.record)
            return ("stale" if stale else "cached"), stale, 0
        metadata = (read_metadata(out) or {}) if out.is_dir() else {}
        recorded = metadata.get("probes", {}) if metadata.get("key") == self.settings.key() else {}
        return "missing", [p for p in self.record.probes if p not in recorded], 0

    def quiet(self) -> None:
        """No progress bars of its own (the grid draws one)."""
        self.record.settings.progress = False

    def state(self) -> str:
        """``cached`` (every run it needs is finished), ``partial`` (a precision walk under way),
        ``stale`` (cached, but from an earlier revision of a probe) or ``missing``."""
        return self._todo()[0]

    def estimate(self, calibration: Calibration) -> Estimate:
        """What computing the rest of the cell costs (a precision walk: up to its cap, at most)."""
        _, probes, done = self._todo()
        if not probes:
            return NOTHING
        rule = self.record.precision
        if shape_of(self.settings.model, calibration) is None:  # unknown whatever the prompts: do not read them
            return estimate(self.settings, probes, [], calibration)
        if rule is None:
            return estimate(self.settings, probes, task_lengths(self.settings), calibration)
        lengths = task_lengths(self.settings, rule.n_max)[done:]  # the walk reuses what it measured
        return estimate(self.settings, probes, lengths, calibration)

    def compute(self, loader: ModelLoader | None) -> tuple[str, ModelLoader]:
        if loader is None or loader.model != self.model:
            loader = ModelLoader(self.model, download=self.download)
        compute_record(
            self.record, self.results_dir, loader.bind(self.record), reuse_from=self.reuse_from, renew_outdated=True
        )
        walk, rule = self.record.walk, self.record.precision
        return (walk.reason(rule) if walk is not None and rule is not None else "done"), loader


@dataclass
class MapCell:
    """The cross-model linear map of a page (two models; its own run directory)."""

    section: str
    page: str
    pair: dict
    shared: dict
    results_dir: Path
    study: str = "map"

    @property
    def model(self) -> str:
        return f"{self.pair['small']} → {self.pair['big']}"

    @property
    def name(self) -> str:
        return f"map {self.model} · {self.pair.get('task', 'gsm8k')} · n={self.pair.get('n', 20)} test prompts"

    @property
    def key(self) -> tuple:
        return (str(self.results_dir), "map", tuple(sorted(self.pair.items())))

    @property
    def unit(self) -> tuple:
        return ("map", *self.key)

    def state(self) -> str:
        settings, out = map_settings(self.pair, self.shared, self.results_dir)
        return "cached" if is_complete(out, settings.key(), ["map"], summary=False) else "missing"

    def estimate(self, calibration: Calibration) -> Estimate:
        """Both models' forward passes over the map's prompts, and a least-squares fit per layer pair."""
        if self.state() == "cached":
            return NOTHING
        settings, _ = map_settings(self.pair, self.shared, self.results_dir)
        small, big = shape_of(settings.small, calibration), shape_of(settings.big, calibration)
        if small is None or big is None:
            return Estimate(None, None, "map: a model's shape unknown")
        tokens = settings.tokens_per_width * small.d_model * 1.2  # and the held-out prompts, ~20 % more
        pairs = (small.n_layers + 1) * (big.n_layers + 1)
        work = (small.forward + big.forward) * tokens + pairs * 2 * tokens * small.d_model * big.d_model
        rate, source = calibration.rate("map", "map", small.n_params)

        return Estimate(None if rate is None else work * rate, work / GPU_OPS_PER_SECOND, f"map {source}")

    def quiet(self) -> None:
        """No progress bars of its own (the grid draws one)."""
        self.shared = {**self.shared, "progress": False}

    def compute(self, loader: ModelLoader | None) -> tuple[str, None]:
        from .study import map_study

        map_study(self.pair, self.shared, self.results_dir)
        return "done", None


AnyCell = Cell | MapCell


def cells(root: Path, profile: str = "full", sections: Sequence[str] | None = None) -> list[AnyCell]:
    """Every distinct cell of the profile's pages, in book order (a section's pages, their studies,
    each study's models and specs). Every results folder of the profile may lend examples to the
    others (``reuse_from``)."""
    found: dict[tuple, AnyCell] = {}
    items = [s for section in (sections or book_sections.names()) for s in parameter_sets(root, section, profile)]
    roots = tuple(dict.fromkeys(Path(s.parameters.get("results_dir", "results")) for s in items))
    for item in items:
        shared = defaults(item.parameters)
        results_dir = Path(item.parameters.get("results_dir", "results"))
        if item.parameters.get("pair"):
            cell = MapCell(item.section, item.name, dict(item.parameters["pair"]), shared, results_dir)
            found.setdefault(cell.key, cell)
        for plan in plans(item.section, item.parameters):
            for model in plan.models:
                for spec in plan.specs_by_model.get(model, plan.specs):
                    try:
                        record = record_of(model, spec, shared)
                        check_settings(record.settings, record.probes)
                    except EffdepthError as exc:  # a value in params/, not a flag: name the page
                        raise EffdepthError(f"params/{item.section}.yml, page {item.name}, {model}: {exc}") from exc
                    cell = Cell(item.section, item.name, plan.name, record, results_dir, roots, plan.download)
                    found.setdefault(cell.key, cell)
    _check_distinct([c for c in found.values() if isinstance(c, Cell)])
    return list(found.values())


def _check_distinct(plan: Sequence[Cell]) -> None:
    """Two cells whose runs differ must not share a run directory (the book's results tree names a
    run by task, n, seed, level and digits only: its other settings live in params/)."""
    owners: dict[Path, tuple[str, Cell]] = {}
    for cell in plan:
        for path, key in cell.directories().items():
            key_and_cell = owners.setdefault(path, (key, cell))
            if key_and_cell[0] != key:
                other = key_and_cell[1]
                raise EffdepthError(
                    f"params: {other.section}/{other.page} ({other.name}) and {cell.section}/{cell.page} "
                    f"({cell.name}) would both write {path} with different settings; give one of them another "
                    "n, seed or results_dir in params/"
                )


def units(plan: Sequence[AnyCell]) -> list[list[AnyCell]]:
    """The plan's cells grouped into units (in plan order, by first appearance)."""
    grouped: dict[tuple, list[AnyCell]] = {}
    for cell in plan:
        grouped.setdefault(cell.unit, []).append(cell)
    return list(grouped.values())


def parse_shard(text: str) -> tuple[int, int]:
    """``i/N`` → (i, N), with 0 ≤ i < N."""
    index, _, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise EffdepthError(f"--shard must be i/N (e.g. 0/4), got {text!r}") from None
    if n < 1:
        raise EffdepthError(f"--shard {text}: N must be at least 1")
    if not 0 <= i < n:
        raise EffdepthError(f"--shard {text}: i must be 0..N-1")
    return i, n


def shard(groups: Sequence[list[AnyCell]], index: int, count: int) -> list[list[AnyCell]]:
    """Shard ``index`` of ``count``: every count-th unit of the plan (the same slice whatever the
    cache holds, so the jobs of an array never overlap)."""
    return [unit for position, unit in enumerate(groups) if position % count == index]


@dataclass(frozen=True)
class Outcome:
    """How one cell ended: ``done`` (with why a precision walk stopped), ``busy``, ``unavailable``."""

    cell: AnyCell
    status: str
    detail: str = ""
    seconds: float = 0.0
    peak_rss_mb: float = 0.0

    def line(self) -> str:
        cost = f" ({self.seconds:.0f} s, peak resident {self.peak_rss_mb:.0f} MB)" if self.status == "done" else ""
        return f"  {self.status}{': ' + self.detail if self.detail else ''}{cost}"


def run_unit(unit: Sequence[AnyCell], log: Callable[[Outcome], None] = lambda outcome: None) -> list[Outcome]:
    """Compute a unit's cells in order in this process (one model load per model in a row)."""
    from .study import Unavailable

    outcomes, loader = [], None
    for cell in unit:
        started = time.perf_counter()
        try:
            detail, loader = cell.compute(loader)
            outcome = Outcome(cell, "done", detail, time.perf_counter() - started, peak_rss_mb())
        except Unavailable as exc:
            outcome = Outcome(cell, "unavailable", str(exc))
        except DirectoryBusyError:
            outcome = Outcome(cell, "busy", "another effdepth process is computing it; rerun to pick it up")
        except EffdepthError as exc:  # this cell cannot be computed: say why, go on with the others
            outcome = Outcome(cell, "failed", " ".join(str(exc).split()))
            loader = None
        outcomes.append(outcome)
        log(outcome)
    return outcomes


def run_local(groups: Sequence[Sequence[AnyCell]], log: Callable[[str], None] = print, progress=None) -> list[Outcome]:
    """Compute the units one after another in this process."""
    total = sum(len(u) for u in groups)
    done: list[Outcome] = []

    def report(outcome: Outcome) -> None:
        done.append(outcome)
        log(f"[{len(done)}/{total}] {outcome.cell.name}\n{outcome.line()}")
        if progress is not None:
            progress(outcome)

    for unit in groups:
        run_unit(unit, report)
    return done


# --- a plan of the grid, its cost, its computation with one progress bar ---------------------------


def hours(seconds: float | None) -> str:
    """A duration as the grid prints it (s, min or h)."""
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.1f} min"


@dataclass
class GridPlan:
    """The cells of a profile (or of one shard), each with its state and estimated cost, and the
    units still to compute."""

    rows: list[tuple[str, Estimate, AnyCell]]  # (state, cost, cell) in plan order
    todo: list[list[AnyCell]]
    estimates: dict[int, Estimate]  # id(cell) → its cost
    calibration: Calibration
    n_units: int

    @property
    def n_cells(self) -> int:
        return len(self.rows)

    @property
    def n_todo(self) -> int:
        return sum(len(u) for u in self.todo)

    def cost_line(self) -> str:
        """The estimated cost of the cells to compute, and what the estimate rests on."""
        costs = [self.estimates[id(c)] for u in self.todo for c in u]
        cpu = [c.cpu_seconds for c in costs if c.cpu_seconds is not None]
        gpu = [c.gpu_seconds for c in costs if c.gpu_seconds is not None]
        unknown = len(costs) - len(cpu)
        models = len({m.model for m in self.calibration.measurements})
        return (
            f"effdepth grid: estimated {sum(cpu) / 3600:.2f} CPU hours (rates measured on this machine's cached "
            f"runs of {models} model(s)); on one H200 GPU {hours(sum(gpu))} (the rates benchmarks/paper_scale.py "
            f"measured there, bfloat16; pruning, early exit, the tuned lens and the map at an assumed "
            f"{GPU_OPS_PER_SECOND:.1e} operations/s)" + (f"; {unknown} cell(s) of unknown cost" if unknown else "")
        )


def plan_grid(
    root: Path, profile: str = "full", sections: Sequence[str] | None = None, slice_: tuple[int, int] | None = None
) -> GridPlan:
    """The grid's cells (of one shard with ``slice_``), their states and costs, and what is left."""
    plan = cells(root, profile, sections)
    groups = units(plan)
    n_units = len(groups)
    if slice_ is not None:
        groups = shard(groups, *slice_)
    calibration = Calibration.from_cache(sorted({c.results_dir for unit in groups for c in unit}))
    rows, todo, estimates = [], [], {}
    for unit in groups:
        kept = []
        for cell in unit:
            state, cost = cell.state(), cell.estimate(calibration)
            estimates[id(cell)] = cost
            rows.append((state, cost, cell))
            if state != "cached":
                kept.append(cell)
        if kept:
            todo.append(kept)
    return GridPlan(rows, todo, estimates, calibration, n_units)


__all__ = [
    "Cell",
    "GridPlan",
    "MapCell",
    "Outcome",
    "Precision",
    "cells",
    "hours",
    "parse_shard",
    "plan_grid",
    "run_local",
    "run_unit",
    "shard",
    "units",
]
