"""The paper's published numbers (Hu, Zhou, Zhang 2025, Table 1), for display beside ours.

They are reference values only: never written into results, never mixed into our own frames
without a ``source`` column that says where each row comes from.
"""

from __future__ import annotations

import polars as pl

from effdepth_core.measurement import registry

# The paper's three ED rules (its Table 1), in its order, and the tuned-lens rules the fourth section
# adds: which rules the book reports is the book's choice (the registry has every probe's rules).
PAPER_RULES = ("cosine", "logit_lens_kl", "logit_lens_overlap")
TUNED_RULES = ("tuned_lens_kl", "tuned_lens_overlap")


def _labels(keys: tuple[str, ...]) -> dict[str, str]:
    rules = registry.rules()
    return {key: rules[key][1].label for key in keys}


RULE_LABELS = _labels(PAPER_RULES)  # rule key → label, the paper's rules
TUNED_RULE_LABELS = _labels(TUNED_RULES)

PAPER = "paper (bf16 hub weights)"
OURS = "ours (quantized GGUF, fp32)"
# our model → the paper's model of the same architecture (both Qwen2.5, 28 layers, 12/2 heads)
COMPARABLE = {"qwen2.5-coder-1.5b": "Qwen2.5-1.5B-Instruct"}
TASKS = ("hellaswag", "gsm8k", "aime24")
RULES = tuple(RULE_LABELS.values())
# model (L) | cos H G A | KL H G A | overlap H G A — ED only; the ratio is (ED + 1) / L
_TABLE1 = """
DeepSeek-R1-Distill-Qwen-1.5B 28 | 17 16 17 | 20 1 24 | 23 23 24
Qwen2.5-1.5B-Instruct 28 | 16 20 19 | 21 22 23 | 23 23 23
Qwen2.5-Math-1.5B 28 | 16 16 16 | 20 22 23 | 23 23 23
DeepSeek-R1-Distill-Qwen-7B 28 | 16 16 16 | 24 24 24 | 25 25 24
Qwen2.5-7B-Instruct 28 | 17 20 18 | 25 25 25 | 26 26 26
Qwen2.5-Math-7B 28 | 16 11 16 | 23 23 23 | 24 24 24
DeepSeek-R1-Distill-Qwen-14B 48 | 26 30 30 | 40 39 41 | 44 44 44
Qwen2.5-14B-Instruct 48 | 27 32 30 | 40 41 42 | 45 45 45
Qwen2.5-14B 48 | 27 30 30 | 40 40 42 | 45 45 45
DeepSeek-R1-Distill-Qwen-32B 64 | 42 42 46 | 58 55 57 | 61 58 58
Qwen2.5-32B-Instruct 64 | 43 46 43 | 60 58 58 | 61 60 60
Qwen2.5-32B 64 | 43 46 46 | 60 57 59 | 61 59 60
"""


def paper_table1() -> pl.DataFrame:
    """Table 1 in long format: ``model, n_layers, task, rule, ed, ratio, source``."""
    rows = []
    for line in _TABLE1.strip().splitlines():
        head, *groups = (part.split() for part in line.split("|"))
        model, n_layers = head[0], int(head[1])
        for rule, values in zip(RULES, groups, strict=True):
            for task, ed in zip(TASKS, values, strict=True):
                rows.append((model, n_layers, task, rule, int(ed), (int(ed) + 1) / n_layers, PAPER))
    schema = {
        "model": pl.String,
        "n_layers": pl.Int64,
        "task": pl.String,
        "rule": pl.String,
        "ed": pl.Int64,
        "ratio": pl.Float64,
        "source": pl.String,
    }
    return pl.DataFrame(rows, schema=schema, orient="row")


def with_source(summary: pl.DataFrame, source: str) -> pl.DataFrame:
    """Our ED summary (``study.Study.summary``) in the reference table's columns."""
    return summary.select("model", "n_layers", "task", "rule", "ed", "ratio").with_columns(
        pl.lit(source).alias("source")
    )


def pair_deltas(table: pl.DataFrame, pairs: list[dict]) -> pl.DataFrame:
    """ED(long-CoT) − ED(base) per (pair, source, task, rule) from a long table with ``model`` names
    as in ``table`` (hub ids are matched by their last path part)."""
    keyed = table.with_columns(pl.col("model").str.split("/").list.last().alias("name"))
    rows = []
    for pair in pairs:
        base, long_cot = (str(pair[k]).rsplit("/", 1)[-1] for k in ("base", "long_cot"))
        b = keyed.filter(pl.col("name") == base).select("source", "task", "rule", pl.col("ed").alias("ed_base"))
        c = keyed.filter(pl.col("name") == long_cot).select("source", "task", "rule", pl.col("ed").alias("ed_long_cot"))
        joined = b.join(c, on=["source", "task", "rule"], how="inner").with_columns(
            pl.lit(base).alias("base"),
            pl.lit(long_cot).alias("long_cot"),
            (pl.col("ed_long_cot") - pl.col("ed_base")).alias("delta"),
        )
        rows.append(joined)
    schema = {
        "source": pl.String,
        "task": pl.String,
        "rule": pl.String,
        "ed_base": pl.Int64,
        "ed_long_cot": pl.Int64,
        "base": pl.String,
        "long_cot": pl.String,
        "delta": pl.Int64,
    }
    frame = pl.concat(rows) if rows else pl.DataFrame(schema=schema)
    return frame.select("source", "base", "long_cot", "task", "rule", "ed_base", "ed_long_cot", "delta")
