"""A run of a local model is keyed by the bytes it loaded: a folder whose weights are replaced while
the model loads is refused in one line, not measured under the key of the files it did not load."""

from __future__ import annotations

import shutil

import pytest
from conftest import make_tiny, random_prompts, save_tiny_dir

from effdepth_core import results
from effdepth_core.errors import EffdepthError
from effdepth_core.results import RunSettings, run


def test_weights_replaced_during_the_load_are_refused(tmp_path, tiny_dir, monkeypatch):
    folder = tmp_path / "model"
    shutil.copytree(tiny_dir, folder)
    other = tmp_path / "other"
    save_tiny_dir(other, poison=True)  # other bytes (a NaN in layer 1)
    original = results.load_model

    def swapped_while_loading(*args, **kwargs):
        loaded = original(*args, **kwargs)  # the old weights are in memory now
        shutil.copy(other / "model.safetensors", folder / "model.safetensors")  # replaced on disk meanwhile
        return loaded

    settings = RunSettings(str(folder), "addition", n=1, digits=2, progress=False)
    run(settings, "cosine", tmp_path / "first")  # unchanged files: the run goes ahead
    monkeypatch.setattr(results, "load_model", swapped_while_loading)
    with pytest.raises(EffdepthError, match="changed while effdepth loaded it") as refused:
        run(settings.replace(seed=1), "cosine", tmp_path / "second")
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "second" / "cosine.parquet").exists()


def test_a_lens_trained_on_fewer_tokens_than_asked_says_so():
    """A run records what it did where that differs from what was asked, and says so: a tuned lens
    asked for more tokens than its corpus holds is trained on those it holds (its record's
    ``train_tokens``) with a warning naming both."""
    from effdepth_core.errors import EffdepthWarning
    from effdepth_core.measurement.probes import LensTraining, train_tuned_lens

    tiny = make_tiny("llama")
    texts = random_prompts([20] * 6, seed=7)  # 120 tokens in all
    training = LensTraining(train_tokens=10_000, heldout_tokens=20, steps=1, batch_tokens=4)
    with pytest.warns(EffdepthWarning, match="fewer than the 10000 asked"):
        lens, _ = train_tuned_lens(tiny, texts, training)
    assert lens.info["train_tokens"] < 10_000 and lens.info["training"]["train_tokens"] == 10_000
