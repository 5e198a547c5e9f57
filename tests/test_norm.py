"""The residual-norm probe (the worked example of adding a probe, docs/probes.md): its values equal
the norms of the residuals a clean forward pass records, on every architecture; its ED rule is
checked by hand; the command line, cache key and table pick it up from its spec alone."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ARCHS, make_tiny, random_prompts

from effdepth_core.cli import main
from effdepth_core.measurement.probes.norm import ed_norm, residual_norm
from effdepth_core.measurement.replay import clean_run
from effdepth_core.settings import RunSettings


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_residual_norm_equals_the_recorded_residuals(arch):
    loaded = make_tiny(arch)
    prompts = random_prompts([7, 12])
    frame = residual_norm(loaded, prompts, batch_size=2)  # padded batch of two lengths
    for example, ids in enumerate(prompts):
        hidden = clean_run(loaded, ids).hidden  # h_0..h_L, one prompt, no padding
        expected = [float(h[0].float().norm(dim=-1).mean()) for h in hidden]
        got = frame.filter(example=example).sort("layer")["value"].to_list()
        # float32 norms of residuals of order 1-10, batched vs alone: ~1e-6 relative
        np.testing.assert_allclose(got, expected, rtol=1e-5)
        assert frame.filter(example=example)["n_tokens"].unique().to_list() == [ids.numel()]


def test_the_norm_rule_by_hand():
    assert ed_norm(np.array([1.0, 2.0, 6.0, 10.0]), 0.5) == 2  # final 10: the first norm above 5
    assert ed_norm(np.array([1.0, 2.0, 6.0, 10.0]), 0.1) == 1  # above 1 (not equal)
    assert ed_norm(np.array([1.0, 2.0, 3.0, 10.0]), 0.5) is None  # never before layer L


def test_the_cli_runs_it_from_its_spec_alone(tiny_dir, tmp_path, capsys):
    out = tmp_path / "norm"
    argv = ["run", "--model", str(tiny_dir), "--task", "addition", "--n", "2", "--out", str(out), "--no-progress"]
    assert main([*argv, "--probes", "norm"]) == 0
    printed = capsys.readouterr().out
    assert "norm" in printed.splitlines()[0] and (out / "norm_by_example.parquet").is_file()
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "--norm-fraction" in capsys.readouterr().out
    base = RunSettings("m", "gsm8k")
    assert RunSettings("m", "gsm8k", norm_fraction=0.5).key() == base.key()  # at its default: old keys stay
    assert RunSettings("m", "gsm8k", norm_fraction=0.25).key() != base.key()
