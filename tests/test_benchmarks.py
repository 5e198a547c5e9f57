"""The benchmark scripts run (their numbers are measurements, not assertions: only that every probe
and published loop was timed, and that the operation counts they divide by are right)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import paper_scale


def test_paper_scale_runs_every_probe_on_a_tiny_configuration(capsys):
    paper_scale.main(["--tiny", "--rows-before", "--repeats", "2", "--igrad-default-panels", "1", "--dtype", "float32"])
    lines = capsys.readouterr().out.splitlines()
    timed = {line.split()[0] for line in lines if line.split() and line.split()[0] in paper_scale.PROBES}
    assert timed == set(paper_scale.PROBES)
    published = [line for line in lines if "2 runs] = " in line]  # each loop warmed up, then timed twice
    assert len(published) == 3  # skip, erasure and integrated gradients against their published loops
    assert any(line.startswith("igrad-rule") and "published Riemann-8 loop" in line for line in lines)
    assert any("16 rows per pass" in line for line in lines)


def test_the_operation_counts_by_hand():
    # one layer of d = 2, d_ff = 3, KV width 2, vocab 5: projections per query token
    # 2 · (2·2·2 + 2·2·2 + 3·2·3) = 2 · 34 = 68, and 4 · keys · d for scores and weighted values
    work = paper_scale.Work(layers=1, d=2, d_ff=3, kv=2, vocab=5)
    assert work.layer(queries=1, keys=1) == 68 + 8
    assert work.stack(3) == 3 * 68 + 4 * 3 * 2 * 2  # 3 tokens attend 2 keys on average (causal)
    assert work.head(4) == 2 * 4 * 2 * 5
    assert work.lens(3) == 2 * work.stack(3) + 3 * work.head(3)  # L + 2 = 3 decodes


def test_the_paper_grid_estimate_runs(capsys):
    paper_scale.main(["--paper-grid"])
    out = capsys.readouterr().out
    assert "Qwen2.5-32B: 3 models" in out and "in all" in out


@pytest.mark.parametrize(
    "argv",
    [["--sizes", "3B"], ["--probes", "lens,attn"], ["--sizes", ""], ["--n", "0"], ["--tokens", "3"],
     ["--igrad-steps", "0"], ["--short-tokens", "8", "--answer-tokens", "8"], ["--tiny", "--n", "3"]],
)  # fmt: skip
def test_paper_scale_refuses_unknown_sizes_and_probes(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        paper_scale.main(argv)
    assert exited.value.code == 2
