"""README's main run, before and after (issue 49's goal: ≥ 2× faster on this machine).

Times README's set-up command's run (``effdepth run --model smollm2-135m --task gsm8k --n 10``) as a
user starts it, a fresh process each time with a fresh ``--out`` (nothing cached but the model's
files), for each checkout given: ``--before DIR`` is an older checkout of this repository (e.g. a
``git worktree add`` of the commit before a change), the current tree is "after". The runs
alternate (before, after, before, …) so that a slow spell of the machine hits both; a warm-up run of
each comes first. Prints each variant's wall seconds (median, min–max), the ratio of the medians,
and the tables the runs print, which must agree.

    python benchmarks/main_run.py --before ../effdepth-before [--repeats 5] [--after-args "--head-dtype float32"]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import alternating

ROOT = Path(__file__).resolve().parent.parent
README_RUN = ["run", "--model", "smollm2-135m", "--task", "gsm8k", "--n", "10", "--no-progress"]


def run_once(checkout: Path, extra: list[str], out: Path) -> str:
    """One run of ``checkout``'s code in a fresh interpreter; the table it printed."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, "-m", "effdepth_core.cli", *README_RUN, *extra, "--out", str(out)]
    done = subprocess.run(command, env=env, cwd=checkout, capture_output=True, text=True, check=True)
    return "\n".join(line for line in done.stdout.splitlines() if line and not line.startswith("results in"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="an older checkout of this repository")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before-args", default="", help="extra run options for the older checkout")
    parser.add_argument("--after-args", default="", help="extra run options for this tree")
    args = parser.parse_args()
    variants = {
        "before": (args.before.resolve(), shlex.split(args.before_args)),
        "after": (ROOT, shlex.split(args.after_args)),
    }
    load = os.getloadavg()[0]
    print(f"README's main run: effdepth {' '.join(README_RUN)}; {os.cpu_count()} CPUs, load average {load:.2f}")
    for name, (checkout, extra) in variants.items():
        git = ["git", "-C", str(checkout)]
        head = subprocess.run([*git, "log", "-1", "--format=%h %s"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        edited = " + uncommitted edits" if dirty.stdout.strip() else ""
        print(f"  {name}: {checkout.name} at {head[:80]}{edited} {' '.join(extra)}")
    tables: dict[str, set[str]] = {name: set() for name in variants}
    with tempfile.TemporaryDirectory() as scratch:
        runs = itertools.count()

        def call(name: str) -> None:
            checkout, extra = variants[name]
            start = time.perf_counter()
            tables[name].add(run_once(checkout, extra, Path(scratch) / f"{name}-{next(runs)}"))
            print(f"  {name}: {time.perf_counter() - start:.1f} s", flush=True)

        calls = {name: functools.partial(call, name) for name in variants}
        for warm_up in calls.values():  # not counted
            warm_up()
        timings = alternating(calls, args.repeats)
    for name, t in timings.items():
        print(f"{name:6s}: median {t.median:.1f} s (min {t.low:.1f}, max {t.high:.1f}, {len(t.runs)} runs)")
    ratio = timings["before"].median / timings["after"].median
    print(f"before ÷ after (medians): {ratio:.2f}×; load average at the end {os.getloadavg()[0]:.2f}")
    same = len(tables["before"] | tables["after"]) == 1
    print("tables: " + ("identical in every run" if same else "DIFFER"))
    for table in sorted(tables["before"] | tables["after"]):
        print(table)


if __name__ == "__main__":
    main()
