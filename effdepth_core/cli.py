"""The ``effdepth`` command line: run | probes | models | table | plot | map | book | grid. It parses and
prints; the work is the library's (``results``, ``display``, ``zoo``, ``book``). Each probe's flags
come from its spec (``registry.py``) and load only for the command that needs them, so
``effdepth --help`` starts without torch."""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from .cli_args import HEAVY_COMMANDS, build_parser
from .errors import EffdepthError
from .terminal import EscapingStream


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not an option)."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


def _settings(args: argparse.Namespace):
    """RunSettings from the command line, with the checks only the command line can make (was an
    option given at all?)."""
    from .measurement import registry
    from .settings import RunSettings
    from .task_loading import check_task
    from .tasks import ARITHMETIC

    if not args.model:
        raise EffdepthError(
            "--model is empty; give an offline alias (see `effdepth models`), a folder, a .gguf or a hub id"
        )
    check_task(args.task)
    if args.digits is not None and args.task not in ARITHMETIC:
        raise EffdepthError(f"--digits applies to addition and multiplication only, not {args.task!r}")
    options = {name: getattr(args, name) for name in registry.options() if hasattr(args, name)}
    return RunSettings(
        args.model,
        args.task,
        n=args.n,
        seed=args.seed,
        source=args.source,
        level=args.level,
        digits=args.digits or 6,
        max_tokens=args.max_tokens,
        positions=getattr(args, "positions", None),
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        method="slow" if args.slow else "fast",
        device_map=args.device_map,
        progress=not args.no_progress,
        **options,
    )


def _quiet(args: argparse.Namespace) -> None:
    """--no-progress: no bar at all, --debug or not (``main`` set TQDM_DISABLE before tqdm loaded)."""
    if args.no_progress:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _cmd_run(args: argparse.Namespace) -> int:
    _quiet(args)
    from .display import format_table
    from .models import quiet_libraries
    from .results import run
    from .settings import parse_probes

    settings = _settings(args)
    probes = parse_probes(args.probes, settings)  # fail on a typo before loading anything
    _check_used(args, settings, probes)
    for root in args.reuse_from:
        if not root.expanduser().is_dir():
            raise EffdepthError(f"--reuse-from {root} is not a directory; give a results folder")
    if not args.debug:
        quiet_libraries(progress=not args.no_progress)
    result = run(
        settings,
        probes=args.probes,
        out_dir=args.out,
        overwrite=args.overwrite,
        reuse_from=args.reuse_from,
        results_root="results",  # the command line's documented default: ./results/<model>/<run>
    )
    print(format_table([result.summary], wide=args.wide))
    cached = [name for name in result.summary_probes() if name not in result.computed]
    if cached and not result.computed:
        print(f"read from the cache: every probe ({', '.join(cached)}) was computed before in this run directory")
    elif cached:
        print(f"read from the cache: {', '.join(cached)}; computed now: {', '.join(result.computed)}")
    measured = _measured_text(result.out_dir)
    if measured:
        print(measured)
    print(f"\nresults in {result.out_dir}/")
    return 0


def _measured_text(out_dir: Path) -> str | None:
    """The line that says what text the run measured (from its ``examples.jsonl``): prompt + answer,
    as ``measure(..., with_answer=True)`` does, or the prompts alone where no example has an answer."""
    import json

    try:
        rows = [json.loads(line) for line in (out_dir / "examples.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    answered = sum(1 for row in rows if isinstance(row, dict) and row.get("answer"))
    cut = {row["meta"]["positions"] for row in rows if isinstance(row, dict) and "positions" in (row.get("meta") or {})}
    if cut:
        return (
            f"measured text: each example's prompt + answer cut to its first {min(cut)} tokens (--positions): "
            f"{answered} of {len(rows)} cuts reach the answer"
        )
    if not answered:
        return "measured text: each example's prompt (none has an answer)"
    return (
        f"measured text: each example's prompt + answer ({answered} of {len(rows)} have one; "
        "measure(..., with_answer=False): the prompts alone)"
    )


def _check_used(args: argparse.Namespace, settings, probes: list[str]) -> None:
    """A probe option given on the command line that none of the probes run uses is a mistake."""
    from .measurement import registry
    from .settings import parse_probes

    for name, option in registry.options().items():
        if getattr(args, name, option.default) == option.default:
            continue
        if any(name in (o.name for o in registry.get(p).options) for p in probes):
            continue
        if parse_probes(args.probes, settings.replace(**{name: option.default})) != probes:
            continue  # it chose which probes run (--lens)
        owners = [p for p, spec in registry.specs().items() if name in (o.name for o in spec.options)]
        raise EffdepthError(
            f"{option.cli_flag} applies to {', '.join(owners)}, which --probes {args.probes} does not run; "
            f"add one of them to --probes or drop {option.cli_flag}"
        )


def _cmd_probes(args: argparse.Namespace) -> int:
    """Every registered probe (built-in and plugins): its name, what it measures, its ED rules and
    its options, one block each; `effdepth run --probes` takes the names."""
    from .cli_args import _option_users
    from .measurement import registry

    users = _option_users()
    for name, spec in registry.specs().items():
        default = " (run by default)" if name in registry.DEFAULT else ""
        print(f"{name}{default}: {spec.description or spec.title}")
        if spec.rules:
            rules = ", ".join(f"{rule.key} ({rule.label})" for rule in spec.rules)
            print(f"  ED rules: {rules}")
        flags = [option.cli_flag for option in registry.options().values() if name in users[option.name]]
        if flags:
            print(f"  options: {' '.join(flags)}")
        if spec.needs_answers:
            print("  needs examples with an answer (a data set, or a .jsonl line with 'answer')")
    print("\nrun them with: effdepth run --probes NAME,NAME (effdepth run --help: every option)")
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from .acquire import dequantized_folders, refetch
    from .zoo import ZOO, cache_dir, cache_state, check_cache_dir, corrupted_message, format_provenance

    check_cache_dir()
    if args.refetch is not None:
        if args.refetch not in ZOO:
            raise EffdepthError(f"unknown offline model {args.refetch!r}; known: {', '.join(ZOO)}")
        path = refetch(args.refetch, progress=not args.no_progress)
        print(f"effdepth: fetched and verified {path}")
        return 0
    if args.info:
        print(format_provenance())
        return 0
    print(f"offline models (cache: {cache_dir()}; set EFFDEPTH_CACHE to move it)")
    corrupted, unusable = [], []
    for alias, entry in ZOO.items():
        state = cache_state(alias, full=args.verify)
        label = {
            "missing": f"not cached, {entry.download_mb} MB download",
            "verified": "cached, sha256 verified",
            "unverified": "cached, changed since its last check: re-hashed on next load (or --verify now)",
            "corrupted": "CORRUPTED",
        }[state]
        folders = dequantized_folders(alias, full=args.verify) if state != "missing" else []
        words = {
            "ready": "verified",
            "damaged": "DAMAGED, rebuilt from the GGUF on the next load",
            "other": "stale, replaced on the next load",
            "foreign": "no effdepth marker: delete it to rebuild",
        }
        if folders:  # loads read these in seconds instead of parsing the GGUF
            label += "; dequantized weights: " + ", ".join(f"{dtype} ({words[s]})" for dtype, s in folders)
        print(f"  {alias:<20} {entry.description}  [{label}]")
        if state == "corrupted":
            corrupted.append(alias)
        unusable += [f"{alias} {dtype}" for dtype, s in folders if s == "damaged"]
    print("any Hugging Face hub id, local model directory or .gguf file also works with --model")
    for alias in corrupted:
        print(f"effdepth: error: {corrupted_message(alias)}", file=sys.stderr)
    if args.verify and unusable:
        print(f"effdepth: error: damaged dequantized weights: {', '.join(unusable)}", file=sys.stderr)
    return 1 if corrupted or (args.verify and unusable) else 0


def _book_extra() -> None:
    import importlib.util

    missing = [
        name
        for name in ("altair", "papermill", "yaml", "jupyter_book", "great_tables", "vl_convert")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise EffdepthError(
            f"this command needs the book extra ({', '.join(missing)} missing): pip install 'effdepth[book]'"
        )


def _cmd_map(args: argparse.Namespace) -> int:
    _quiet(args)
    out = args.out.expanduser() if args.out else None
    if out is not None and (out.suffix != ".parquet" or out.exists() or out.is_symlink() or not out.parent.is_dir()):
        raise EffdepthError(f"--out {out} must be a new .parquet file in an existing directory")
    from .display import format_map
    from .map_run import run_map
    from .models import quiet_libraries
    from .settings import MapSettings

    settings = MapSettings(
        small=args.small,
        big=args.big,
        task=args.task,
        n=args.n,
        n_validation=args.n_validation,
        tokens_per_width=args.tokens_per_width,
        seed=args.seed,
        digits=args.digits,
        max_tokens=args.max_tokens,
        ridge=args.ridge,
        device=args.device,
        dtype=args.dtype,
        progress=not args.no_progress,
    )
    settings.check()
    if not args.debug:
        quiet_libraries(progress=not args.no_progress)
    frame = run_map(settings, args.map_dir)
    print(format_map(frame))
    if out is not None:
        from .cache import atomic_write_parquet

        atomic_write_parquet(out, frame, "the map is cached in its run folder", replace=False)
        print(f"effdepth: wrote {out}")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from .measurement import registry
    from .rundir import check_recorded, read_cached_frame, read_metadata

    run_dir, out = args.run_dir.expanduser(), args.out.expanduser()
    if out.suffix not in (".svg", ".png"):
        raise EffdepthError(f"--out must end in .svg or .png, not {out.name!r}")
    if not out.parent.is_dir():
        raise EffdepthError(f"--out {out}: no such directory {out.parent}")
    if out.exists() or out.is_symlink():
        raise EffdepthError(f"--out {out} exists; effdepth does not overwrite files: choose another name")
    from .cache import remove_dead_temporaries

    remove_dead_temporaries(out.parent, lambda name: name.endswith((".svg", ".png")))  # a killed plot's
    metadata = read_metadata(run_dir)
    if metadata is None:
        raise EffdepthError(f"{run_dir} is not an effdepth run directory (no effdepth metadata.json)")
    ran = metadata.get("probes", {})
    if args.chart is None:  # the first chart of the first probe (in the registry's order) the run has
        found = [c.name for s in registry.specs().values() if s.name in ran for c in s.charts]
        if not found:
            raise EffdepthError(
                f"none of the probes run in {run_dir} ({', '.join(ran) or 'none'}) draws a chart; "
                f"read its results with `effdepth table {run_dir}`"
            )
        args.chart = found[0]
    (probe, chart) = next((s.name, c) for s in registry.specs().values() for c in s.charts if c.name == args.chart)
    source = run_dir / f"{chart.frame}.parquet"
    if probe not in ran or not source.is_file():
        raise EffdepthError(f"{run_dir} has no {probe} results; run `effdepth run --probes {probe}` there first")
    _book_extra()
    import polars as pl

    from effdepth_book import plots

    check_recorded(run_dir, metadata, probe)
    frame = read_cached_frame(source)
    options = chart.options(frame) if chart.options else {}
    label = metadata.get("settings", {})
    try:
        builder = chart.builder if callable(chart.builder) else getattr(plots, chart.builder)
        drawn = builder(frame, model=label.get("model"), task=label.get("task"), **options)
    except (pl.exceptions.PolarsError, KeyError) as exc:
        raise EffdepthError(f"{source} does not hold what a {args.chart} chart needs ({type(exc).__name__})") from exc
    if isinstance(drawn, plots.Note):
        raise EffdepthError(f"{source} holds no values to draw")
    try:
        plots.save(drawn, out, replace=False)  # claimed now: a file that appeared since the check stays
    except OSError as exc:
        raise EffdepthError(f"cannot write --out {out} ({exc.strerror or exc})") from exc
    print(f"effdepth: wrote {out}")
    return 0


def _cmd_book(args: argparse.Namespace) -> int:
    _book_extra()
    from effdepth_book import sections as book_sections
    from effdepth_book.runner import (
        execute,
        find_set,
        parameter_sets,
        parameters_yaml,
        write_findings,
        write_toc,
    )

    root = args.root.resolve()
    if args.section is not None:
        book_sections.get(args.section)  # a misspelt section is refused whatever else was asked
    if args.bootstrap_seed is not None and not args.findings:
        raise EffdepthError("--bootstrap-seed sets the seed of --findings; add --findings")
    if not args.pages and not args.check:
        raise EffdepthError("--no-pages narrows --check; add --check")
    if args.findings or args.check or args.findings_only:
        from effdepth_book.runner import findings_markdown, stale_generated

        if args.findings:
            print(findings_markdown(root, args.profile, args.bootstrap_seed), end="")
            return 0
        if args.findings_only:
            print(f"effdepth book: wrote {write_findings(root, args.profile).relative_to(root)}")
            return 0
        stale = stale_generated(root, args.profile, pages=args.pages)
        for line in stale:
            print(f"effdepth book --check: {line}")
        if not stale:
            print(
                "effdepth book --check: _toc.yml, book/_findings.md, book/using/api.md"
                + (" and the executed pages" if args.pages else "")
                + " match the code, params/ and the results"
            )
        return 1 if stale else 0
    if args.print_params is not None:
        if args.params is not None:
            raise EffdepthError("--print-params reads params/<section>.yml; drop --params (or use --section with it)")
        print(parameters_yaml(find_set(root, args.print_params, args.profile)), end="")
        return 0
    if args.params and not args.section:
        raise EffdepthError("--params names one section's file; add --section")
    sections = [book_sections.get(args.section).name] if args.section else list(book_sections.names())
    sets = [s for section in sections for s in parameter_sets(root, section, args.profile, args.params)]
    if args.only is not None:
        sets = [s for s in sets if s.name == args.only]
        if not sets:
            raise EffdepthError(f"no parameter set named {args.only!r} in {', '.join(sections)} ({args.profile})")
    if not args.toc_only and args.params is None:
        from effdepth_book.grid import cells

        cells(root, args.profile, sections)  # two runs that would share a directory: found before any work
    toc = write_toc(root)
    print(f"effdepth book: wrote {toc.relative_to(root)}")
    if args.toc_only:
        return 0
    timings = execute(
        root, sets, progress=not args.no_progress, extra={"cached_only": True} if args.cached_only else None
    )
    for item, seconds in timings:
        print(f"  {item.page}.ipynb  {seconds:.0f} s")
    print(f"effdepth book: wrote {write_findings(root, args.profile).relative_to(root)} (the intro's findings)")
    print(
        f"effdepth book: {len(timings)} page(s) in {sum(t for _, t in timings):.0f} s; now `jupyter-book build book/`"
    )
    return 0


def _cmd_grid(args: argparse.Namespace) -> int:
    _quiet(args)
    _book_extra()
    from effdepth_book.grid import parse_shard

    root = args.root.resolve()
    if not (root / "params").is_dir():
        raise EffdepthError(f"--root {args.root} has no params/ folder; run in the effdepth checkout or give --root")
    for flag, value in (("--address", args.address), ("--cpus-per-cell", args.cpus_per_cell),
                        ("--memory-per-cell", args.memory_per_cell)):  # fmt: skip
        if value is not None and args.executor != "ray":
            raise EffdepthError(f"{flag} sizes the tasks of a Ray cluster; add --executor ray")
    if args.memory_per_cell is not None and not (args.memory_per_cell > 0 and math.isfinite(args.memory_per_cell)):
        raise EffdepthError(f"--memory-per-cell must be a positive number of GB, got {args.memory_per_cell}")
    args.cpus_per_cell = args.cpus_per_cell or 1
    slice_ = parse_shard(args.shard) if args.shard is not None else None
    cwd = os.getcwd()
    os.chdir(root)  # params/ name results folders relative to the checkout
    try:
        return _grid_in_checkout(args, root, slice_)
    finally:
        os.chdir(cwd)


def _grid_in_checkout(args: argparse.Namespace, root: Path, slice_) -> int:
    from effdepth_book.executors import compute_plan
    from effdepth_book.grid import hours, plan_grid

    plan = plan_grid(root, args.profile, args.section, slice_)
    for state, cost, cell in plan.rows:
        print(f"  {state:<8} {hours(cost.cpu_seconds):>9}  {cell.section}/{cell.page}: {cell.name}")
    where = f" (shard {args.shard} of {plan.n_units} units)" if slice_ else ""
    print(f"effdepth grid: {plan.n_cells} cells{where}, {plan.n_cells - plan.n_todo} cached, {plan.n_todo} to compute")
    print(plan.cost_line())
    if args.dry_run or not plan.todo:
        return 0
    from .models import quiet_libraries

    if not args.debug:
        quiet_libraries(progress=False)
    outcomes = compute_plan(
        plan, root, args.executor, args.address, args.cpus_per_cell, args.memory_per_cell, not args.no_progress
    )
    counts = {s: sum(o.status == s for o in outcomes) for s in ("done", "busy", "unavailable", "failed")}
    print("effdepth grid: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n or s == "done"))
    if counts["busy"]:
        print("effdepth grid: busy cells are being computed by another effdepth process; rerun to pick them up")
    if counts["unavailable"]:
        print("effdepth grid: unavailable cells could not start here (a model or data set that cannot be loaded)")
    return 1 if counts["failed"] or counts["unavailable"] else 0


def _warn(message: str) -> None:
    print(f"effdepth: warning: {message}", file=sys.stderr)


def _cmd_table(args: argparse.Namespace) -> int:
    from .display import format_table, read_summary

    files = []
    for directory in args.dirs:
        if not directory.exists():
            raise EffdepthError(f"no such directory: {directory}")
        found = [directory] if directory.is_file() else sorted(directory.rglob("effective_depth.json"))
        for path in found:  # a FIFO or a directory of that name would hang or fail: only regular files
            if path.is_file():
                if path.resolve() not in {f.resolve() for f in files}:  # a run named twice is listed once
                    files.append(path)
            else:
                _warn(f"skipping {path} (not a regular file)")
    if not files:
        raise EffdepthError(f"no effective_depth.json under {', '.join(map(str, args.dirs))}; run `effdepth run` first")
    summaries = [s for s in (read_summary(path, _warn) for path in files) if s is not None]
    if not summaries:
        raise EffdepthError("none of the effective_depth.json files found could be read (see the warnings above)")
    print(format_table(summaries, args.format, wide=args.wide))
    return 0


def _one_line_warnings(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"effdepth: warning: {str(message).splitlines()[0] if str(message) else category.__name__}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:

    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(argv)
    if "--no-progress" in argv:  # before tqdm is imported: it reads TQDM_DISABLE once (the GGUF loader's bars)
        os.environ["TQDM_DISABLE"] = "1"
    stdout, stderr = sys.stdout, sys.stderr
    if stdout is None or stderr is None:  # started with a standard stream closed (`>&-`): Python gives None
        if stderr is not None:
            stderr.write("effdepth: error: standard output is closed; redirect it to a file or /dev/null\n")
        return 2
    if not isinstance(stdout, EscapingStream):  # nothing printed can carry a terminal escape from a file
        sys.stdout, sys.stderr = EscapingStream(stdout, "\n\t"), EscapingStream(stderr, "\n\t\r")
    interrupted: list[int] = []
    with _noting_interrupts(interrupted):
        try:
            code = _main(argv, command)
        except KeyboardInterrupt:  # before the command's own handling (while the parser's imports load)
            code = None
        finally:
            sys.stdout, sys.stderr = stdout, stderr
    if code is None or (interrupted and code == 0):  # a Ctrl-C some library caught is still one: 130
        print("effdepth: interrupted; finished results are kept, rerun to resume", file=sys.stderr)
        return 130
    return code


class _noting_interrupts:
    """Within it, each SIGINT is noted in ``seen`` before it raises KeyboardInterrupt as usual (main
    thread only; elsewhere a no-op), so that no library that catches the exception can turn a
    Ctrl-C into exit status 0."""

    def __init__(self, seen: list[int]):
        self.seen, self.previous = seen, None

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread() and (
            signal.getsignal(signal.SIGINT) is signal.default_int_handler  # an ignored SIGINT stays ignored
        ):

            def note(signum, frame):
                self.seen.append(signum)
                raise KeyboardInterrupt

            self.previous = signal.signal(signal.SIGINT, note)
        return self

    def __exit__(self, *exc):
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


def _main(argv: list[str], command: str | None) -> int:
    import warnings

    with warnings.catch_warnings():  # a plugin left out while the parser is built: one line, too
        if "--debug" not in argv:
            warnings.showwarning = _one_line_warnings
        try:
            parser = build_parser(command if command in HEAVY_COMMANDS else None)
        except EffdepthError as exc:
            print(f"effdepth: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    handlers = {
        "run": _cmd_run,
        "models": _cmd_models,
        "probes": _cmd_probes,
        "table": _cmd_table,
        "book": _cmd_book,
        "plot": _cmd_plot,
        "map": _cmd_map,
        "grid": _cmd_grid,
    }
    try:
        with warnings.catch_warnings():
            if not args.debug:
                warnings.showwarning = _one_line_warnings
            return handlers[args.command](args)
    except EffdepthError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"effdepth: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("effdepth: interrupted; finished results are kept, rerun to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `effdepth table | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's exit flush would fail again otherwise
        return 141
    except OSError as exc:  # the disk or the file system failed us outside effdepth's own writes
        if args.debug:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        kept = "; finished results are kept" if args.command in ("run", "grid", "map", "book") else ""
        print(f"effdepth: error: {exc.strerror or exc}{where}{kept}", file=sys.stderr)
        return 2
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"effdepth: internal error: {type(exc).__name__}: {exc} (rerun with --debug for details)", file=sys.stderr
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
