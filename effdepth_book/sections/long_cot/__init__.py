"""The long-CoT section: does long chain-of-thought training (R1 distillation) change ED over the
base model? One page per family of pairs."""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from ... import plots, reference, tables
from ...pages import Page
from ...spec import SectionSpec, StudyPlan
from . import findings as findings_long_cot


def plans(parameters: Mapping) -> list[StudyPlan]:
    """A long-CoT page's study: its tasks on both models of every pair."""
    tasks = tuple(parameters.get("tasks") or ())
    pairs = parameters.get("pairs") or []
    pair_models = tuple(dict.fromkeys(m for pair in pairs for m in (pair["base"], pair["long_cot"])))
    return [StudyPlan("tasks", pair_models, tasks, download=bool(parameters.get("download", True)))]


class LongCotPage(Page):
    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(m for pair in self.p.get("pairs") or [] for m in (pair["base"], pair["long_cot"])))

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


def intro(entries: list) -> tuple[list[dict], list[str]]:
    """One headline over every pair, and each family's finding under its page's title."""
    if not entries:
        return [], []
    pages = [page for _, page in entries]
    texts = [page.findings().replace("**Long-CoT training.**", f"**{item.title}.**", 1) for item, page in entries]
    return [findings_long_cot.long_cot_headline(pages)], texts


SPEC = SectionSpec(
    name="long_cot",
    page=LongCotPage,
    plans=plans,
    keys=frozenset({"pairs", "download"}),
    intro=intro,
)
