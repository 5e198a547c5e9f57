"""A run computes the probes that name a ``pass_part`` (the residual cosine, the logit lens, the
residual norm) in one forward pass per batch when it computes them on the same examples, and saves
what each run alone saves: the same frames, bit for bit, each under its own key."""

from __future__ import annotations

import json

from effdepth_core.measurement.probes.shared import activations
from effdepth_core.results import RunSettings, run


def _task_file(tmp_path, n: int = 5):
    path = tmp_path / "prompts.jsonl"
    lines = [
        {"prompt": f"q{i}: what is {i} + {2 * i}? it is" + " and" * (3 * i), "answer": f" {3 * i}."} for i in range(n)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def _counting_passes(monkeypatch) -> list[int]:
    passes: list[int] = []
    real = activations.forward
    monkeypatch.setattr(activations, "forward", lambda *a, **k: passes.append(1) or real(*a, **k))
    return passes


def test_a_run_shares_one_pass_and_saves_what_runs_alone_save(tiny_dir, tmp_path, monkeypatch):
    settings = RunSettings(str(tiny_dir), _task_file(tmp_path), n=5, batch_size=2, progress=False)
    apart = {name: run(settings, name, tmp_path / name) for name in ("cosine", "logit_lens", "norm")}
    passes = _counting_passes(monkeypatch)
    together = run(settings, "cosine,logit_lens,norm", tmp_path / "together")
    assert len(passes) == 3  # 5 prompts in batches of 2: one pass per batch for the three probes
    for name, alone in apart.items():
        record, alone_record = together.metadata["probes"][name], alone.metadata["probes"][name]
        assert record["shared_pass"] is True and "shared_pass" not in alone_record
        assert record["key"] == alone_record["key"]  # the same result, found under the same key
        assert together.per_example[name].equals(alone.per_example[name]), name
        assert together.curves[name].equals(alone.curves[name]), name
    assert together.depth == {rule: depth for alone in apart.values() for rule, depth in alone.depth.items()}


def test_probes_that_compute_other_examples_do_not_share(tiny_dir, tmp_path, monkeypatch):
    """The cosine of the first 3 examples is lent by an earlier run: it computes examples 3-4, the lens
    all 5; they run apart (one pass each per batch), and equal a fresh run."""
    settings = RunSettings(str(tiny_dir), _task_file(tmp_path), n=3, batch_size=2, progress=False)
    run(settings, "cosine", tmp_path / "runs" / "small")
    larger = settings.replace(n=5)
    passes = _counting_passes(monkeypatch)
    extended = run(larger, "cosine,logit_lens", tmp_path / "runs" / "larger", reuse_from=[tmp_path / "runs"])
    assert len(passes) == 1 + 3  # the cosine's 2 new prompts: one batch; the lens's 5: three
    assert "shared_pass" not in extended.metadata["probes"]["cosine"]
    assert extended.metadata["probes"]["cosine"]["reused"]["examples"] == 3
    fresh = run(larger, "cosine,logit_lens", tmp_path / "fresh")
    assert fresh.metadata["probes"]["cosine"]["shared_pass"] is True
    assert fresh.per_example["logit_lens"].equals(extended.per_example["logit_lens"])
    # the cosine's reused rows come from batches of other partners: float32 rounding (~1e-7 of values of order 1)
    diff = (fresh.per_example["cosine"]["value"] - extended.per_example["cosine"]["value"]).abs().max()
    assert diff <= 1e-5


def test_an_interrupted_shared_pass_saves_nothing_and_a_rerun_computes_both(tiny_dir, tmp_path, monkeypatch):
    """Ctrl-C during the shared pass: neither probe is saved half-done; the rerun computes both in
    one pass and saves what an uninterrupted run saves."""
    import pytest

    settings = RunSettings(str(tiny_dir), _task_file(tmp_path), n=5, batch_size=2, progress=False)
    real = activations.forward
    seen: list[int] = []

    def interrupted(*a, **k):
        seen.append(1)
        if len(seen) == 2:
            raise KeyboardInterrupt  # during the second batch
        return real(*a, **k)

    monkeypatch.setattr(activations, "forward", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(settings, "cosine,logit_lens", tmp_path / "out")
    assert not (tmp_path / "out" / "cosine.parquet").exists() and not (tmp_path / "out" / "logit_lens.parquet").exists()
    passes = _counting_passes(monkeypatch)
    resumed = run(settings, "cosine,logit_lens", tmp_path / "out")
    assert len(passes) == 3 and resumed.computed == ("cosine", "logit_lens")
    whole = run(settings, "cosine,logit_lens", tmp_path / "whole")
    for name in ("cosine", "logit_lens"):
        assert resumed.per_example[name].equals(whole.per_example[name])


def test_parts_whose_batches_or_kernel_differ_run_apart_and_each_equals_itself_alone():
    """A lens whose token budget splits the batches (a large vocabulary's ``max_tokens``) or a part
    that reads attention weights (eager kernel) does not share the others' pass: every frame stays
    its part's alone, bit for bit, and the passes say who shared."""
    import dataclasses

    from conftest import make_tiny, random_prompts

    from effdepth_core.measurement.probes.cosine import residual_cosine_part
    from effdepth_core.measurement.probes.norm import residual_norm_part
    from effdepth_core.measurement.probes.shared.lens import logit_lens_part

    loaded = make_tiny("llama")
    prompts = random_prompts([7, 12, 3, 10])
    cosine, norm = residual_cosine_part(loaded), residual_norm_part(loaded)
    split_lens = dataclasses.replace(logit_lens_part(loaded), max_tokens=16)  # batches of 7 | 12+3 | 10 tokens
    eager_norm = dataclasses.replace(norm, attention=True)
    parts = [cosine, split_lens, norm, eager_norm]
    frames, passes = activations.shared_passes(loaded, prompts, parts, batch_size=3)
    assert passes == [[0, 2], [1], [3]]
    for part, frame in zip(parts, frames, strict=True):
        assert frame.equals(activations.shared_pass_means(loaded, prompts, [part], batch_size=3)[0])


def test_a_probe_whose_identity_is_slow_is_prepared_after_the_probes_before_it_are_saved(
    tiny_dir, tmp_path, monkeypatch
):
    """A probe's identity may train a tuned lens: it is found at the probe's turn, so a Ctrl-C there
    keeps the cosine computed before it."""
    import dataclasses

    import pytest

    from effdepth_core.measurement import registry

    def identity(loaded, context):
        raise KeyboardInterrupt  # while the tuned lens would train

    monkeypatch.setitem(
        registry._all(), "tuned_lens", dataclasses.replace(registry.get("tuned_lens"), identity=identity)
    )
    settings = RunSettings(str(tiny_dir), _task_file(tmp_path), n=2, progress=False, lens="tuned")
    with pytest.raises(KeyboardInterrupt):
        run(settings, "cosine,tuned_lens", tmp_path / "out")
    assert (tmp_path / "out" / "cosine.parquet").is_file()
