"""Beyond the paper: the logit lens beside the tuned lens, pruning after ED, early exit, and the
cross-model linear map."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property

import polars as pl

from ... import evidence as shared_evidence  # the book's; this section's own is .evidence
from ... import plots, specification, tables
from ...pages import Page, markdown
from ...spec import SectionSpec, StudyPlan, models_of
from ...study import map_study, pruning_comparison
from . import charts
from . import evidence as evidence_beyond
from . import findings as findings_beyond


def plans(parameters: Mapping) -> list[StudyPlan]:
    """A beyond page's study: its tasks on every model (the map's pair is a study of its own)."""
    models = models_of(parameters)
    tasks = tuple(parameters.get("tasks") or ())
    return [StudyPlan("tasks", models, tasks)]


class BeyondPage(Page):
    @cached_property
    def mapped(self) -> pl.DataFrame:
        pair = self.p.get("pair")
        return map_study(pair, self.defaults, self.results_dir, self.cached_only) if pair else pl.DataFrame()

    @cached_property
    def evidence(self) -> dict:
        """What the findings read: the frames of the lens, pruning and early-exit questions, and the
        map's statistic under the book's bootstrap seed and the next two (the verdict must not
        depend on the seed)."""
        seeds = [self.bootstrap_seed + k for k in range(3)]
        statistics = [evidence_beyond.map_statistic(self.mapped, seed=s) for s in seeds] if self.mapped.height else []
        return {
            "model": (self.p.get("models") or [None])[0] if len(self.p.get("models") or []) == 1 else None,
            "summary": self.summary,
            "fit": self.runs.frame("tuned_lens_fit"),
            "costs": evidence_beyond.pruning_costs(self.runs, seed=self.bootstrap_seed),
            "exits": evidence_beyond.early_exit_costs(self.runs, self.summary, seed=self.bootstrap_seed),
            "lenses": shared_evidence.between_lenses(self.runs, seed=self.bootstrap_seed),
            "mapped": self.mapped,
            "pair": self.p.get("pair"),
            "statistic": statistics[0] if statistics else None,
            "seed_checks": statistics[1:],
            "specifications": self.specification_summary,
        }

    def findings(self) -> str:
        f = self.evidence
        return findings_beyond.beyond_finding(
            f["summary"],
            f["fit"],
            f["costs"],
            f["exits"],
            f["mapped"],
            f["pair"],
            lenses=f["lenses"],
            statistic=f["statistic"],
            seed_checks=f["seed_checks"],
        )

    def chart(self, name: str):
        if name == "lens":
            return plots.show(charts.lens_ed_comparison(self.summary))
        if name == "fit":
            fit = self.runs.frame("tuned_lens_fit")
            if not fit.height:
                return plots.note("No tuned lens was trained for this page's models (see params/beyond.yml).")
            return plots.show(charts.lens_fit_curves(fit))
        if name == "sensitivity":
            return plots.show(plots.threshold_sensitivity(self.runs.sensitivity()))
        if name == "pruning":
            return self.probe_chart(
                self.runs, "prune", lambda: charts.pruning_curves(self.runs.frame("prune"), self.summary)
            )
        if name == "exit":
            return self.probe_chart(
                self.runs, "early_exit", lambda: charts.early_exit_curves(self.runs.frame("early_exit"), self.summary)
            )
        pair = self.p["pair"]
        return plots.show(charts.map_heatmap(self.mapped, pair["small"], pair["big"]))

    def ed_table(self):
        return tables.ed_summary(self.summary)

    def specification_curve(self) -> pl.DataFrame | None:
        """Tuned − logit lens per run and lens rule, under every specification."""
        curve = specification.lens_curve(self.runs, self.analysis)
        return curve if curve.height else None

    def part(self, name: str) -> None:
        """One of the page's parts: its heading and explanation, its chart, its table; nothing where
        the page's parameters leave the part without data (no models, no map pair)."""
        from IPython.display import display

        if (name == "map" and not self.p.get("pair")) or (name != "map" and not self.p.get("models")):
            return
        heading = BEYOND_PARTS[name]
        if name == "map":
            heading = heading.format(small=self.p["pair"]["small"], big=self.p["pair"]["big"])
        display(markdown(heading), self.chart(name))
        if name == "lens":
            display(self.ed_table())
            if self.specifications is not None:
                display(markdown(LENS_CURVE), self.specification_table(), self.specification_chart())
        if name == "pruning":
            display(self.pruning_table())

    def pruning_table(self):
        comparison = pruning_comparison(self.runs)
        return (
            tables.pruning_rules(comparison) if comparison.height else plots.note("The pruning probe was not run here.")
        )


LENS_CURVE = (
    "### The lens question across the reasonable analyses\n\nTuned − logit lens depth (layers, paired over "
    "the run's prompts) under every specification (docs/method.md §13; the margin is one layer): *disagree* "
    "means the tuned lens moves the depth by more than a layer, *agree* that it stays within one. The table gives "
    "the primary verdict, its equivalence bound and the share of the other specifications that agree."
)

BEYOND_PARTS = {
    "lens": "## Logit lens beside tuned lens\n\nED by each lens rule (KL below half its maximum; top-5 overlap "
    "above 0.3) with its 95% bootstrap interval over prompts; degenerate EDs are drawn hollow. Where the tuned "
    "lens sits with the logit lens, ED is a property of the model, not of the lens.",
    "fit": "## Are the translators trained enough?\n\nHeld-out KL to the final distribution per layer on "
    "lens-corpus texts the translators never saw: the tuned lens can be trusted where its curve lies below the "
    "logit lens's.",
    "sensitivity": "## How much an ED depends on its threshold\n\nED of each lens rule as its threshold varies "
    "(the KL fraction from 0.3 to 0.7, the overlap threshold from 0.2 to 0.5), for both lenses: a flat curve "
    "means the threshold does not decide the finding.",
    "pruning": "## Pruning: what removing layers costs\n\nThe increase of the answer tokens' mean negative "
    "log-likelihood when a block of k consecutive layers is removed, by its first layer (symmetric log scale: "
    "below 0 removing helps); the dotted line is the layer after the ED picked in the dropdown. The table "
    "compares three ways to choose the layers for each budget k: the block right after ED (per ED rule), "
    "Gromov et al.'s least angular distance between a block's input and output, and ShortGPT's k least "
    "influential layers.",
    "exit": "## Early exit: what stopping at a layer costs\n\nDecoding each layer's residual as if the model "
    "stopped there: the share of tokens whose top-1 token is already the final one, the answer NLL, and that "
    "NLL's rise over the full model's per layer saved (the price of each skipped layer at every exit); the "
    "dotted line marks exiting right after the lens-overlap ED (the layers saved are the ones to its right).",
    "map": "## Cross-model linear map: {small} → {big}\n\nHeld-out relative error of an affine map from each "
    "layer of the shallower model to each layer of the deeper one, on the same tokens of held-out prompts (left; "
    "white circles: the best big-model layer per small-model layer; dashed: equal relative depth), beside the "
    "same maps fitted on shuffled token pairs (the baseline: what a map learns without correspondence) and the "
    "small model mapped onto itself (the check: its valley must lie on the diagonal). A valley along the "
    "diagonal, well below the baseline, means the deeper model stretches the shallower one's computation.",
}


def intro(entries: list) -> tuple[list[dict], list[str]]:
    """The headlines over every beyond page, and each page's finding where something was measured."""
    if not entries:
        return [], []
    paragraphs = []
    for item, page in entries:
        text = page.findings()
        if text and "Nothing was measured" not in text:
            models = item.parameters.get("models") or []
            lead = f"**{item.title}.**" if len(models) == 1 else "**Beyond the paper.**"  # the map names its pair
            paragraphs.append(f"{lead} {text}")
    return findings_beyond.beyond_headlines([page.evidence for _, page in entries]), paragraphs


SPEC = SectionSpec(
    name="beyond",
    page=BeyondPage,
    plans=plans,
    keys=frozenset({"models", "pair"}),
    intro=intro,
)
