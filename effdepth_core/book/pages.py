"""The book's pages as library calls. Each section's notebook template builds its page from its
papermill parameters (``page = pages.open_page("scale", parameters)``) and then shows one thing per
cell (``page.table1()``, ``page.chart("lens")``): no logic lives in the templates. The intro's
findings (``runner.findings_markdown``) come from the same page objects, reading the cache only."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from pathlib import Path

import polars as pl

from .. import registry
from . import (
    evidence,
    evidence_beyond,
    findings,
    findings_beyond,
    findings_long_cot,
    params_schema,
    plots,
    reference,
    tables,
)
from .sections import StudyPlan, plans
from .sections import defaults as shared_defaults
from .stats import curve_bands
from .study import Study, map_study, pruning_comparison, run_study, task_label


def parameters(section: str, namespace: Mapping) -> dict:
    """A template's parameters, picked by name from its namespace (``globals()`` in the notebook):
    every key the section's params may set (``params_schema.SECTION_KEYS``, which a test holds equal
    to the template's parameters cell) and those ``effdepth book`` fills in."""
    keys = params_schema.SECTION_KEYS[section] | params_schema.FILLED
    return {k: namespace[k] for k in sorted(keys) if k in namespace}


def heading(title: str):
    """The title cell every page shares: the page title as Markdown, glued for the book's heading."""
    from IPython.display import Markdown
    from myst_nb import glue

    glue("page_title", title, display=False)
    return Markdown(f"# {title}")


def _markdown(text: str):
    from IPython.display import Markdown

    return Markdown(text)


class Page:
    """What every page has: its parameters, the shared run settings, and cached-only reading."""

    section = ""

    def __init__(self, parameters: Mapping, cached_only: bool = False, root: Path | str = "."):
        self.p = dict(parameters)
        self.cached_only = cached_only
        self.root = Path(root)
        self.defaults = {**shared_defaults(self.p), "progress": False}

    @property
    def results_dir(self) -> Path:
        return self.root / self.p.get("results_dir", "results")

    @cached_property
    def plans(self) -> dict[str, StudyPlan]:
        """The page's studies by name, as ``sections.plans`` gives them to ``effdepth grid`` too: a
        page computes (or reads) exactly the runs the grid plans."""
        return {plan.name: plan for plan in plans(self.section, self.p)}

    def study(self, name: str) -> Study:
        """The study ``name`` of this page (an empty one when its section has none by that name)."""
        plan = self.plans.get(name) or StudyPlan(name, (), ())
        return run_study(
            list(plan.models),
            list(plan.specs),
            defaults=self.defaults,
            results_dir=self.results_dir,
            specs_by_model=plan.specs_by_model or None,
            cached_only=self.cached_only,
            download=plan.download,
        )

    @property
    def paper(self) -> pl.DataFrame:
        return reference.paper_table1()

    @property
    def bootstrap_seed(self) -> int:
        """The seed of the findings' bootstrap intervals (a book parameter; the robustness rule also
        checks the next two)."""
        return int(self.p.get("bootstrap_seed") or 0)

    def findings_markdown(self):
        return _markdown(self.findings())

    def not_run(self, study: Study, probe: str) -> str | None:
        """One line naming the models of ``study`` that ``probe`` did not run on, and why (it was not
        asked for there, or it failed); None when it ran on all of them."""
        title = registry.get(probe).title
        failed = {r.model: r.error for r in study.records if probe in r.probes and r.error}
        ran = {r.model for r in study.finished if r.asked(probe)}
        models = list(dict.fromkeys(r.model for r in study.records))
        missing = [m for m in models if m not in ran and m not in failed]
        parts = [f"could not run on {m}: {why}" for m, why in failed.items()]
        if missing:
            parts.append(
                f"not asked for on {', '.join(missing)} by params/{self.section}.yml (its comments give the cost "
                "that ruled it out on this CPU)"
            )
        return f"{title}: {'; '.join(parts)}." if parts else None

    def probe_chart(self, study: Study, probe: str, build):
        """``build()``'s chart of ``probe``, or, where it ran on no model of the page, the line saying
        why (never an empty chart)."""
        if not any(r.asked(probe) for r in study.finished):
            return plots.note(self.not_run(study, probe) or f"{registry.get(probe).title}: no results.")
        return plots.show(build())

    def status(self, models, unavailable):
        return tables.status(models, unavailable) if unavailable else None


class ScalePage(Page):
    section = "scale"

    @cached_property
    def runs(self) -> Study:
        return self.study("tasks")

    @cached_property
    def causal(self) -> Study:
        return self.study("causal")

    @cached_property
    def summary(self) -> pl.DataFrame:
        return self.runs.summary()

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
        return findings.scale_finding(self.summary, self.paper, self.within, across)

    def headline(self) -> dict:
        return findings.scale_headline(self.summary, self.paper, self.within)

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


class DifficultyPage(Page):
    section = "difficulty"

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
    def summary(self) -> pl.DataFrame:
        return pl.concat([self.by_task.summary(), self.by_level.summary()])

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
        )

    def headline(self) -> dict:
        return findings.difficulty_headline(self.by_task.summary(), self.between, self.paper)

    def chart(self, name: str):
        if name == "tasks":
            return plots.show(plots.ed_by_task(self.by_task.summary(), self.task_order))
        if name == "differences":
            return plots.show(plots.differences_against_margin(findings.difference_steps(self.between, self.paper)))
        if name == "levels":
            return plots.show(plots.ed_by_task(self.by_level.summary(), self.level_order))
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


class LongCotPage(Page):
    section = "long_cot"

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(m for pair in self.p.get("pairs") or [] for m in (pair["base"], pair["long_cot"])))

    @cached_property
    def runs(self) -> Study:
        return self.study("tasks")

    @cached_property
    def summary(self) -> pl.DataFrame:
        return self.runs.summary()

    @property
    def paper_pairs(self) -> pl.DataFrame:
        names = [m.rsplit("/", 1)[-1] for m in self.models]
        return self.paper.filter(pl.col("model").is_in(names))

    def findings(self) -> str:
        return findings_long_cot.long_cot_finding(
            self.summary, self.p.get("pairs") or [], self.runs.unavailable(), self.paper_pairs
        )

    def headline(self) -> dict:
        return findings_long_cot.long_cot_headline([self])

    def status_table(self):
        return tables.status(self.models, self.runs.unavailable())

    def table1(self):
        return tables.table1(self.summary, self.paper_pairs)

    def _table(self) -> pl.DataFrame:
        ours = [reference.with_source(self.summary, reference.OURS)] if self.summary.height else []
        return pl.concat([*ours, self.paper_pairs])

    def deltas(self):
        return tables.deltas(reference.pair_deltas(self._table(), self.p.get("pairs") or []))

    def chart(self, name: str = "paper"):
        return plots.show(plots.paper_vs_ours(self._table()))


class BeyondPage(Page):
    section = "beyond"

    @cached_property
    def runs(self) -> Study:
        return self.study("tasks")

    @cached_property
    def summary(self) -> pl.DataFrame:
        return self.runs.summary()

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
            "lenses": evidence.between_lenses(self.runs, seed=self.bootstrap_seed),
            "mapped": self.mapped,
            "pair": self.p.get("pair"),
            "statistic": statistics[0] if statistics else None,
            "seed_checks": statistics[1:],
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
            return plots.show(plots.lens_ed_comparison(self.summary))
        if name == "fit":
            fit = self.runs.frame("tuned_lens_fit")
            if not fit.height:
                return plots.note("No tuned lens was trained for this page's models (see params/beyond.yml).")
            return plots.show(plots.lens_fit_curves(fit))
        if name == "sensitivity":
            return plots.show(plots.threshold_sensitivity(self.runs.sensitivity()))
        if name == "pruning":
            return self.probe_chart(
                self.runs, "prune", lambda: plots.pruning_curves(self.runs.frame("prune"), self.summary)
            )
        if name == "exit":
            return self.probe_chart(
                self.runs, "early_exit", lambda: plots.early_exit_curves(self.runs.frame("early_exit"), self.summary)
            )
        pair = self.p["pair"]
        return plots.show(plots.map_heatmap(self.mapped, pair["small"], pair["big"]))

    def ed_table(self):
        return tables.ed_summary(self.summary)

    def part(self, name: str) -> None:
        """One of the page's parts: its heading and explanation, its chart, its table; nothing where
        the page's parameters leave the part without data (no models, no map pair)."""
        from IPython.display import display

        if (name == "map" and not self.p.get("pair")) or (name != "map" and not self.p.get("models")):
            return
        heading = BEYOND_PARTS[name]
        if name == "map":
            heading = heading.format(small=self.p["pair"]["small"], big=self.p["pair"]["big"])
        display(_markdown(heading), self.chart(name))
        if name == "lens":
            display(self.ed_table())
        if name == "pruning":
            display(self.pruning_table())

    def pruning_table(self):
        comparison = pruning_comparison(self.runs)
        return (
            tables.pruning_rules(comparison) if comparison.height else plots.note("The pruning probe was not run here.")
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

PAGES = {"scale": ScalePage, "difficulty": DifficultyPage, "long_cot": LongCotPage, "beyond": BeyondPage}


def open_page(section: str, parameters: Mapping, cached_only: bool = False, root: Path | str = ".") -> Page:
    """The page of ``section`` for these parameters (the notebooks: reads the cache, computes what is missing)."""
    return PAGES[section](parameters, cached_only=cached_only, root=root)
