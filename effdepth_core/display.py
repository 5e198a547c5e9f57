"""How runs are shown: the ED table (text, CSV, Markdown, JSON) of ``effdepth run`` and ``effdepth
table``, a run's one-line and notebook display, and the check that an ``effective_depth.json`` is
one effdepth wrote. Columns come from the probe registry: an ED column per rule of the probes the
runs have, and a cell per probe without rules (its spec's ``cell``)."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from .errors import EffdepthError
from .labels import CELL_LEGEND, DEPTH_LEGEND, format_depth, format_rule
from .measurement import registry
from .measurement.depth import DepthResult
from .tasks import ARITHMETIC
from .terminal import printable


def _rule_columns(summaries: Sequence[dict]) -> dict[str, str]:
    """ED rule key → label, for every rule some summary has, in registry order."""
    return {key: rule.label for key, (_, rule) in registry.rules().items() if any(key in s for s in summaries)}


def _depth_columns(summaries: Sequence[dict]) -> dict[str, str]:
    """ED rule key → its continuous statistic's column label, for every rule some summary has one of."""
    return {
        key: f"{label} depth"
        for key, label in _rule_columns(summaries).items()
        if any((s.get(key) or {}).get("depth") is not None for s in summaries)
    }


def _cell(summary: dict, probe: str) -> str:
    """A probe's end-of-run cell: recorded in the summary, or (a summary written before cells were
    recorded) what its spec makes of the summary alone."""
    cells = summary.get("cells")
    if cells is not None:
        return str(cells.get(probe, "—"))
    return registry.get(probe).cell(summary, {})


def _cell_columns(summaries: Sequence[dict]) -> dict[str, str]:
    """Probe → column label, for every probe without rules that some summary has a cell of."""
    return {
        name: spec.cell_label or spec.title
        for name, spec in registry.specs().items()
        if not spec.rules and spec.cell is not None and any(_cell(s, name) != "—" for s in summaries)
    }


NARROW_LEGEND = "--wide adds each rule's continuous depth statistic (method.md §12) and every column"
FLAG = "†"  # a rule artefact or a degenerate interval, as the book marks it (docs/method.md §10)
FLAG_LEGEND = f"{FLAG} a rule artefact or a degenerate interval (docs/method.md §10): shown, not to be read as a depth"


class EdTable(pl.DataFrame):
    """``result.eds``: a polars frame shown whole — every column, every rule, full reasons — where
    polars would cut a 14-column frame to the terminal's or notebook's width."""

    def __str__(self) -> str:
        with pl.Config(tbl_cols=-1, tbl_rows=-1, tbl_width_chars=10_000, fmt_str_lengths=200):
            return super().__str__()

    def _repr_html_(self, **kwargs) -> str:
        with pl.Config(tbl_cols=-1, tbl_rows=-1, fmt_str_lengths=200):
            return super()._repr_html_(**kwargs)


def degenerate_reason(entry: dict | None, n_layers: int, statistic: bool = False) -> str | None:
    """Why a rule's ED (or, with ``statistic``, its continuous depth) is degenerate, by the book's
    one rule (``depth.degenerate``: an artefact in the first layers, or an interval over L/2); None
    when it is sound or undefined."""
    from .measurement.depth import degenerate

    if not entry:
        return None
    if statistic:
        return degenerate(entry.get("depth"), entry.get("depth_low"), entry.get("depth_high"), n_layers)
    return degenerate(entry.get("ed"), entry.get("ci_low"), entry.get("ci_high"), n_layers)


def _flagged(text: str, reason: str | None) -> str:
    return f"{text} {FLAG}" if reason else text


def flag_notes(summaries: Sequence[dict], wide: bool = True) -> list[str]:
    """One line per flagged cell: the run, the column and why (``depth.degenerate``'s reason); not
    ``wide``: the ED cells only (the narrow table shows no depth column)."""
    notes = []
    for s in summaries:
        for rule, label in _rule_columns(summaries).items():
            for statistic, column in ((False, label), (True, f"{label} depth"))[: 2 if wide else 1]:
                reason = degenerate_reason(s.get(rule), int(s["n_layers"]), statistic)
                if reason:
                    notes.append(f"  {s['model']} / {s['task']} / {column}: {reason}")
    return notes


def table_rows(summaries: Sequence[dict], wide: bool = True) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the Table-1-style view: one row per run, ED (ratio) [interval] per rule,
    the rules' continuous statistics, then one cell per probe without rules. Not ``wide``: without
    the continuous statistics, and without the level, digits and asked columns where no run has
    anything to say in them (a narrow table for a terminal)."""
    rules, depths, cells = _rule_columns(summaries), _depth_columns(summaries), _cell_columns(summaries)
    if not wide:
        depths = {}
    header = ["model", "task", "level", "digits", "L", "n", "asked", *rules.values(), *depths.values(), *cells.values()]
    rows = [
        [
            str(s["model"]),
            str(s["task"]),
            str(s.get("level") or ""),
            str(s.get("digits") or ""),
            str(s["n_layers"]),
            str(s["n_examples"]),
            str(s.get("n_asked", s["n_examples"])),
            *(_flagged(format_rule(s.get(rule)), degenerate_reason(s.get(rule), s["n_layers"])) for rule in rules),
            *(_flagged(format_depth(s.get(r)), degenerate_reason(s.get(r), s["n_layers"], True)) for r in depths),
            *(_cell(s, probe) for probe in cells),
        ]
        for s in summaries
    ]
    if not wide:  # drop level, digits and asked where every run leaves them empty or equal to n
        keep = [i for i, name in enumerate(header) if not _uninformative(name, i, rows)]
        header, rows = [header[i] for i in keep], [[row[i] for i in keep] for row in rows]
    return header, [[printable(cell) for cell in row] for row in rows]


def _uninformative(name: str, index: int, rows: list[list[str]]) -> bool:
    """Whether a narrow table may leave out this column: level or digits empty in every run, or
    the prompts asked equal to those kept (n) in every run."""
    if name in ("level", "digits"):
        return all(not row[index] for row in rows)
    if name == "asked":
        return all(row[index] == row[index - 1] for row in rows)
    return False


RULE_FIELDS = ("ed", "ratio", "ci_low", "ci_high", "statistic", "depth", "depth_ratio", "depth_low", "depth_high")


def table_records(summaries: Sequence[dict]) -> list[dict]:
    """The runs' table for programs: one record per run with numbers as numbers — ``model, task,
    level, digits, L, n, asked``, per ED rule its ``RULE_FIELDS`` and ``reason`` (null where
    absent), and the text cell of each probe without rules (null where a run has none)."""
    rules, cells = _rule_columns(summaries), _cell_columns(summaries)
    records = []
    for s in summaries:
        record = {"model": s["model"], "task": s["task"], "level": s.get("level"), "digits": s.get("digits"),
                  "L": s["n_layers"], "n": s["n_examples"], "asked": s.get("n_asked", s["n_examples"])}  # fmt: skip
        for rule in rules:
            entry = s.get(rule) or {}
            record[rule] = {field: entry.get(field) for field in (*RULE_FIELDS, "reason")}
            record[rule]["degenerate"] = degenerate_reason(entry, s["n_layers"])  # why, or null (method.md §10)
            record[rule]["depth_degenerate"] = degenerate_reason(entry, s["n_layers"], statistic=True)
        record.update({probe: None if (text := _cell(s, probe)) == "—" else text for probe in cells})
        records.append(record)
    return records


def format_table(summaries: Sequence[dict], style: str = "text", wide: bool = True) -> str:
    """The runs' ED table as aligned text (with a legend line and notes) or Markdown for people;
    JSON (``table_records``) or CSV (the same records flattened: ``<rule>_<field>`` columns) with
    numeric fields for programs. Not ``wide`` (the command line's default): text and Markdown
    without the continuous statistics and the empty columns (``table_rows``)."""
    if style == "json":
        return json.dumps(table_records(summaries), indent=2, ensure_ascii=False, allow_nan=False)
    if style == "csv":
        import csv
        import io

        flat = [
            {f"{key}_{field}" if isinstance(value, dict) else key: v for key, value in record.items()
             for field, v in (value.items() if isinstance(value, dict) else [(None, value)])}
            for record in table_records(summaries)
        ]  # fmt: skip
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(flat[0]) if flat else [], lineterminator="\n")
        writer.writeheader()
        writer.writerows(flat)
        return buffer.getvalue().rstrip("\n")
    header, rows = table_rows(summaries, wide)
    if style == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        flagged = flag_notes(summaries, wide)
        if flagged:
            lines += ["", FLAG_LEGEND + ":", "", *(f"- {note.strip()}".replace("|", "\\|") for note in flagged)]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if _rule_columns(summaries):
        lines += ["", f"{CELL_LEGEND}; n = prompts kept of those asked"]
    if _depth_columns(summaries):
        lines.append(DEPTH_LEGEND if wide else NARROW_LEGEND)
    notes = [
        f"  {s['model']} / {s['task']} / {label}: {s[rule]['reason']}"
        for s in summaries
        for rule, label in _rule_columns(summaries).items()
        if s.get(rule) and s[rule].get("reason")
    ]
    if notes:
        lines += ["undefined ED:", *notes]
    flagged = flag_notes(summaries, wide)
    if flagged:
        lines += [FLAG_LEGEND + ":", *flagged]
    return "\n".join(lines)


def format_map(frame: pl.DataFrame) -> str:
    """The cross-model map as text: per small-model layer, the best big layer and its held-out error,
    the error at equal relative depth, and (a measured map) the shuffled-pairing baseline there and
    the ridge chosen on the validation prompts."""
    counts = {m: frame.filter(metric=m)["value"] for m in ("n_train_prompts", "n_train_tokens", "n_test_prompts")}
    if "prompt" in frame.columns:
        frame = frame.filter(pl.col("prompt").is_null())
    n_small = frame["small_layer"].max()
    n_big = frame["big_layer"].max()
    errors, baseline = frame.filter(metric="relative_error"), frame.filter(metric="baseline_error")
    ridge = frame.filter(metric="ridge")
    train = f"{counts['n_train_prompts'][0]:.0f} prompts fit" if len(counts["n_train_prompts"]) else ""
    if len(counts["n_train_tokens"]) and counts["n_train_tokens"][0]:
        train += f" ({counts['n_train_tokens'][0]:.0f} tokens)"
    lines = [
        f"held-out relative error |h_l - f(h_m)| / |h_l|; {train}, {counts['n_test_prompts'][0]:.0f} test",
        f"{'small m':>8} {'best big l':>10} {'error':>7} {'equal-depth l':>14} {'error there':>12}"
        + (f" {'shuffled':>9} {'ridge':>8}" if baseline.height else ""),
    ]
    for m in range(n_small + 1):
        row = errors.filter(small_layer=m)
        best = row.sort("value").row(0, named=True)
        equal = round(m * n_big / n_small)
        at_equal = row.filter(big_layer=equal)["value"].item()
        line = f"{m:>8} {best['big_layer']:>10} {best['value']:>7.3f} {equal:>14} {at_equal:>12.3f}"
        if baseline.height:
            blind = baseline.filter(small_layer=m, big_layer=best["big_layer"])["value"].item()
            line += f" {blind:>9.3f} {ridge.filter(small_layer=m, big_layer=best['big_layer'])['value'].item():>8.0e}"
        lines.append(line)
    return "\n".join(lines)


# --- effective_depth.json as effdepth writes it --------------------------------------------------


def _finite_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_FACTS = ("model", "task", "n_layers", "n_examples", "n_asked", "level", "digits", "cells")


def _depth_problem(entry: dict, n_layers: int) -> str | None:
    """Why a rule's continuous statistic is not one effdepth wrote (None when it is, or is absent)."""
    if entry.get("depth") is None:
        others = ("statistic", "depth_ratio", "depth_low", "depth_high")
        parts = any(entry.get(k) is not None for k in others)
        return "continuous statistic has parts without a value" if parts else None
    depth, ratio, low, high = (entry.get(k) for k in ("depth", "depth_ratio", "depth_low", "depth_high"))
    if entry.get("statistic") not in ("crossing", "centroid") or not all(map(_finite_number, (depth, ratio))):
        return "continuous statistic is not a named finite number"
    if not 0 <= depth <= n_layers or abs(ratio - (depth + 1) / n_layers) > 1e-9:
        return f"continuous statistic {depth} (ratio {ratio}) is out of range for {n_layers} layers"
    if (low is None) != (high is None) or (low is not None and not (_finite_number(low) and _finite_number(high))):
        return "continuous statistic's interval is not two finite numbers"
    if low is not None and not 0 <= low <= high <= n_layers:
        return f"continuous statistic's interval [{low}, {high}] is reversed or out of range"
    return None


def summary_problem(summary) -> str | None:
    """Why an ``effective_depth.json`` is not one effdepth wrote (None when it is): the run facts,
    and per rule an integer ED (or null) whose ratio is (ED+1)/L and whose interval is ordered and
    inside the model; depth scores finite numbers (or null); cells text."""
    if not isinstance(summary, dict) or not {"model", "task", "n_layers", "n_examples"} <= summary.keys():
        return "not an effdepth summary"
    if not all(type(summary[k]) is int and 0 < summary[k] < 10**7 for k in ("n_layers", "n_examples")):
        return "not an effdepth summary (layer or example count)"
    for key in ("n_asked", "level", "digits"):  # counts a run records, when it records them
        if summary.get(key) is not None and not (type(summary[key]) is int and 0 <= summary[key] < 10**9):
            return f"its {key} is not a count"
    if not all(isinstance(summary[k], str) and summary[k].isprintable() for k in ("model", "task")):
        return "its model or task is not a printable name"
    n_layers = summary["n_layers"]

    def layer(value) -> bool:  # a layer index of this model (bool is not an int here)
        return type(value) is int and 0 <= value < n_layers

    for rule in registry.rules():
        entry = summary.get(rule)
        if entry is None:
            continue
        if not isinstance(entry, dict) or "ed" not in entry:
            return f"its {rule} entry is not an ED"
        problem = _depth_problem(entry, n_layers)  # a continuous statistic may stand where the ED is undefined
        if problem:
            return f"its {rule} {problem}"
        if entry.get("reason") is not None and not isinstance(entry["reason"], str):
            return f"its {rule} reason is not text"
        if entry["ed"] is None:
            if any(entry.get(k) is not None for k in ("ratio", "ci_low", "ci_high")):
                return f"its {rule} has a ratio or interval without an ED"
            continue
        ratio = entry.get("ratio")
        if not (layer(entry["ed"]) and _finite_number(ratio)):
            return f"its {rule} ED or ratio is out of range"
        if abs(ratio - (entry["ed"] + 1) / n_layers) > 1e-9:
            return f"its {rule} ratio {ratio} is not (ED+1)/L = ({entry['ed']}+1)/{n_layers}"
        low, high = entry.get("ci_low"), entry.get("ci_high")
        if any(v is not None and not layer(v) for v in (low, high)) or (low is None) != (high is None):
            return f"its {rule} interval is out of range"
        if low is not None and low > high:
            return f"its {rule} interval [{low}–{high}] is reversed"
    for key, value in summary.items():  # a probe's summary (the skip probe's depth scores): finite or null
        if key in _FACTS or key in registry.rules():
            continue
        if not isinstance(value, dict) or not all(v is None or _finite_number(v) for v in value.values()):
            return f"its {key} are not finite numbers"
    cells = summary.get("cells", {})
    if not isinstance(cells, dict) or not all(isinstance(v, str) for v in cells.values()):
        return "its cells are not text"
    return None


def read_summary(path: Path, warn) -> dict | None:
    """An ``effective_depth.json`` that effdepth wrote (completed from its ``metadata.json`` where an
    older version left out level, digits or n asked), or None after ``warn(message)``."""
    from .cache import read_regular
    from .rundir import FORMAT, METADATA, SUMMARY, read_metadata, verified_files

    try:
        summary = json.loads(read_regular(path, what="summary").decode("utf-8"))
        why = summary_problem(summary)
        metadata = read_metadata(path.parent) or {}
        recorded = (metadata.get("files") or {}).get(SUMMARY) if path.name == SUMMARY else None
        older = int(metadata.get("format", FORMAT)) < FORMAT  # format 1 wrote its summary unrecorded
        if why is None and not metadata:  # a record is trusted through its anchor, the run's metadata.json
            why = f"no effdepth {METADATA} beside it: not a run of effdepth's, or its {METADATA} is gone"
        elif why is None and recorded is None and not older:
            why = f"its run's {METADATA} does not record it (a summary is read as effective_depth.json of its run)"
        if why is None and recorded is not None and verified_files(path.parent, {SUMMARY: recorded}) is not None:
            why = "it differs from the sha256 its run recorded: edited since effdepth wrote it; rerun to restore it"
        if why is None:
            settings = metadata.get("settings")
            settings = settings if isinstance(settings, dict) else {}
            summary.setdefault("n_asked", settings.get("n", summary["n_examples"]))
            if settings.get("level") is not None:
                summary.setdefault("level", settings["level"])
            if summary["task"] in ARITHMETIC and settings.get("digits"):
                summary.setdefault("digits", settings["digits"])
            return summary
    except EffdepthError as exc:  # its own one line (a run of a newer format, say)
        why = " ".join(str(exc).split())
    except (OSError, ValueError, RecursionError) as exc:
        why = f"unreadable: {type(exc).__name__}"
    warn(f"skipping {path} ({why})")
    return None


@dataclass(repr=False)
class RunResult:
    """What ``run`` produced: where, the saved frames, the per-example frames and the ED per rule."""

    out_dir: Path | None  # None: computed in memory and kept nowhere (``run_in_memory``)
    curves: dict[str, pl.DataFrame]
    per_example: dict[str, pl.DataFrame]
    depth: dict[str, DepthResult]
    summary: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    computed: tuple[str, ...] = ()  # the probes this call computed; the others were read from the run's cache

    def curve(self, probe: str, metric: str):
        """One curve as a numpy array over its layers (``result.curve("logit_lens", "kl")``).

        Args:
            probe: a probe that ran (a key of ``curves``).
            metric: one of that probe's metrics (``cos_layer``, ``kl``, ``overlap``, …).

        Returns:
            ``[layer]`` float64 values, layer 0 first (the frame's rows for other columns, such as
            a lens or a skip variant, must be filtered from ``curves[probe]`` instead).
        """
        from .errors import EffdepthError, nearest_name

        for what, given in (("probe", probe), ("metric", metric)):
            if not isinstance(given, str):
                raise EffdepthError(
                    f"curve() takes a {what} name as text, got {type(given).__name__} {given!r:.40}; e.g. "
                    f"result.curve('logit_lens', 'kl'); this result's probes: {', '.join(self.curves)}"
                )
        if probe not in self.curves:
            close = nearest_name(probe, list(self.curves))
            hint = f" (did you mean {close!r}?)" if close else ""
            raise EffdepthError(f"no probe {probe!r} in this result{hint}; it has {', '.join(self.curves)}")
        frame = self.curves[probe]
        metrics = sorted(set(frame["metric"])) if "metric" in frame.columns else []
        if metric not in metrics:
            close = nearest_name(metric, metrics)
            hint = f" (did you mean {close!r}?)" if close else ""
            raise EffdepthError(f"{probe} has no metric {metric!r}{hint}; it has {', '.join(metrics)}")
        rows = frame.filter(metric=metric).sort("layer")
        if rows["layer"].n_unique() != rows.height:
            others = [c for c in rows.columns if c not in ("layer", "metric", "value")]
            raise EffdepthError(
                f"{probe}'s {metric} has several rows per layer (by {', '.join(others)}); filter curves[{probe!r}]"
            )
        return rows["value"].to_numpy()

    def summary_probes(self) -> list[str]:
        """The probes this result holds, in the table's (the registry's) order."""
        return [name for name in registry.names() if name in self.per_example]

    def _cells(self) -> list[tuple[str, str]]:
        header, rows = table_rows([self.summary])
        return list(zip(header[7:], rows[0][7:], strict=True))

    def _labels(self) -> tuple[str, str]:
        """The model and task as the caller named them (``Measurement``), else as the run records them."""
        s = self.summary
        return (
            getattr(self, "model_label", "") or str(s.get("model")),
            getattr(self, "task_label", "") or str(s.get("task")),
        )

    def __repr__(self) -> str:
        s = self.summary
        model, task = self._labels()
        cells = "; ".join(f"{label} {cell}" for label, cell in self._cells())
        flagged = [" ".join(note.split(" / ", 2)[-1].split()) for note in flag_notes([s])]
        why = f" {FLAG} (docs/method.md §10, not a depth): {'; '.join(flagged)}." if flagged else ""
        return (
            f"<{type(self).__name__}: {model} on {task} ({s.get('n_layers')} layers, n = {s.get('n_examples')}). "
            f"ED {cells}.{why}{self._text()} Probes: {', '.join(self.per_example)}. {self._where()}>"
        )

    def _text(self) -> str:
        """What text was measured, where the result knows (a ``Measurement``)."""
        text = getattr(self, "text", "")
        return f" Measured: {text}." if text else ""

    def _where(self) -> str:
        if self.out_dir is None:
            return "Kept in memory only (measure(..., out=FOLDER) or cache=True keeps a result)"
        return f"Saved in {self.out_dir}"

    @property
    def eds(self) -> pl.DataFrame:
        """The ED of every rule the run's probes have, as a frame (``rule, ed, ratio, ci_low, ci_high,
        reason``, ``degenerate``: why the ED is a rule artefact or its interval degenerate, by
        docs/method.md §10, else null; then the continuous statistic's columns and its own
        ``depth_degenerate``)."""
        from .measurement.depth import depth_table

        table = depth_table(self.depth)
        n_layers = int(self.summary["n_layers"])
        entries = [self.summary.get(rule) for rule in table["rule"]]
        flags = [degenerate_reason(entry, n_layers) for entry in entries]
        depth_flags = [degenerate_reason(entry, n_layers, statistic=True) for entry in entries]
        table = table.with_columns(
            pl.Series("degenerate", flags, dtype=pl.String), pl.Series("depth_degenerate", depth_flags, dtype=pl.String)
        )
        order = [*table.columns[:6], "degenerate", *table.columns[6:-2], "depth_degenerate"]
        return EdTable(table.select(order))

    def _repr_html_(self) -> str:
        s = self.summary
        head = "".join(f"<th>{html.escape(label)}</th>" for label, _ in self._cells())
        cells = "".join(f"<td>{html.escape(cell)}</td>" for _, cell in self._cells())
        return (
            f"<p><b>{html.escape(self._labels()[0])}</b> on <b>{html.escape(self._labels()[1])}</b>: "
            f"L = {s.get('n_layers')}, n = {s.get('n_examples')}; probes {', '.join(self.per_example)};"
            f"{html.escape(self._text())} "
            f"{html.escape(self._where())}</p>"
            f"<table><tr>{head}</tr><tr>{cells}</tr></table><p><small>{html.escape(CELL_LEGEND)}</small></p>"
            + "".join(f"<p><small>{html.escape(line)}</small></p>" for line in self._flag_lines())
        )

    def _flag_lines(self) -> list[str]:
        notes = flag_notes([self.summary])
        return [FLAG_LEGEND + ":", *(note.split(" / ", 2)[-1].strip() for note in notes)] if notes else []
