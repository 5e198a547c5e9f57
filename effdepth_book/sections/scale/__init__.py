"""The scale section: does ED change with model size? Table 1 beside ours, the within-family
comparison, and each probe's chart across the page's models."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property

import polars as pl

from effdepth_core.measurement.depth import curve_bands

from ... import evidence, findings, plots, reference, specification, tables
from ...pages import Page
from ...spec import SectionSpec, StudyPlan, models_of
from ...study import Study


def plans(parameters: Mapping) -> list[StudyPlan]:
    """A scale page's studies: its tasks on every model, and the causal probes where it asks for them."""
    models = models_of(parameters)
    tasks = tuple(parameters.get("tasks") or ())
    causal = parameters.get("causal")
    length = tuple(parameters.get("length_tasks") or ())
    return [
        StudyPlan("tasks", models, tasks, dict(parameters.get("tasks_by_model") or {})),
        *([StudyPlan("length", models, length)] if length else []),
        *(
            [StudyPlan("causal", models, (dict(causal),), dict(parameters.get("causal_by_model") or {}))]
            if causal
            else []
        ),
    ]


class ScalePage(Page):
    @cached_property
    def causal(self) -> Study:
        return self.study("causal")

    def _pair(self) -> tuple[str, str] | None:
        """The first two sizes of one family on this page (the within-family comparison)."""
        by_family: dict[str, list] = {}
        facts = self.summary.select("model", "n_params").unique().sort("n_params")
        for model, _ in facts.iter_rows():
            by_family.setdefault(evidence.family(model), []).append(model)
        pairs = [members[:2] for members in by_family.values() if len(members) >= 2]
        return tuple(pairs[0]) if pairs else None

    def _tokens(self) -> pl.DataFrame | None:
        erasure = self.causal.frame("erasure", per_example=True)
        return erasure if erasure.height else None

    @cached_property
    def within(self) -> pl.DataFrame | None:
        pair = self._pair()
        tasks = [t["task"] for t in self.p.get("tasks") or [] if t.get("task") in findings.TASK_ORDER]
        if not pair:
            return None
        return evidence.within_family(self.runs, *pair, tasks or findings.TASK_ORDER, seed=self.bootstrap_seed)

    def findings(self) -> str:
        n_models = self.summary["model"].n_unique()
        across = evidence.across_models(self.summary) if n_models > 1 else None
        pair = self._pair()
        control = evidence.quantization_control(self.results_dir, pair) if pair else None
        return findings.scale_finding(
            self.summary, self.paper, self.within, across, self.analysis.margin, quantization=control
        )

    def headline(self) -> dict:
        row = findings.scale_headline(self.summary, self.paper, self.within, self.analysis.margin)
        return {**row, **findings.specification_columns(self.specification_summary)}

    def specification_curve(self) -> pl.DataFrame | None:
        """The within-family pair's ratio difference per data set, under every specification."""
        pair = self._pair()
        if not pair:
            return None
        tasks = [t["task"] for t in self.p.get("tasks") or [] if t.get("task") in findings.TASK_ORDER]
        rules = tuple(reference.RULE_LABELS.values())
        curve = specification.scale_curve(
            self.runs, *pair, tasks, self.paper, self.analysis, rules, windowed=self.study("length")
        )
        return curve if curve.height else None

    def table1(self):
        return tables.table1(self.summary, self.paper)

    def ed_table(self):
        return tables.ed_summary(self.summary)

    def chart(self, name: str):
        probes = {  # chart → (the study it reads, the probe it draws)
            "cosine": (self.runs, "cosine"),
            "lens": (self.runs, "logit_lens"),
            "skip": (self.causal, "skip"),
            "skip-output": (self.causal, "skip"),
            "erasure": (self.causal, "erasure"),
            "igrad": (self.causal, "igrad"),
            "completeness": (self.causal, "igrad"),
        }
        frames = {
            "cosine": lambda: plots.contribution_bars(self.runs.frame("cosine"), summary=self.summary),
            "lens": lambda: plots.lens_curves(
                self.runs.frame("logit_lens"),
                self.summary,
                bands=curve_bands(self.runs.frame("logit_lens", per_example=True), seed=self.bootstrap_seed),
            ),
            "skip": lambda: plots.skip_heatmap(self.causal.frame("skip")),
            "skip-output": lambda: plots.output_effect_bars(self.causal.frame("skip")),
            "erasure": lambda: plots.erasure_heatmap(self.causal.frame("erasure", per_example=True)),
            "igrad": lambda: plots.attribution_heatmap(self.causal.frame("igrad", per_example=True), self._tokens()),
            "completeness": lambda: plots.completeness_bars(self.causal.frame("igrad", per_example=True)),
            "paper": lambda: plots.paper_vs_ours(
                pl.concat([reference.with_source(self.summary, reference.OURS), self.paper])
            ),
            "sensitivity": lambda: plots.threshold_sensitivity(self.runs.sensitivity()),
            "n_layers": lambda: plots.ed_against_scale(self.summary, "n_layers"),
            "n_params": lambda: plots.ed_against_scale(self.summary, "n_params"),
            "relative": lambda: plots.relative_depth_curves(
                pl.concat([self.runs.frame("cosine"), self.runs.frame("logit_lens")], how="diagonal_relaxed"),
                ["cos_attn", "cos_mlp", "cos_layer", "kl", "overlap"],
            ),
        }
        if name in ("n_layers", "n_params", "relative") and self.summary["model"].n_unique() < 2:
            if name != "n_layers":
                return None  # said once, under the first of the three
            return plots.note("One model on this page: the comparison page draws these three charts across the models.")
        if name in probes:
            return self.probe_chart(*probes[name], frames[name])
        return plots.show(frames[name]())


def intro(entries: list) -> tuple[list[dict], list[str]]:
    """The intro's scale finding: that of the page with the most models."""
    if not entries:
        return [], []
    _, widest = max(entries, key=lambda entry: len(entry[0].parameters.get("models") or []))
    return [widest.headline()], [widest.findings()]


SPEC = SectionSpec(
    name="scale",
    page=ScalePage,
    plans=plans,
    keys=frozenset({"models", "causal"}),
    intro=intro,
)
