"""The grid's cost model against the clock: estimated ÷ measured for every cell of a profile.

    python benchmarks/grid_cost.py [--profile quick] [--calibrate-from book/results]

The rates come from the runs cached under ``--calibrate-from`` (by default the committed full
profile); the profile is then computed from scratch in a temporary copy of ``params/`` (its
results folders moved into a temporary directory, so nothing of the checkout changes), cell by
cell, and each cell's estimate is printed beside its measured probe time (the ``seconds`` its runs
recorded) and its wall time (which also holds loading the model, the first time a unit needs it).
A cell that cannot run here (a hub model offline) is listed and left out of the totals.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from effdepth_book.cost import Calibration
from effdepth_book.grid import cells, run_unit, units

ROOT = Path(__file__).resolve().parents[1]


def _moved_params(target: Path, results: Path) -> None:
    """params/ with every results_dir under ``results`` (comments are not kept: a scratch copy)."""
    (target / "params").mkdir(parents=True)
    for path in sorted((ROOT / "params").glob("*.yml")):
        data = yaml.safe_load(path.read_text())

        def move(node):
            if isinstance(node, dict):
                return {k: (str(results / v) if k == "results_dir" else move(v)) for k, v in node.items()}
            if isinstance(node, list):
                return [move(v) for v in node]
            return node

        (target / "params" / path.name).write_text(yaml.safe_dump(move(data), sort_keys=False))


def _recorded_seconds(cell) -> float:
    """Probe seconds recorded by the runs the cell wrote (its directories that exist)."""
    if not hasattr(cell, "record"):  # the map keeps its own time: not a probe run
        return 0.0
    total = 0.0
    for directory in cell.directories():
        metadata_path = directory / "metadata.json"
        if metadata_path.is_file():
            metadata = json.loads(metadata_path.read_text())
            total += sum(float(r.get("seconds", 0)) for p, r in metadata["probes"].items() if p in cell.record.probes)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="quick", choices=["quick", "full"])
    parser.add_argument("--calibrate-from", type=Path, default=ROOT / "book" / "results")
    args = parser.parse_args()

    calibration = Calibration.from_cache([args.calibrate_from.resolve()])
    models = sorted({m.model for m in calibration.measurements})
    print(f"calibrated on {len(calibration.measurements)} probe runs of {', '.join(models)} ({args.calibrate_from})")
    scratch = Path(tempfile.mkdtemp(prefix="effdepth-grid-cost-"))
    try:
        _moved_params(scratch, scratch / "results")
        os.chdir(scratch)
        plan = units(cells(scratch, args.profile))
        rows = []
        print(f"{'cell':<92s} {'estimated':>10s} {'probes':>8s} {'wall':>8s} {'est÷probes':>10s}")
        for unit in plan:
            for cell in unit:
                if hasattr(cell, "record"):
                    cell.record.settings.progress = False
            estimates = {id(c): c.estimate(calibration).cpu_seconds for c in unit}
            started = [time.perf_counter()]

            def report(outcome, estimates=estimates, started=started) -> None:
                wall = time.perf_counter() - started[0]
                started[0] = time.perf_counter()
                estimate = estimates[id(outcome.cell)]
                probes = _recorded_seconds(outcome.cell) if outcome.status == "done" else None
                rows.append((outcome, estimate, probes, wall))
                ratio = f"{estimate / probes:10.2f}" if estimate and probes else f"{'—':>10s}"
                print(
                    f"{outcome.cell.name[:92]:<92s} {_s(estimate):>10s} {_s(probes):>8s} {_s(wall):>8s} {ratio}"
                    + ("" if outcome.status == "done" else f"  ({outcome.status})"),
                    flush=True,
                )

            run_unit(unit, report)
        done = [(e, p, w) for o, e, p, w in rows if o.status == "done" and e is not None and p is not None]
        estimated, probes, wall = (sum(x[i] for x in done) for i in range(3))
        print(
            f"profile {args.profile}: {len(done)} cells measured; estimated {estimated:.0f} s, probes {probes:.0f} s "
            f"(estimated ÷ measured {estimated / probes:.2f}), wall {wall:.0f} s with model loads "
            f"(estimated ÷ wall {estimated / wall:.2f})"
        )
    finally:
        os.chdir(ROOT)
        shutil.rmtree(scratch, ignore_errors=True)


def _s(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.1f} s"


if __name__ == "__main__":
    main()
