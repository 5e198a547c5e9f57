"""The cache key and its compatibility table: results cached before the probe registry (a run
directory written by effdepth at 348fdc9, format 1, in tests/data/legacy-run) load unchanged — the
same key, no model work, the same EDs — and every committed run of the book keeps its key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from effdepth_core import results
from effdepth_core.settings import COMPATIBILITY, MapSettings, RunSettings

LEGACY = Path(__file__).parent / "data" / "legacy-run"
ROOT = Path(__file__).resolve().parents[1]


def _settings(metadata: dict) -> RunSettings:
    return RunSettings.recorded(metadata["settings"])  # head_dtype, absent from older records: float32


def test_a_run_cached_before_the_registry_loads_unchanged(tmp_path, monkeypatch):
    out = tmp_path / "legacy"
    shutil.copytree(LEGACY, out)
    metadata = json.loads((out / "metadata.json").read_text())
    settings = _settings(metadata)
    assert settings.key() == metadata["key"]  # the key of the version that wrote it

    def no_model(*args, **kwargs):
        raise AssertionError("a cached run must not load the model")

    monkeypatch.setattr(results, "load_model", no_model)
    result = results.run(settings, ["cosine", "logit_lens"], out)
    expected = json.loads((LEGACY / "effective_depth.json").read_text())
    # every number it held is unchanged; the continuous statistics (method.md §12) are added beside them
    kept = {k: ({f: v[f] for f in expected[k]} if isinstance(v, dict) else v) for k, v in result.summary.items()}
    assert {k: kept[k] for k in expected} == expected
    assert all(result.summary[rule]["statistic"] in ("crossing", "centroid") for rule in ("cosine", "logit_lens_kl"))
    assert json.loads((out / "metadata.json").read_text()) == metadata  # read, not rewritten


def test_every_committed_run_of_the_book_keeps_its_key():
    runs = sorted((ROOT / "book" / "results").rglob("metadata.json"))
    assert runs
    for path in runs:
        metadata = json.loads(path.read_text())
        if "small" in metadata["settings"]:  # the cross-model map's run directory
            assert MapSettings(**metadata["settings"]).key() == metadata["key"], path
            continue
        assert _settings(metadata).key() == metadata["key"], path


def test_the_compatibility_table_names_each_exception_once():
    names = [name for name, _ in COMPATIBILITY]
    assert len(names) == len(set(names)) and all(text for _, text in COMPATIBILITY)


def test_answer_results_of_the_earlier_arithmetic_split_are_flagged_and_renewed(tiny_dir, tmp_path):
    import pytest

    from effdepth_core.errors import EffdepthWarning

    settings = RunSettings(str(tiny_dir), "addition", n=1, digits=2, progress=False)
    out = tmp_path / "run"
    first = results.run(settings, ["erasure"], out)
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["probes"]["erasure"]["answer_format"] == 2
    del metadata["probes"]["erasure"]["answer_format"]  # as a run before the digits-only split wrote it
    (out / "metadata.json").write_text(json.dumps(metadata))
    with pytest.warns(EffdepthWarning, match="with the space before it as an answer token"):
        kept = results.run(settings, ["erasure"], out)
    assert kept.per_example["erasure"].equals(first.per_example["erasure"])  # kept, never recomputed unasked
    results.run(settings, ["erasure"], out, renew_outdated=True)
    assert json.loads((out / "metadata.json").read_text())["probes"]["erasure"]["answer_format"] == 2


def test_every_derived_name_fits_a_file_system_and_a_path_is_named_by_its_own_name(tmp_path):
    """A 240-byte task name and a 300-byte model path gave "File name too long"; a model given by
    its path was named after the whole path. Every derived name stays within NAME_BYTES (with a hash
    of the whole spec, so two long specs differ), and a folder is named by its own name."""
    from effdepth_core.settings import NAME_BYTES, RunSettings, default_out_dir, slug

    deep = tmp_path / ("d" * 120) / ("e" * 120) / "my-model"
    deep.mkdir(parents=True)
    assert slug(str(deep)) == "my-model"
    assert slug(str(tmp_path / "smollm2-135m" / "dequantized-float32")) == "smollm2-135m"
    long_task = tmp_path / (("t" * 240) + ".jsonl")
    long_task.write_text('{"prompt": "a"}\n')
    other_task = tmp_path / (("t" * 239) + "u.jsonl")
    other_task.write_text('{"prompt": "a"}\n')
    names = []
    for task in (long_task, other_task):
        out = default_out_dir(RunSettings("x" * 300, str(task), n=1), tmp_path / "runs")
        assert all(len(part.encode()) <= 255 for part in out.relative_to(tmp_path).parts)
        assert len(out.name.encode()) <= NAME_BYTES + 9
        out.mkdir(parents=True)  # the file system takes it
        names.append(out.name)
    assert names[0] != names[1]
    # the other names derived from a user's text: a map's file, a tuned lens of a model given in memory
    from conftest import make_tiny

    from effdepth_core.cache import atomic_write_bytes
    from effdepth_core.measurement.probes.tuned_lens import lens_training, tuned_lens_path
    from effdepth_core.settings import MapSettings

    mapped = MapSettings("x" * 300, "y" * 300, str(long_task)).name()
    assert len(mapped.encode()) <= 255 and (tmp_path / mapped).mkdir() is None
    tiny = make_tiny("llama")
    for name in ("n" * 300, "n" * 299 + "m"):
        tiny.name = name
        lens = tuned_lens_path(name, tiny, lens_training(RunSettings(name, "gsm8k")))
        assert len(lens.name.encode()) <= 255 and lens.name not in names
        names.append(lens.name)
        lens.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(lens, b"lens")  # as a lens is saved: through a temporary of a longer name
        atomic_write_bytes(lens.with_name(lens.name + ".json"), b"{}")  # and its record beside it
        assert lens.read_bytes() == b"lens" and not [p for p in lens.parent.iterdir() if "effdepth-tmp" in p.name]
