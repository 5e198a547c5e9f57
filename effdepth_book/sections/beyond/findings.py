"""The findings of the pages beyond the paper, as sentences from evidence: is ED a lens artefact
(tuned − logit lens), what cutting the layers after ED costs against other choices, what exiting
there costs, and whether a deeper model stretches a shallower one (the cross-model map). Each
verdict is decided here from numbers with intervals; the shared wording is ``findings``'."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import polars as pl

from effdepth_core.measurement.probes.prune import FINAL_KEPT

from ...findings import (
    MINUS,
    SMALL,
    count_of,
    decide,
    ed_panel,
    interval_text,
    judge,
    own_cells,
    specification_columns,
    task_name,
)


def lens_finding(summary: pl.DataFrame, fit: pl.DataFrame | None = None, lenses: pl.DataFrame | None = None) -> str:
    """Is ED an artefact of the logit lens? The paired difference of the primary depth statistic,
    tuned − logit lens, per model, task and lens rule (``lenses``: ``evidence.between_lenses``; the
    integer ED's beside it): no when every usable difference lies within ±1 layer (the margin; a
    small difference when its interval also excludes 0), yes when every one lies beyond it, in part
    when some provably move and some provably stay, a qualified yes or no when the others' intervals
    reach across ±1, else cannot tell; degenerate depths and intervals from fewer than 20 prompts
    never count. And how well the translators fit."""
    question = "**Is ED an artefact of the logit lens?**"
    if lenses is None or not lenses.height:
        return f"{question} No tuned lens was run on this page: **we cannot tell**."
    usable = lenses.filter(pl.col("excluded").is_null())
    decided = []  # (verdict, why, the book's own row) per model, task and lens rule
    for _, checks in usable.group_by(["model", "task", "lens_rule"], maintain_order=True):
        if own_cells(checks)["low"][0] is not None:
            decided.append(decide(checks, lambda r: judge(r["low"], r["high"], 1.0)))
    verdicts = ["agree" if verdict == SMALL else verdict for verdict, _, _ in decided]  # within a layer
    if not verdicts:
        answer = "**we cannot tell**: no usable pair of EDs"
    elif all(v == "agree" for v in verdicts):
        answer = "**no**: the tuned lens puts every usable depth within a layer of the logit lens's"
    elif all(v == "disagree" for v in verdicts):
        answer = "**yes**: every usable tuned-lens depth moves by more than a layer"
    else:
        moved = sum(v == "disagree" for v in verdicts)
        stayed = sum(v == "agree" for v in verdicts)
        unclear = len(verdicts) - moved - stayed  # intervals that reach across ±1 layer
        of = f"of {len(verdicts)} usable depths"
        tail = f"; {unclear} cannot tell (an interval across ±1 layer, or a robustness check failed)" if unclear else ""
        if moved and stayed:  # some EDs provably move, some provably stay: a mixed answer
            stay = "stays" if stayed == 1 else "stay"
            answer = f"**in part**: {moved} {of} move by more than a layer, {stayed} {stay}{tail}"
        elif moved:  # the rest cannot be told apart from ±1: a yes as far as the intervals can tell
            answer = f"**yes, where the intervals can tell**: {moved} {of} move by more than a layer{tail}"
        elif stayed:
            answer = f"**no, where the intervals can tell**: {stayed} {of} stay within a layer{tail}"
        else:  # name the test that failed: a verdict that changes across the checks, or the interval itself
            changed = sum(why is not None for _, why, _ in decided)
            reasons = [f"{changed} {of} change with the bootstrap seed"] if changed else []
            if changed < len(verdicts):
                reasons.append(f"{count_of(len(verdicts) - changed, 'interval')} across ±1 layer at every check")
            answer = f"**we cannot tell**: no usable depth provably moves or stays; {' and '.join(reasons)}"
    text = [f"{question} {answer}."]
    for model in dict.fromkeys(own["model"] for _, _, own in decided):
        cells = [
            f"{task_name(own['task'])} {own['lens_rule']} {interval_text(own, 1)}"
            + (f" (n = {own['n']}{ed_panel(own, 0)})" if own.get("n") is not None else "")
            + (f" (cannot tell: {why})" if why else "")
            for _, why, own in decided
            if own["model"] == model
        ]
        text.append(f"{model}, tuned − logit depth in layers: {'; '.join(cells)}.")
    excluded = own_cells(lenses).filter(pl.col("excluded").is_not_null())
    if excluded.height:
        cells = [f"{r['model']} {task_name(r['task'])} {r['lens_rule']}" for r in excluded.iter_rows(named=True)]
        text.append(f"Not counted (degenerate, or fewer than 20 prompts): {'; '.join(cells)}.")
    if fit is not None and fit.height:
        sentences = []
        for model in lenses["model"].unique(maintain_order=True):
            wide = (
                fit.filter(model=model)
                .unique(["layer", "metric"])
                .pivot(on="metric", index="layer", values="value")
                .sort("layer")
            )
            if not wide.height:
                continue
            better = int((wide["heldout_kl_tuned"] < wide["heldout_kl_logit"]).sum())
            sentences.append(
                f"{model} at {better} of {wide.height} layers (mean {wide['heldout_kl_logit'].mean():.2f} → "
                f"{wide['heldout_kl_tuned'].mean():.2f} nats)"
            )
        if sentences:
            text.append(
                "The translators lower the held-out KL to the final distribution: " + "; ".join(sentences) + "."
            )
    return " ".join(text)


def _nats(value: float) -> str:
    """A signed number of nats, with the typographic minus the findings use; one that rounds to
    zero keeps the digit that shows its side (an interval's end at −0.004, not "−0.00")."""
    digits = 3 if 0 < abs(value) < 0.005 else 2
    return f"{value:+.{digits}f}".replace("-", MINUS)


def _prune_verdict(rows: pl.DataFrame) -> str:
    """The verdict over a variant's counted budgets (``evidence.pruning_costs`` rows)."""
    counts = {v: rows.filter(verdict=v).height for v in ("cheaper", "costlier", "unclear", "tie")}
    total = rows.height
    ties = f", {count_of(counts['tie'], 'tie')} (the same layers)" if counts["tie"] else ""
    if counts["cheaper"] == total:
        return f"**yes**: cheaper in {'the one budget' if total == 1 else f'all {total} budgets'}"
    if counts["cheaper"] and counts["costlier"]:
        unclear = f", {counts['unclear']} unclear (a threshold, a seed or the interval)" if counts["unclear"] else ""
        return (
            f"**sometimes**: cheaper in {counts['cheaper']} and costlier in {counts['costlier']} of {total} "
            f"budgets{ties}{unclear}"
        )
    if counts["costlier"] and not counts["cheaper"] and not counts["unclear"]:
        return f"**no**: costlier in {counts['costlier']} of {total} budgets{ties}"
    if counts["tie"] == total:
        return "**a tie**: every rule picks the same layers"
    return (
        f"**we cannot tell**: {counts['unclear']} of {total} budgets have an interval across zero or change with the "
        f"bootstrap seed or the ED's threshold (cheaper in {counts['cheaper']}, costlier in {counts['costlier']}{ties})"
    )


def _rank(row: Mapping) -> str:
    """``; 5 of the 23 blocks of 8 layers cost less``: the after-ED block among every contiguous one."""
    if row.get("percentile") is None or not row.get("blocks"):
        return ""
    cheaper = round(row["percentile"] * row["blocks"])
    return f"; {cheaper} of the {row['blocks']} contiguous blocks of {row['k']} layers cost less"


def pruning_finding(costs: pl.DataFrame, ed_rule: str = "lens overlap") -> str:
    """Is the block right after ED (of ``ed_rule``, one rule so that the verdict is not the best of
    several tries) cheaper to cut than the layers angular distance or block influence choose, budget
    by budget, with intervals over prompts? ``costs``: ``evidence.pruning_costs`` rows. The plain
    block and the one that keeps the final layer each get a verdict; runs with fewer prompts than
    ``evidence.MIN_PRUNE_N`` are named, never counted."""
    from .evidence import MIN_PRUNE_N

    question = (
        f"**Is the block right after ED ({ed_rule}) cheaper to cut than the layers angular distance or block "
        "influence choose?**"
    )
    if not costs.height:
        return f"{question} Not measured here: **we cannot tell**."
    counted = costs.filter("counted")
    if not counted.height:
        return (
            f"{question} Only runs of fewer than {MIN_PRUNE_N} prompts (n = {costs['n'].max()}), too few to resample: "
            "**we cannot tell**."
        )
    text = [question]
    for variant, name in (("", "The block after ED"), (FINAL_KEPT, "Kept off the final layer, it")):
        rows = counted.filter(variant=variant)
        if rows.height:
            text.append(f"{name}: {_prune_verdict(rows)}.")
    cells = []
    for (model, task), group in counted.filter(variant="").group_by(["model", "task"], maintain_order=True):
        after = group.filter(~pl.col("holds_final"))  # a block moved back to end at the final layer is not after ED
        largest = (after if after.height else group).sort("k").row(-1, named=True)
        kept = counted.filter(model=model, task=task, k=largest["k"], variant=FINAL_KEPT)

        def multiple(row: dict) -> str:
            if row["ratio"] is None:
                return f"{_nats(row['difference'])} nats [{_nats(row['low'])}, {_nats(row['high'])}] over it"
            spread = f" [{row['ratio_low']:.1f}, {row['ratio_high']:.1f}]" if row["ratio_low"] is not None else " [—]"
            return f"{row['ratio']:.1f}×{spread}"

        cell = (
            f"{model} {task_name(task)}, {largest['k']} layers ({largest['removed']}): {multiple(largest)} the best "
            f"alternative's ΔNLL ({largest['best_alternative']} {_nats(largest['best_delta_nll'])} nats)"
        )
        if kept.height:
            cell += f", kept off the final layer ({kept['removed'][0]}) {multiple(kept.row(0, named=True))}"
        if not after.height:  # every budget's block was moved back to end at the final layer
            cell += " — no budget's block lies after ED here: this one is moved back and starts at or before ED"
        cells.append(cell + _rank(largest) + f", n = {largest['n']}")
    text.append(
        f"At the largest budget whose block lies after ED (else the largest, said so): {'; '.join(cells)} "
        "(95 % intervals over prompts)."
    )
    plain = counted.filter(variant="")
    holding = plain.filter("holds_final").height
    if holding:
        text.append(
            f"Caveat: in {holding} of {plain.height} budgets the block after ED removes the final layer (it is "
            "moved back to end there when ED + k passes it); the kept-off variant ends one layer earlier, so "
            "where either is moved back it starts at or before ED and cuts layers the rule counts as used: "
            "there neither is the block after ED."
        )
    few = costs.filter(~pl.col("counted")).select("model", "task", "n").unique(maintain_order=True)
    if few.height:
        named = ", ".join(f"{r['model']} {task_name(r['task'])} (n = {r['n']})" for r in few.iter_rows(named=True))
        text.append(f"Shown, not counted (fewer than {MIN_PRUNE_N} prompts): {named}.")
    return " ".join(text)


def early_exit_finding(costs: pl.DataFrame, rule: str = "lens overlap") -> str:
    """What exiting right after ED buys (layers saved) and costs (tokens whose top-1 changes, the
    answer NLL), with intervals over prompts, and what it says of the layers after ED: if exiting
    there costs answer likelihood in every counted run, they are not idle. ``costs``:
    ``evidence.early_exit_costs`` rows."""
    from .evidence import MIN_PRUNE_N

    question = f"**What does exiting at ED (the {rule} rule) cost?**"
    if not costs.height:
        return f"{question} The early-exit probe was not run here, or no usable ED to exit at: **we cannot tell**."
    counted = costs.filter("counted")

    def exits(r: Mapping) -> str:
        low, high = r.get("exit_low"), r.get("exit_high")
        if low is None or low == high:
            return ""
        return f"; over the threshold range after layer {low - 1}–{high - 1}"

    cells = [
        f"{r['model']} {task_name(r['task'])} ({r['lens']} lens, exit after layer {r['exit_layer'] - 1}, "
        f"layers counted from 0 of {r['n_layers']}{exits(r)}): "
        f"saves {r['saved']:.0%}, {r['kept']:.0%} [{r['kept_low']:.0%}, {r['kept_high']:.0%}] of tokens keep their "
        f"final top-1, answer NLL {_nats(r['cost'])} [{_nats(r['cost_low'])}, {_nats(r['cost_high'])}] nats, "
        f"n = {r['n']}" + ("" if r["counted"] else " (not counted)")
        for r in costs.iter_rows(named=True)
    ]
    if not counted.height:
        verdict = f"only runs of fewer than {MIN_PRUNE_N} prompts: **we cannot tell**"
    elif counted["positive"].all():
        verdict = (
            "**the layers after ED are not idle**: exiting there raises the answer NLL in "
            + ("its one counted run" if counted.height == 1 else f"all {counted.height} counted runs")
            + ", every interval above zero under three bootstrap seeds and at every threshold of the rule's "
            "range (the exits each cell's range gives are named below)"
        )
    else:
        failed = counted.filter(~pl.col("positive"))
        whys = "; ".join(
            f"{r['model']} {task_name(r['task'])} {r['lens']} lens: {r['why']}" for r in failed.iter_rows(named=True)
        )
        verdict = (
            f"**we cannot tell** whether the layers after ED matter: in {failed.height} of {counted.height} "
            f"counted runs the cost's interval reaches zero ({whys})"
        )
    return f"{question} {verdict}. " + "; ".join(cells) + " (95 % intervals over prompts)."


def _share_class(low: float, high: float) -> str:
    """What one share's interval says: yes above ⅔ of the layers, no below ⅓, else nothing."""
    return "yes" if low >= 2 / 3 else ("no" if high <= 1 / 3 else "cannot tell")


def _map_verdict(statistic: Mapping) -> str:
    """The map's verdict by the documented rule (docs/method.md §7b): the raw share and the
    column-centred share (a big layer easy to predict from any small layer must not make the
    diagonal) must decide alike, else cannot tell; before the seed check."""
    low, high = statistic["centred_low"], statistic["centred_high"]
    if statistic["self_max"] >= 1e-3:  # float64 normal equations: the identity to many digits
        return "**we cannot tell**: mapped onto itself the small model does not give the identity"
    if statistic["beats_baseline"] < 0.5:
        return "**we cannot tell**: the maps are no better than maps fitted on shuffled token pairs"
    centred = _share_class(low, high)
    raw = _share_class(statistic["low"], statistic["high"])
    if centred != raw:
        return (
            f"**we cannot tell**: the two shares decide differently — raw {statistic['share']:.0%} "
            f"[{statistic['low']:.0%}, {statistic['high']:.0%}] says {raw}, column bias removed "
            f"{statistic['centred_share']:.0%} [{low:.0%}, {high:.0%}] says {centred} (method.md §7b: cannot tell)"
        )
    if centred == "yes":
        return "**yes**: the best layers follow equal relative depth, raw and with column bias removed"
    if centred == "no":
        return "**no**: the best layers do not follow equal relative depth, raw or with column bias removed"
    return (
        f"**we cannot tell**: both shares' intervals (raw [{statistic['low']:.0%}, {statistic['high']:.0%}], "
        f"column bias removed [{low:.0%}, {high:.0%}]) lie neither above ⅔ of the layers (yes) nor below ⅓ (no)"
    )


def map_finding(
    mapped: pl.DataFrame,
    small: str,
    big: str,
    statistic: Mapping | None = None,
    seed_checks: Sequence[Mapping] = (),
) -> str:
    """Does the big model stretch the small one? The share of the small model's inner layers whose
    best-predicted big layer lies within ``evidence.STRETCH_SLACK`` of equal relative depth,
    column bias removed, with its bootstrap interval over test prompts (``statistic``:
    ``evidence.map_statistic``), against the shuffled-pairing baseline and the self-map check;
    ``seed_checks``, the same statistic under other bootstrap seeds, must give the same verdict."""
    question = f"**Does {big} stretch the computation of {small}?**"
    if not {"small_layer", "big_layer", "metric", "value"} <= set(mapped.columns) or statistic is None:
        return f"{question} The map was not computed: **we cannot tell**."
    share, low, high = statistic["share"], statistic["low"], statistic["high"]
    exact = statistic["self_max"] < 1e-3
    verdict = _map_verdict(statistic)
    changed = [check for check in seed_checks if _map_verdict(check).split(":")[0] != verdict.split(":")[0]]
    if changed:
        verdict = (
            f"**we cannot tell**: the verdict changes with the bootstrap seed ({verdict.split(':')[0].strip('*')} "
            f"at this seed, {_map_verdict(changed[0]).split(':')[0].strip('*')} at another)"
        )
    text = [f"{question} {verdict}."]
    text.append(
        f"With each big layer's mean error removed (the column bias), for {statistic['centred_share']:.0%} "
        f"[{statistic['centred_low']:.0%}, {statistic['centred_high']:.0%}] of the {statistic['inner']} inner "
        f"layers of {small} the best {big} layer lies within {statistic['slack']:.1f} layers of equal relative "
        f"depth; a best layer drawn at random would do so for {statistic['chance']:.0%}."
    )
    text.append(
        f"Without that correction the share is {share:.0%} [{low:.0%}, {high:.0%}] (the same statistic, the mean "
        f"over test prompts, for point and interval): {big}'s layer {statistic['easiest_big_layer']} is the "
        f"easiest to predict (mean error over the small layers {statistic['column_low']:.2f}, the hardest "
        f"{statistic['column_high']:.2f})."
    )
    text.append(
        f"Best-layer errors are {statistic['best_low']:.2f}–{statistic['best_high']:.2f}; shuffled pairs give "
        f"{statistic['baseline_low']:.2f}–{statistic['baseline_high']:.2f} there."
    )
    layer0 = statistic.get("self_layer0")
    embeddings = (
        f"; at layer 0, the token embeddings, {layer0:.2f}: test tokens the training prompts never held"
        if layer0 is not None and layer0 >= 1e-3
        else ""
    )
    text.append(
        f"Mapped onto itself by the same fit (ridge chosen per map), {small} gives at most "
        f"{statistic['self_max']:.1e} on the diagonal "
        "beyond layer 0"
        + (f" (the identity, as it must{embeddings})." if exact else ": not the identity, so the fit is in doubt.")
    )
    ratio = statistic["train_tokens"] / statistic["width"]
    text.append(
        f"The maps fit on {statistic['train_tokens']:.0f} tokens ({ratio:.0f}× the width of {small}), each map's ridge "
        f"chosen on held-out prompts; {statistic['test_prompts']:.0f} test prompts."
    )
    return " ".join(text)


def beyond_finding(
    summary: pl.DataFrame,
    fit: pl.DataFrame,
    costs: pl.DataFrame,
    exits: pl.DataFrame,
    mapped: pl.DataFrame | None = None,
    pair: Mapping | None = None,
    lenses: pl.DataFrame | None = None,
    statistic: Mapping | None = None,
    seed_checks: Sequence[Mapping] = (),
) -> str:
    """The paragraphs of a "beyond the paper" page: the map's, or the lens, pruning and early-exit ones
    (``costs``: ``evidence.pruning_costs``; ``exits``: ``evidence.early_exit_costs``)."""
    paragraphs = []
    if pair:
        mapped = mapped if mapped is not None else pl.DataFrame()
        paragraphs.append(map_finding(mapped, pair["small"], pair["big"], statistic, seed_checks))
    if summary.height:
        paragraphs += [
            lens_finding(summary, fit, lenses),
            pruning_finding(costs),
            early_exit_finding(exits),
        ]
    return "\n\n".join(paragraphs) or "Nothing was measured on this page."


# --- the intro table's rows of the questions beyond the paper ------------------------------------


def _answer(text: str, after: str = "?**") -> str:
    """The bold answer a finding gives after ``after`` (its question): ``in part``, ``no``, …"""
    match = re.search(r"\*\*(.+?)\*\*", text.split(after, 1)[-1])
    return match.group(1).removeprefix("we ") if match else "cannot tell"


def _row(question: str, claim: str, verdicts: Sequence[str], models: str, effect: str, margin: str, caveat: str):
    return {"question": question, "claim": claim, "verdict": "; ".join(verdicts) or "cannot tell",
            "models": models, "effect": effect or "—", "tolerance": margin, "caveat": caveat}  # fmt: skip


def _n_range(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return f"n = {low}" if low == high else f"n = {low}–{high}"


def beyond_headlines(pages: Sequence[Mapping]) -> list[dict]:
    """The intro table's rows for the lens artefact, pruning, early exit and the cross-model map, one
    verdict per model (``model: answer``) and the largest effect that counts. ``pages``: per page of
    the fourth section, its ``model`` (or None for the map's) and the frames its findings read
    (``summary, costs, exits, lenses``; ``mapped, pair, statistic, seed_checks`` for the map)."""
    lens_verdicts, lens_effects, lens_n = [], [], []
    prune_verdicts, prune_effects, prune_n = [], [], []
    exit_verdicts, exit_effects, exit_n = [], [], []
    rows = []
    for page in pages:
        model, lenses = page.get("model"), page.get("lenses")
        if model is None:
            continue
        if lenses is not None and lenses.height:
            lens_verdicts.append(f"{model}: {_answer(lens_finding(page['summary'], None, lenses))}")
            usable = own_cells(lenses).filter(pl.col("excluded").is_null(), pl.col("low").is_not_null())
            if usable.height:
                top = usable.sort(pl.col("point").abs(), descending=True).row(0, named=True)
                lens_effects.append(f"{model} {task_name(top['task'])} {top['lens_rule']} {interval_text(top, 1)}")
                lens_n += usable["n"].to_list()
        costs = page.get("costs")
        if costs is not None and costs.height and costs.filter("counted").height:
            counted = costs.filter("counted", variant="")
            prune_verdicts.append(f"{model}: {_answer(pruning_finding(costs), 'The block after ED:')}")
            after = counted.filter(~pl.col("holds_final"))  # the largest budget whose block is after ED
            top = (after if after.height else counted).sort("k", descending=True).row(0, named=True)
            if top["ratio"] is not None:
                spread = f" [{top['ratio_low']:.1f}, {top['ratio_high']:.1f}]" if top["ratio_low"] is not None else ""
                moved = "" if after.height else " (moved back: not after ED)"
                prune_effects.append(
                    f"{model} {task_name(top['task'])} k = {top['k']}{moved}: {top['ratio']:.1f}×{spread}{_rank(top)}"
                )
            prune_n += counted["n"].to_list()
        exits = page.get("exits")
        if exits is not None and exits.height and exits.filter("counted").height:
            counted = exits.filter("counted")
            exit_verdicts.append(f"{model}: {_answer(early_exit_finding(exits))}")
            low = counted.sort("cost").row(0, named=True)
            exit_effects.append(
                f"{model} {task_name(low['task'])} ({low['lens']} lens): {_nats(low['cost'])} "
                f"[{_nats(low['cost_low'])}, {_nats(low['cost_high'])}] nats"
            )
            exit_n += counted["n"].to_list()
    summaries = [page["specifications"] for page in pages if page.get("specifications") is not None]
    rows.append(
        {
            **_row(
                "Lens artefact (beyond)",
                "(ours) the tuned lens moves the lens depths by more than a layer",
                lens_verdicts,
                f"{count_of(len(lens_verdicts), 'model')}, {_n_range(lens_n)}" if lens_n else "no tuned lens run",
                "tuned − logit depth, the largest per model: " + "; ".join(lens_effects) if lens_effects else "",
                "±1 layer",
                "a tuned lens trained here on a CPU budget; the other models have none",
            ),
            **specification_columns(pl.concat(summaries) if summaries else None, unit="layers"),
        }
    )
    rows.append(
        _row(
            "Pruning after ED (beyond)",
            "(ours) the block right after ED is the cheapest to cut",
            prune_verdicts,
            f"{count_of(len(prune_verdicts), 'model')}, {_n_range(prune_n)}" if prune_n else "not run",
            "ΔNLL of the block after ED ÷ the best alternative's, largest budget: " + "; ".join(prune_effects)
            if prune_effects
            else "",
            "1× (the best alternative's cost), 95 % intervals over prompts",
            "where ED + k passes the final layer the block is moved back and is not after ED",
        )
    )
    rows.append(
        _row(
            "Early exit at ED (beyond)",
            "(ours) the layers after ED are idle",
            exit_verdicts,
            f"{count_of(len(exit_verdicts), 'model')}, {_n_range(exit_n)}" if exit_n else "not run",
            "answer NLL of exiting after ED, the smallest per model: " + "; ".join(exit_effects)
            if exit_effects
            else "",
            "0 nats (any cost), 95 % intervals over prompts",
            f"runs of {_n_range(exit_n)[4:]} prompts" if exit_n else "",
        )
    )
    for page in pages:
        pair, statistic = page.get("pair"), page.get("statistic")
        if not pair:
            continue
        text = map_finding(page["mapped"], pair["small"], pair["big"], statistic, page.get("seed_checks") or ())
        effect = (
            f"share of {pair['small']}'s layers whose best {pair['big']} layer lies within {statistic['slack']:.1f} "
            f"layers of equal relative depth, column bias removed: {statistic['centred_share']:.0%} "
            f"[{statistic['centred_low']:.0%}, {statistic['centred_high']:.0%}]; raw {statistic['share']:.0%} "
            f"[{statistic['low']:.0%}, {statistic['high']:.0%}]"
            if statistic
            else ""
        )
        rows.append(
            _row(
                "Cross-model map (beyond)",
                f"(ours) {pair['big']} stretches {pair['small']}'s computation",
                [_answer(text)],
                f"one pair, {statistic['test_prompts']:.0f} test prompts" if statistic else "not computed",
                effect,
                "yes above ⅔ of the layers, no below ⅓, both shares alike",
                "one pair of one family; the raw and the centred shares must agree",
            )
        )
    return rows
