"""The ``effdepth`` command line: run | models | table | book."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from .errors import EffdepthError

RULES = (("cosine", "cosine"), ("logit_lens_kl", "lens KL"), ("logit_lens_overlap", "lens overlap"))


def _format_rule(entry: dict | None) -> str:
    if not entry:
        return "—"
    if entry.get("ed") is None:
        return "undefined"
    text = f"{entry['ed']} ({entry['ratio']:.2f})"
    if entry.get("ci_low") is not None:
        text += f" [{entry['ci_low']}–{entry['ci_high']}]"
    return text


def format_table(summaries: Sequence[dict]) -> str:
    """A Table-1-style view: ED (ratio) [95% bootstrap interval] per rule, one row per run."""
    header = ["model", "task", "L", "n", *(label for _, label in RULES), "depth score"]
    rows = [
        [str(s["model"]), str(s["task"]), str(s["n_layers"]), str(s["n_examples"])]
        + [_format_rule(s.get(rule)) for rule, _ in RULES]
        + [", ".join(f"{g}: {v:.1f}" for g, v in s.get("depth_score", {}).items()) or "—"]
        for s in summaries
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [
        f"  {s['model']} / {s['task']} / {label}: {s[rule]['reason']}"
        for s in summaries
        for rule, label in RULES
        if s.get(rule) and s[rule].get("reason")
    ]
    if notes:
        lines += ["", "undefined ED:", *notes]
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from .results import DEFAULT_PROBES, PROBES
    from .tasks import TASKS
    from .zoo import DEFAULT_MODEL

    parser = argparse.ArgumentParser(prog="effdepth", description="Measure the effective depth of causal LMs.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="probe a model on a task and compute its effective depth")
    run.add_argument("--model", default=DEFAULT_MODEL, help="offline alias, local dir, .gguf file or hub id")
    run.add_argument("--task", default="gsm8k", help=f"{', '.join(TASKS)} or a .jsonl file (prompt, answer)")
    run.add_argument("--n", type=_positive, default=10, help="number of examples (default 10)")
    run.add_argument("--probes", default=",".join(DEFAULT_PROBES), help=f"comma list of {', '.join(PROBES)}")
    run.add_argument("--out", type=Path, help="result directory (default results/<model>/<task>-n<N>-seed<S>)")
    run.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    run.add_argument("--device-map", default=None, help="'auto' to spread a large model over devices")
    run.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--source", default="local", choices=["local", "hub"], help="vendored data or the HF hub")
    run.add_argument("--level", type=int, help="MATH difficulty level 1..5")
    run.add_argument("--digits", type=_positive, default=6, help="operand length for arithmetic tasks")
    run.add_argument("--max-tokens", type=_positive, help="drop prompts longer than this (aime24: 400 by default)")
    run.add_argument("--top-k", type=_positive, default=5, help="logit-lens overlap k")
    run.add_argument("--batch-size", type=_positive, default=4)
    run.add_argument("--skip-positions", type=_positive, default=4, help="future-token positions per prompt (skip)")
    run.add_argument("--skip-parts", default="layer,attn,mlp", help="what to skip: layer, attn, mlp (comma list)")
    run.add_argument("--igrad-steps", type=_positive, default=128, help="quadrature nodes or adaptive budget (igrad)")
    run.add_argument("--igrad-quadrature", default="adaptive", choices=["adaptive", "riemann", "gauss"])
    run.add_argument("--igrad-baseline", default="position-mean", choices=["position-mean", "hidden-mean"])
    run.add_argument("--slow", action="store_true", help="one forward pass per intervention (the oracle; same numbers)")
    run.add_argument("--no-progress", action="store_true", help="hide progress bars")

    commands.add_parser("models", help="list the offline model aliases and whether they are cached")

    book = commands.add_parser("book", help="execute the book's notebooks (papermill) from params/")
    book.add_argument("--section", choices=["scale", "difficulty", "long_cot"], help="one section (default: all)")
    book.add_argument("--params", type=Path, help="a section's parameter file (default params/<section>.yml)")
    book.add_argument("--profile", default="full", choices=["quick", "full"], help="quick: CI's smoke run")
    book.add_argument("--only", help="only the parameter set with this name")
    book.add_argument("--root", type=Path, default=Path("."), help="the effdepth checkout (default: .)")
    book.add_argument("--toc-only", action="store_true", help="only regenerate _toc.yml from params/")
    book.add_argument("--no-progress", action="store_true", help="hide progress bars")

    table = commands.add_parser("table", help="ED table of result directories (searched recursively)")
    table.add_argument("dirs", nargs="+", type=Path)
    return parser


def _cmd_run(args: argparse.Namespace) -> int:
    from .models import load_model, quiet_libraries
    from .results import RunSettings, parse_probes, run
    from .tasks import check_task

    if not args.debug:
        quiet_libraries(progress=not args.no_progress)

    settings = RunSettings(
        model=args.model,
        task=args.task,
        n=args.n,
        seed=args.seed,
        source=args.source,
        level=args.level,
        digits=args.digits,
        max_tokens=args.max_tokens,
        top_k=args.top_k,
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        skip_positions=args.skip_positions,
        skip_parts=args.skip_parts,
        igrad_steps=args.igrad_steps,
        igrad_quadrature=args.igrad_quadrature,
        igrad_baseline=args.igrad_baseline,
        method="slow" if args.slow else "fast",
        progress=not args.no_progress,
    )
    parse_probes(args.probes)  # fail on a typo before loading anything
    if args.slow and args.igrad_quadrature == "adaptive" and "igrad" in args.probes:
        raise EffdepthError(
            "--slow has no adaptive quadrature; add --igrad-quadrature riemann (the paper's, 256 steps)"
        )
    check_task(args.task)
    loaded = None
    if args.device_map:
        loaded = load_model(args.model, device=args.device, dtype=args.dtype, device_map=args.device_map)
    result = run(settings, probes=args.probes, out_dir=args.out, loaded=loaded)
    print(format_table([result.summary]))
    print(f"\nresults in {result.out_dir}/")
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from .zoo import ZOO, cache_dir, is_cached

    print(f"offline models (cache: {cache_dir()}; set EFFDEPTH_CACHE to move it)")
    for alias, entry in ZOO.items():
        state = "cached" if is_cached(alias) else f"not cached, {entry.download_mb} MB download"
        print(f"  {alias:<20} {entry.description}  [{state}]")
    print("any Hugging Face hub id, local model directory or .gguf file also works with --model")
    return 0


def _cmd_book(args: argparse.Namespace) -> int:
    from .book import SECTIONS, execute, parameter_sets, write_toc

    root = args.root.resolve()
    if args.params and not args.section:
        raise EffdepthError("--params names one section's file; add --section")
    toc = write_toc(root)
    print(f"effdepth book: wrote {toc.relative_to(root)}")
    if args.toc_only:
        return 0
    sections = [args.section] if args.section else list(SECTIONS)
    sets = [s for section in sections for s in parameter_sets(root, section, args.profile, args.params)]
    if args.only:
        sets = [s for s in sets if s.name == args.only]
        if not sets:
            raise EffdepthError(f"no parameter set named {args.only!r} in {', '.join(sections)} ({args.profile})")
    timings = execute(root, sets, progress=not args.no_progress)
    for item, seconds in timings:
        print(f"  {item.page}.ipynb  {seconds:.0f} s")
    print(
        f"effdepth book: {len(timings)} page(s) in {sum(t for _, t in timings):.0f} s; now `jupyter-book build book/`"
    )
    return 0


def _cmd_table(args: argparse.Namespace) -> int:
    files = []
    for directory in args.dirs:
        if not directory.exists():
            raise EffdepthError(f"no such directory: {directory}")
        files += sorted(directory.rglob("effective_depth.json"))
    if not files:
        raise EffdepthError(f"no effective_depth.json under {', '.join(map(str, args.dirs))}; run `effdepth run` first")
    print(format_table([json.loads(f.read_text()) for f in files]))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"run": _cmd_run, "models": _cmd_models, "table": _cmd_table, "book": _cmd_book}
    try:
        return handlers[args.command](args)
    except EffdepthError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"effdepth: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("effdepth: interrupted; finished results are kept, rerun to resume", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"effdepth: internal error: {type(exc).__name__}: {exc} (rerun with --debug for details)", file=sys.stderr
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
