"""A run with more examples reuses the rows an earlier run measured for its first examples (same
probe key), computes only the rest, and gives what a fresh run gives."""

from __future__ import annotations

import hashlib
import json

import polars as pl
import pytest

from effdepth_core.results import RunSettings, run

# float32 forward passes of the same prompt in batches of other shapes (other padding, other
# partners) round differently: ~1e-6 of values of order 1 (cosines, relative norms, KL, overlap)
TOLERANCE = 1e-5


def _max_diff(a: pl.DataFrame, b: pl.DataFrame) -> float:
    keys = [c for c in a.columns if c not in ("value", "mean", "std")]
    joined = a.join(b, on=keys, how="full", suffix="_b", nulls_equal=True)
    assert joined.height == a.height == b.height
    return float((joined["value"] - joined["value_b"]).abs().max())


def _assert_summaries_match(a: object, b: object, where: str = "summary") -> None:
    """Two summaries agree: every integer ED, interval bound, count and name exactly; every float
    (a ratio, a continuous depth statistic and its interval, in layers or a fraction of L) within
    1e-6 of its scale. The per-example values come from other batch shapes (TOLERANCE), and a mean
    of them over prompts moves ~1e-8 of a depth of order 1–30: bit-identity is not promised here."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, int | float) and isinstance(b, int | float), where
        assert abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b)), (where, a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), where
        for key in a:
            _assert_summaries_match(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_summaries_match(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def _task_file(tmp_path, n: int = 6):
    path = tmp_path / "prompts.jsonl"
    lines = [{"prompt": f"q{i}: what is {i} + {2 * i}? it is", "answer": f" {3 * i}."} for i in range(n)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


@pytest.mark.parametrize("task, probes", [("file", "cosine,logit_lens"), ("addition", "skip,igrad,early_exit")])
def test_a_larger_run_reuses_the_first_examples_and_equals_a_fresh_one(tiny_dir, tmp_path, task, probes):
    options = dict(n=3, progress=False, skip_positions=1, skip_parts="layer", igrad_steps=8)
    if task == "addition":
        options.update(igrad_quadrature="gauss", digits=3)
    else:
        task = _task_file(tmp_path)
    small = RunSettings(str(tiny_dir), task, **options)
    run(small, probes, tmp_path / "runs" / "small")
    larger = small.replace(n=5)
    extended = run(larger, probes, tmp_path / "runs" / "larger", reuse_from=[tmp_path / "runs"])  # named: reused
    fresh = run(larger, probes, tmp_path / "alone" / "larger")  # nothing beside it
    metadata = json.loads((tmp_path / "runs" / "larger" / "metadata.json").read_text())
    for name in probes.split(","):
        record = metadata["probes"][name]
        assert record["reused"] == {"from": str(tmp_path / "runs" / "small"), "examples": 3}, name
        assert "reused" not in fresh.metadata["probes"][name]
        assert extended.per_example[name]["example"].n_unique() == 5
        assert _max_diff(extended.per_example[name], fresh.per_example[name]) <= TOLERANCE, name
        assert _max_diff(extended.curves[name], fresh.curves[name]) <= TOLERANCE, name
    _assert_summaries_match(extended.summary, fresh.summary)
    beside = run(small.replace(n=4), probes, tmp_path / "runs" / "beside")  # neighbours lend only when named
    assert all("reused" not in record for record in beside.metadata["probes"].values())
    one = run(small.replace(n=4), probes, tmp_path / "one", reuse_from=[tmp_path / "runs" / "small"])  # a run named
    assert all(record["reused"]["examples"] == 3 for record in one.metadata["probes"].values())


def test_only_the_missing_examples_are_computed_and_a_changed_option_reuses_nothing(tiny_dir, tmp_path, monkeypatch):
    import dataclasses

    from effdepth_core.measurement import registry

    seen: list[int] = []
    spec = registry.get("cosine")

    def counting(loaded, examples, context):
        seen.append(len(examples))
        return spec.compute(loaded, examples, context)

    monkeypatch.setitem(registry._all(), "cosine", dataclasses.replace(spec, compute=counting))
    base = RunSettings(str(tiny_dir), _task_file(tmp_path), n=2, progress=False)
    lend = [tmp_path]  # the folder of these runs, named as --reuse-from names it
    run(base, "cosine", tmp_path / "a")
    run(base.replace(n=4), "cosine", tmp_path / "b", reuse_from=lend)
    assert seen == [2, 2]  # the second run computed only examples 2 and 3
    run(base.replace(n=4, batch_size=1, top_k=3), "cosine", tmp_path / "c", reuse_from=lend)  # not cosine's options
    assert seen[-1] == 2
    other = RunSettings(str(tiny_dir), "addition", n=4, digits=2, progress=False)
    run(other, "cosine", tmp_path / "e")
    run(other.replace(n=5, seed=1), "cosine", tmp_path / "f", reuse_from=lend)  # other examples: nothing to reuse
    assert seen[-1] == 5
    for run_dir in ("b", "c"):  # damaged donors are not used
        damaged = tmp_path / run_dir / "cosine_by_example.parquet"
        damaged.write_bytes(damaged.read_bytes()[:-8])
    run(base.replace(n=5), "cosine", tmp_path / "d", reuse_from=lend)
    assert seen[-1] == 3  # from the intact 2-example run, not the damaged 4-example ones


def test_the_precision_walk_reuses_its_own_smaller_steps(tiny_dir, tmp_path):
    """No folder lends unasked, but effdepth's own walk names its results folder: the step of n = 4
    computes only the prompts the step of n = 2 did not."""
    from effdepth_book.precision import Precision, precise_run

    settings = RunSettings(str(tiny_dir), _task_file(tmp_path), progress=False)
    rule = Precision(halfwidth=1e-9, n_min=2, n_max=4, step=2)  # never precise enough: both steps run
    walk = precise_run(settings, ["cosine"], rule, tmp_path / "results")
    assert walk.steps == [2, 4]
    record = walk.result.metadata["probes"]["cosine"]
    assert record["reused"]["examples"] == 2 and record["reused"]["from"].endswith("-n2-seed0")


def test_a_task_file_rewritten_between_its_reads_is_refused(tiny_dir, tmp_path, monkeypatch):
    """The key is of the bytes measured: a file rewritten between the read that keys the run and
    the one that gives its examples is refused in one line, and nothing is written."""
    from effdepth_core.errors import TaskError

    task = tmp_path / "t.jsonl"
    task.write_text('{"prompt": "the cat sat on the mat"}\n')
    settings = RunSettings(str(tiny_dir), str(task), n=1, progress=False)
    real = RunSettings.base_fields

    def rewritten_first(self, by_name=True):  # the user saves the file between effdepth's two reads
        task.write_text('{"prompt": "the dog sat on the mat"}\n')
        return real(self, by_name)

    monkeypatch.setattr(RunSettings, "base_fields", rewritten_first)
    with pytest.raises(TaskError, match="changed while effdepth read it"):
        run(settings, "cosine", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(RunSettings, "base_fields", real)
    done = run(settings, "cosine", tmp_path / "out")  # the file as it now is: measured, keyed by it
    (line,) = (tmp_path / "out" / "examples.jsonl").read_text().splitlines()
    assert "dog" in json.loads(line)["prompt"] and done.metadata["key_fields"]["task_sha256"] == (
        hashlib.sha256(task.read_bytes()).hexdigest()
    )
