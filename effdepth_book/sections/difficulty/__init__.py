"""The difficulty section: does ED change from HellaSwag to GSM8K to AIME24, and within math (MATH
levels, operand lengths)?"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property

import polars as pl

from effdepth_core.errors import EffdepthError

from ... import evidence, findings, plots, reference, specification, tables
from ...pages import Page
from ...spec import SectionSpec, StudyPlan, models_of
from ...study import Study, difficulty_specs, task_label


def plans(parameters: Mapping) -> list[StudyPlan]:
    """A difficulty page's studies: the data sets on every model (the sensitivity tasks on
    ``sensitivity_models``), and the within-math levels on ``level_models``."""
    models = models_of(parameters)
    tasks = tuple(parameters.get("tasks") or ())
    precise = parameters.get("precision") is not None
    levels = difficulty_specs(parameters.get("math"), parameters.get("arithmetic"), parameters.get("skip"), precise)
    level_models = tuple(parameters.get("level_models") or models)
    extra = tuple(parameters.get("sensitivity_tasks") or ())
    # the sensitivity tasks run for sensitivity_models (default: every model of the page)
    by_model = {m: (*tasks, *extra) for m in parameters.get("sensitivity_models") or models} if extra else {}
    length = tuple(parameters.get("length_tasks") or ())
    cut_levels = level_length_specs(parameters.get("math"), parameters.get("level_length"))
    return [
        StudyPlan("tasks", models, tasks, by_model),
        StudyPlan("levels", level_models, tuple(levels)),
        *([StudyPlan("length", models, length)] if length else []),
        *([StudyPlan("level_length", level_models, cut_levels)] if cut_levels else []),
    ]


def level_length_specs(math: Mapping | None, control: Mapping | None) -> tuple[dict, ...]:
    """The MATH levels' exact length control: every level's texts (the same data set, seed and token
    cap) cut to their first ``control["positions"]`` tokens, ``control["n"]`` of them, with the
    correlational probes; none without a control."""
    if not control:
        return ()
    if not math:
        raise EffdepthError("params: level_length cuts the MATH levels' texts, but the page sets no math levels")
    if math.get("max_tokens") is not None and control["positions"] > math["max_tokens"]:
        raise EffdepthError(
            f"params: level_length.positions {control['positions']} is past math.max_tokens {math['max_tokens']}: "
            "no text could be cut there; choose positions ≤ max_tokens"
        )
    base = {k: v for k, v in math.items() if k not in ("levels", "n")}
    n = control.get("n", math.get("n"))  # the levels' own n where the control sets none
    cut = {"positions": control["positions"], "precision": None, **({"n": n} if n is not None else {})}
    return tuple({**base, "task": "math", "level": level, "probes": ["cosine", "logit_lens"], **cut}
                 for level in math.get("levels") or ())  # fmt: skip


LEVEL_LENGTH_GROUP = "MATH level, same positions only"


class DifficultyPage(Page):
    @property
    def level_models(self) -> list[str]:
        return list(self.plans["levels"].models)

    @cached_property
    def by_task(self) -> Study:
        """The data sets of every model, and the sensitivity tasks of ``sensitivity_models`` (default all)."""
        return self.study("tasks")

    @cached_property
    def specs(self) -> list[dict]:
        return list(self.plans["levels"].specs)

    @cached_property
    def by_level(self) -> Study:
        """The within-math runs: MATH levels, operand lengths, depth scores (``level_models``)."""
        return self.study("levels")

    @cached_property
    def by_level_length(self) -> Study:
        """The MATH levels cut to a common window of positions (``level_length``; empty without one)."""
        return self.study("level_length")

    @cached_property
    def summary(self) -> pl.DataFrame:
        return pl.concat([self.by_task.summary(), self.by_level.summary(), self.by_level_length.summary()])

    @property
    def task_order(self) -> list[str]:
        return [task_label(t) for t in self.p.get("tasks") or []]

    @property
    def sensitivity_orders(self) -> list[list[str]]:
        """Each sensitivity task in the place of the last data set (AIME24 at a longer cap after GSM8K)."""
        return [[*self.task_order[:-1], task_label(t)] for t in self.p.get("sensitivity_tasks") or []]

    @property
    def groups(self) -> dict[str, list[str]]:
        """Ordered levels per group: MATH levels, operand lengths (by task, never by label)."""
        out: dict[str, list[str]] = {}
        for spec in self.specs:
            name = "MATH level" if spec["task"] == "math" else "operand length"
            label = task_label(spec)
            if label not in out.setdefault(name, []):
                out[name].append(label)
        cut = self.plans["level_length"].specs if "level_length" in self.plans else ()
        if cut:  # the same levels on their first N tokens only: the trend without the length confound
            out[LEVEL_LENGTH_GROUP] = list(dict.fromkeys(task_label(spec) for spec in cut))
        return out

    @property
    def level_order(self) -> list[str]:
        return [label for labels in self.groups.values() for label in labels]

    def trends(self) -> pl.DataFrame:
        rules = tuple(reference.RULE_LABELS.values())
        parts = [
            evidence.level_trend(self.summary, model, order, rules).with_columns(pl.lit(group).alias("group"))
            for model in self.by_level.summary()["model"].unique(maintain_order=True)
            for group, order in self.groups.items()
        ]
        return pl.concat(parts) if parts else pl.DataFrame()

    @cached_property
    def between(self) -> pl.DataFrame | None:
        seed = self.bootstrap_seed
        parts = [
            evidence.between_tasks(self.by_task, m, self.task_order, seed=seed) for m in self.p.get("models") or []
        ]
        for order in self.sensitivity_orders:  # only the step into the sensitivity task is new
            for m in self.p.get("sensitivity_models") or self.p.get("models") or []:
                rows = evidence.between_tasks(self.by_task, m, order, seed=seed)
                parts.append(rows.filter(pl.col("second") == order[-1]))
        return pl.concat(parts).sort("model", maintain_order=True) if parts else None

    @cached_property
    def lengths(self) -> pl.DataFrame | None:
        """The prompt-length control of each model's first step (HellaSwag → GSM8K)."""
        order = self.task_order
        if len(order) < 2:
            return None
        parts = [
            evidence.length_control(self.by_task, m, order[0], order[1], seed=self.bootstrap_seed)
            for m in self.p.get("models") or []
        ]
        return pl.concat(parts) if parts else None

    def findings(self) -> str:
        return findings.difficulty_finding(
            self.summary,
            self.task_order,
            self.paper,
            self.groups,
            between=self.between,
            trends=self.trends(),
            scores=evidence.depth_score_intervals(self.by_level, seed=self.bootstrap_seed),
            lengths=self.lengths,
            how=self.analysis.margin,
        )

    def headline(self) -> dict:
        row = findings.difficulty_headline(self.by_task.summary(), self.between, self.paper, self.analysis.margin)
        return {**row, **findings.specification_columns(self.specification_summary)}

    def specification_curve(self) -> pl.DataFrame | None:
        """Each model's steps between the data sets, under every specification."""
        rules = tuple(reference.RULE_LABELS.values())
        windowed = self.study("length")
        parts = [
            specification.difficulty_curve(
                self.by_task, m, self.task_order, self.paper, self.analysis, rules, windowed=windowed
            )
            for m in self.p.get("models") or []
        ]
        for order in self.sensitivity_orders:  # only the step into the sensitivity task is new
            for m in self.p.get("sensitivity_models") or self.p.get("models") or []:
                curve = specification.difficulty_curve(
                    self.by_task, m, order[-2:], self.paper, self.analysis, rules, windowed=windowed
                )
                parts.append(curve)
        parts = [p for p in parts if p.height]
        return pl.concat(parts) if parts else None

    def chart(self, name: str):
        if name == "tasks":
            return plots.show(plots.ed_by_task(self.by_task.summary(), self.task_order))
        if name == "differences":
            return plots.show(
                plots.differences_against_margin(
                    findings.difference_steps(self.between, self.paper, self.analysis.margin)
                )
            )
        if name == "levels":
            levels = pl.concat([self.by_level.summary(), self.by_level_length.summary()])
            return plots.show(plots.ed_by_task(levels, self.level_order))
        if name == "sensitivity":
            return plots.show(plots.threshold_sensitivity(self.by_task.sensitivity()))
        return self.probe_chart(
            self.by_level,
            "skip",
            lambda: plots.depth_score_bars(
                evidence.depth_score_intervals(self.by_level, seed=self.bootstrap_seed), self.level_order
            ),
        )

    def table1(self):
        return tables.table1(self.by_task.summary(), self.paper)

    def trend_table(self):
        columns = {"model": "model", "group": "ordered by", "rule": "rule", "levels": "levels", "rho": "Spearman ρ",
                   "p": "permutation p", "min_p": "smallest possible p"}  # fmt: skip
        return tables.frame_table(self.trends().select(list(columns)).rename(columns))

    def ed_table(self):
        return tables.ed_summary(self.summary)


def intro(entries: list) -> tuple[list[dict], list[str]]:
    """Every difficulty page's headline and finding."""
    return [page.headline() for _, page in entries], [page.findings() for _, page in entries]


SPEC = SectionSpec(
    name="difficulty",
    page=DifficultyPage,
    plans=plans,
    keys=frozenset(
        {"models", "level_models", "sensitivity_tasks", "sensitivity_models", "math", "level_length"}
        | {"arithmetic", "skip"}
    ),
    intro=intro,
)
