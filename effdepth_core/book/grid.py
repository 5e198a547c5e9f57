"""The book's grid of runs as a plan: every (page, model, task spec) cell of a params profile, its
state in the cache, and its computation — one cell after another here (``run_local``), or spread
over machines (``effdepth grid --executor``). The cells are the runs the notebooks make
(``sections.plans``), so the pages then render from the cache without model work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..precision import Precision, precise_run
from ..rundir import is_complete
from ..settings import RunSettings, default_out_dir
from .runner import SECTIONS, parameter_sets
from .sections import defaults, plans
from .study import ModelLoader, RunRecord, compute_record, outdated_probes, record_of


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
    depends: list[str] = field(default_factory=list)

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

    def state(self) -> str:
        """``cached`` (every run it needs is finished), ``partial`` (a precision walk under way),
        ``stale`` (cached, but from an earlier revision of a probe) or ``missing``."""
        if self.record.precision is not None:
            walk = precise_run(
                self.settings, self.record.probes, self.record.precision, self.results_dir, cached_only=True
            )
            if walk.stopped != "not computed":
                return "cached"
            return "partial" if walk.steps else "missing"
        out = default_out_dir(self.settings, self.results_dir, hashed=False)
        if not is_complete(out, self.settings.key(), self.record.probes):
            return "missing"
        return "stale" if outdated_probes(out, self.record) else "cached"


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

    def state(self) -> str:
        from .study import map_study

        return "cached" if map_study(self.pair, self.shared, self.results_dir, cached_only=True).height else "missing"

    def compute(self) -> str:
        from .study import map_study

        map_study(self.pair, self.shared, self.results_dir)
        return "done"


def cells(root: Path, profile: str = "full", sections: Sequence[str] | None = None) -> list[Cell | MapCell]:
    """Every distinct cell of the profile's pages, in book order (a section's pages, their studies,
    each study's models and specs). Every results folder of the profile may lend examples to the
    others (``reuse_from``)."""
    found: dict[tuple, Cell] = {}
    items = [s for section in (sections or SECTIONS) for s in parameter_sets(root, section, profile)]
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
                    record = record_of(model, spec, shared)
                    cell = Cell(item.section, item.name, plan.name, record, results_dir, roots, plan.download)
                    found.setdefault(cell.key, cell)
    return list(found.values())


def run_local(todo: Sequence[Cell | MapCell], progress: bool = True, log=print) -> list[tuple[Cell | MapCell, str]]:
    """Compute the cells one after another, loading each model once for its cells in a row."""
    from .study import Unavailable

    done: list[tuple[Cell, str]] = []
    loader: ModelLoader | None = None
    for index, cell in enumerate(todo, start=1):
        log(f"[{index}/{len(todo)}] {cell.name}")
        if isinstance(cell, MapCell):
            loader = None  # the map loads its two models itself
            done.append((cell, cell.compute()))
            log("  done")
            continue
        if loader is None or loader.model != cell.model:
            loader = ModelLoader(cell.model, download=cell.download)
        try:
            compute_record(
                cell.record, cell.results_dir, loader.bind(cell.record), reuse_from=cell.reuse_from, renew_outdated=True
            )
        except Unavailable as exc:
            done.append((cell, f"unavailable: {exc}"))
            log(f"  unavailable: {exc}")
            continue
        walk = cell.record.walk
        rule = cell.record.precision
        outcome = walk.reason(rule) if walk is not None and rule is not None else "done"
        done.append((cell, outcome))
        log(f"  {outcome}")
    return done


__all__ = ["Cell", "MapCell", "Precision", "cells", "run_local"]
