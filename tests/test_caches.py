"""Every cache effdepth reads is verified against what it recorded when writing it: dequantized
weights, tuned lenses, and the files of a local model (whose fingerprint is part of a run's key)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import char_tokenizer, make_tiny, random_prompts, save_tiny_dir

from effdepth_core import acquire, zoo
from effdepth_core.acquire import save_dequantized
from effdepth_core.cli import main
from effdepth_core.errors import EffdepthError
from effdepth_core.measurement.probes.tuned_lens import LensTraining, cached_tuned_lens, record_path, tuned_lens_path

SHA = "ab" * 32


def _flip_a_bit(path, offset: int = 4096) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x80  # a sign bit of some weight: same size, still a valid file
    path.write_bytes(bytes(data))


def test_dequantized_weights_are_verified_file_by_file(tmp_path):
    tiny = make_tiny("qwen2")
    folder = tmp_path / "dequantized-float32"
    save_dequantized(tiny.model, char_tokenizer(), folder, torch.float32, SHA)
    assert acquire.dequantized_state(folder, "torch.float32", SHA) == "ready"
    marker = json.loads((folder / acquire.DEQUANTIZED_MARKER).read_text())
    assert "model.safetensors" in marker["files"] and len(marker["files"]["model.safetensors"]["sha256"]) == 64
    _flip_a_bit(folder / "model.safetensors")
    assert acquire.dequantized_state(folder, "torch.float32", SHA) == "damaged"  # before: "sha256 verified", exit 0
    save_dequantized(tiny.model, char_tokenizer(), folder, torch.float32, SHA)  # rebuilt: effdepth's own folder
    assert acquire.dequantized_state(folder, "torch.float32", SHA) == "ready"
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated: was a SafetensorError on every run
    assert acquire.dequantized_state(folder, "torch.float32", SHA) == "damaged"
    (folder / acquire.DEQUANTIZED_MARKER).unlink()
    assert acquire.dequantized_state(folder, "torch.float32", SHA) == "foreign"  # cannot tell it is effdepth's
    save_dequantized(tiny.model, char_tokenizer(), folder, torch.float32, SHA)
    assert acquire.dequantized_state(folder, "torch.float32", SHA) == "foreign"  # and so never touched
    assert not [p for p in tmp_path.iterdir() if "effdepth-" in p.name]


@pytest.mark.real_model
@pytest.mark.slow
def test_a_damaged_dequantized_cache_is_rebuilt_and_a_markerless_one_refused(smollm2, tmp_path, monkeypatch, capsys):
    """On the default model, in a cache of its own (the GGUF copied): flipped bits in the cached
    weights make the next load rebuild them from the verified GGUF, with a warning, to the same
    weights; a folder without effdepth's marker is refused in one line that says how to repair."""
    from effdepth_core.errors import EffdepthWarning
    from effdepth_core.models import load_model

    gguf = zoo.model_path("smollm2-135m")
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path / "cache"))
    target = zoo.model_path("smollm2-135m")
    target.parent.mkdir(parents=True)
    shutil.copy2(gguf, target)
    first = load_model("smollm2-135m", device="cpu", dtype="float32", progress=False)  # parses, writes the cache
    folder = target.parent / "dequantized-float32"
    assert acquire.dequantized_state(folder, "torch.float32", zoo.ZOO["smollm2-135m"].sha256) == "ready"
    _flip_a_bit(folder / "model.safetensors", offset=1 << 20)
    assert main(["models"]) == 0
    assert "float32 (DAMAGED" in capsys.readouterr().out
    with pytest.warns(EffdepthWarning, match="rebuilding them from the verified GGUF"):
        again = load_model("smollm2-135m", device="cpu", dtype="float32", progress=False)
    for name, value in first.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[name]), name
    assert acquire.dequantized_state(folder, "torch.float32", zoo.ZOO["smollm2-135m"].sha256) == "ready"
    (folder / acquire.DEQUANTIZED_MARKER).unlink()
    capsys.readouterr()
    code = main(["run", "--model", "smollm2-135m", "--task", "addition", "--n", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "holds no effdepth marker" in err and "delete that folder" in err
    assert (folder / "model.safetensors").is_file()  # not effdepth's any more as far as it can tell: untouched
    assert main(["models", "--refetch", "smollm2-135m", "--no-progress"]) == 0  # offline: pip's cache or the index
    assert "carries no effdepth marker; left as it is" in capsys.readouterr().err
    assert (folder / "model.safetensors").is_file()  # refetch deletes only what effdepth can prove it wrote


def _lens(tmp_path, monkeypatch):
    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path))
    monkeypatch.setattr("effdepth_core.tasks.lens_corpus", lambda: random_prompts([15] * 20, seed=9))
    tiny = make_tiny("llama")
    training = LensTraining(train_tokens=150, heldout_tokens=60, steps=2, batch_tokens=16)
    cached_tuned_lens("tiny", tiny, training)
    return tiny, training, tuned_lens_path("tiny", tiny, training)


def test_a_changed_tuned_lens_is_refused(tmp_path, monkeypatch):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    tiny, training, path = _lens(tmp_path, monkeypatch)
    cached_tuned_lens("tiny", tiny, training)  # read back: verified
    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    save_file({k: -v for k, v in tensors.items()}, str(path), metadata=metadata)  # finite, valid, negated
    with pytest.raises(EffdepthError, match=r"is damaged; delete it to train it again.*sha256 differs"):
        cached_tuned_lens("tiny", tiny, training)
    record_path(path).unlink()
    with pytest.raises(EffdepthError, match="no effdepth record"):
        cached_tuned_lens("tiny", tiny, training)


def test_a_local_model_changed_in_place_is_another_model(tmp_path, capsys):
    model = save_tiny_dir(tmp_path / "model")
    out = tmp_path / "out"
    argv = ["run", "--model", str(model), "--task", "addition", "--n", "1", "--out", str(out), "--no-progress"]
    argv += ["--probes", "cosine"]
    assert main(argv) == 0
    before = json.loads((out / "effective_depth.json").read_text())
    cosine_before = (out / "cosine.parquet").read_bytes()
    other = make_tiny("llama", seed=7)
    other.model.save_pretrained(model)  # new weights, same folder, same file names
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "other parameters (model_files:" in err  # not the old numbers with exit 0
    assert (out / "cosine.parquet").read_bytes() == cosine_before
    assert main([*argv, "--overwrite"]) == 0
    assert (out / "cosine.parquet").read_bytes() != cosine_before  # recomputed on the new weights
    assert json.loads((out / "effective_depth.json").read_text())["model"] == before["model"]


def test_a_run_is_keyed_by_the_weights_and_the_prompts_it_measured(tmp_path, monkeypatch):
    """Two models wrapped under one name, and one's own prompts run under a task's name, never share
    a run directory or rows: each run's numbers equal the probe computed directly on its model."""
    from effdepth_core.measurement.probes import residual_cosine
    from effdepth_core.models import wrap_model
    from effdepth_core.results import run
    from effdepth_core.settings import RunSettings
    from effdepth_core.task_loading import load_task
    from effdepth_core.tasks import Example

    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))  # where run() keeps results by default
    a = wrap_model(make_tiny("llama", seed=1).model, char_tokenizer(), name="tiny")
    b = wrap_model(make_tiny("llama", seed=2).model, char_tokenizer(), name="tiny")
    settings = RunSettings("tiny", "addition", n=2, digits=3, progress=False)
    first, second = run(settings, ["cosine"], loaded=a), run(settings, ["cosine"], loaded=b)
    assert first.out_dir != second.out_dir
    prompts = [e.prompt for e in load_task("addition", n=2, digits=3)]
    assert second.per_example["cosine"].equals(residual_cosine(b, prompts))  # B's numbers, not A's
    mine = [Example("Hello world"), Example("Hello there")]
    own = run(settings, ["cosine"], loaded=a, examples=mine)
    assert own.out_dir not in (first.out_dir, second.out_dir)
    assert own.per_example["cosine"].equals(residual_cosine(a, [e.prompt for e in mine]))
    again = run(settings, ["cosine"], loaded=a)  # the task's run is still the task's
    assert again.out_dir == first.out_dir and again.per_example["cosine"].equals(first.per_example["cosine"])


def test_a_run_is_keyed_by_everything_that_decides_its_numbers(tmp_path):
    """Two in-memory models with the same weights and name but another norm epsilon, or another
    tokenizer, are other models: each run is computed afresh and equals the probe called directly
    (never the first model's cached curves); a model with a user's hook is refused in one line."""
    import copy

    from conftest import char_tokenizer, make_tiny

    from effdepth_core.errors import EffdepthError
    from effdepth_core.measurement.probes import residual_cosine
    from effdepth_core.models import wrap_model
    from effdepth_core.results import RunSettings, run

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "what is 1 + 2? it is 3."}\n{"prompt": "abc def ghi"}\n')
    settings = RunSettings("tiny", str(prompts), n=2, progress=False)
    base = make_tiny("llama")
    first = wrap_model(base.model, char_tokenizer(), name="tiny")
    other = copy.deepcopy(base.model)
    other.config.rms_norm_eps = 0.5  # same weights, same name: another computation
    second = wrap_model(other, char_tokenizer(), name="tiny")
    roots = {"results_root": tmp_path / "runs"}
    a = run(settings, ["cosine"], loaded=first, **roots)
    b = run(settings, ["cosine"], loaded=second, **roots)
    texts = [line.split('"')[3] for line in prompts.read_text().splitlines()]
    for result, loaded in ((a, first), (b, second)):
        direct = residual_cosine(loaded, texts, progress=False)
        assert result.per_example["cosine"].sort("example", "layer", "metric")["value"].to_list() == pytest.approx(
            direct.sort("example", "layer", "metric")["value"].to_list(), rel=1e-6, abs=1e-6
        )  # float32 forwards of the same batches: the same numbers up to summation order
    assert a.out_dir != b.out_dir
    spaced = char_tokenizer()
    spaced.add_tokens(["what"])  # another tokenizer: other token ids, other numbers
    c = run(settings, ["cosine"], loaded=wrap_model(base.model, spaced, name="tiny"), **roots)
    assert c.out_dir not in (a.out_dir, b.out_dir)
    handle = base.model.model.layers[1].register_forward_hook(lambda module, args, output: None)
    try:
        with pytest.raises(EffdepthError, match=r"hook on model.layers.1 \(forward hook\)"):
            run(settings, ["cosine"], loaded=wrap_model(base.model, char_tokenizer(), name="tiny"), **roots)
    finally:
        handle.remove()


def test_a_tuned_lens_is_stored_under_the_models_identity_not_its_name(tmp_path, monkeypatch):
    """Two in-memory models under one name with other weights get two lens files (the second is
    never decoded with the first one's lens); the same model twice gets the same one."""
    from conftest import char_tokenizer, make_tiny

    from effdepth_core.measurement.probes.tuned_lens import LensTraining, tuned_lens_path
    from effdepth_core.models import wrap_model

    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))
    training = LensTraining()
    one = wrap_model(make_tiny("llama", seed=0).model, char_tokenizer(), name="mine")
    two = wrap_model(make_tiny("llama", seed=1).model, char_tokenizer(), name="mine")
    again = wrap_model(one.model, char_tokenizer(), name="mine")
    assert tuned_lens_path("mine", one, training, "c") != tuned_lens_path("mine", two, training, "c")
    assert tuned_lens_path("mine", one, training, "c") == tuned_lens_path("mine", again, training, "c")


def test_a_loaded_model_edited_behind_autograds_back_is_another_model(tiny_dir):
    """``.data.mul_`` and a numpy write bypass a tensor's version counter: a model from load_model
    edited so was still keyed by its name and served the unedited numbers (a hostile pass); its
    state now samples the values too, buffers included."""
    from effdepth_core.models import load_model

    loaded = load_model(str(tiny_dir), dtype="float32", progress=False)
    assert loaded.is_as_loaded(str(tiny_dir), loaded.dtype)
    weight = loaded.model.model.layers[1].mlp.down_proj.weight
    weight.data.mul_(3)
    assert not loaded.is_as_loaded(str(tiny_dir), loaded.dtype)
    again = load_model(str(tiny_dir), dtype="float32", progress=False)
    buffer = next(b for name, b in again.model.named_buffers() if "inv_freq" in name)
    buffer.numpy()[:] *= 2  # a numpy write into a buffer
    assert not again.is_as_loaded(str(tiny_dir), again.dtype)


def test_hooks_beyond_the_module_lists_are_refused_too():
    """A global backward pre hook, and a module whose forward was replaced on the instance (what
    accelerate's add_hook_to_module or a monkeypatch does) change numbers no key can name: refused.
    accelerate's own device placement (device_map) is not a computation and passes."""
    import torch
    from conftest import make_tiny

    from effdepth_core.models import user_hooks

    model = make_tiny("llama").model
    handle = torch.nn.modules.module.register_module_full_backward_pre_hook(lambda module, grad: grad)
    try:
        assert user_hooks(model) == "every module (a global backward pre hook)"
    finally:
        handle.remove()
    mlp = model.model.layers[1].mlp
    original = mlp.forward
    mlp.forward = lambda x: original(x) * 2
    try:
        assert user_hooks(model) == "model.layers.1.mlp (its forward replaced)"
    finally:
        del mlp.forward
    assert user_hooks(model) is None


def test_a_hook_is_the_users_whatever_module_it_claims(tiny_dir):
    """A hook is library machinery only when its code lives in transformers' or accelerate's files:
    a user's function that sets ``__module__ = "transformers..."`` (or a partial of one, or a
    callable object) is still named and refused."""
    import functools

    from conftest import make_tiny

    from effdepth_core.models import user_hooks

    model = make_tiny("llama").model

    def double(module, args, output):
        return output * 2

    double.__module__ = "transformers.utils.generic"

    class Doubler:
        __module__ = "accelerate.hooks"

        def __call__(self, module, args, output):
            return output * 2

    for hook in (double, functools.partial(double), Doubler()):
        handle = model.model.layers[0].mlp.register_forward_hook(hook)
        try:
            assert user_hooks(model) == "model.layers.0.mlp (forward hook)", hook
        finally:
            handle.remove()
    assert user_hooks(model) is None


def test_a_module_setting_edited_in_place_is_another_model(tiny_dir):
    """A norm's epsilon set on the module (the config untouched) or a module swapped for another
    class changes the numbers: the model is then keyed by its fingerprint (never by the name it was
    loaded under), and the fingerprint moves with it."""
    from effdepth_core.models import load_model, model_fingerprint

    loaded = load_model(str(tiny_dir), dtype="float32", progress=False)
    assert loaded.is_as_loaded(str(tiny_dir), loaded.dtype)
    before = model_fingerprint(loaded)
    loaded.model.model.norm.variance_epsilon = 0.5
    assert not loaded.is_as_loaded(str(tiny_dir), loaded.dtype)
    edited = model_fingerprint(loaded)
    assert edited != before
    loaded.model.model.norm.variance_epsilon = loaded.model.config.rms_norm_eps
    assert model_fingerprint(loaded) == before  # back as it was: the same key again
    loaded.model.model.layers[0].mlp.act_fn = torch.nn.Tanh()  # another activation module
    assert model_fingerprint(loaded) not in (before, edited)


def test_a_lock_left_with_its_temporary_name_by_a_killed_creator_is_taken_over(tmp_path):
    """``DirectoryLock._create`` links its temporary to the lock's name, then unlinks it: a process
    killed in between leaves the lock with two names. The next run takes it over (the temporary
    name, effdepth's own and the same file, is removed); a lock with any other second name is still
    refused, and that name is left alone."""
    import os

    from effdepth_core.cache import LOCK_NAME, CacheLockError, DirectoryLock, _lock_text, temporary_path

    folder = tmp_path / "run"
    folder.mkdir()
    leftover = temporary_path(folder / LOCK_NAME)
    leftover.write_text(_lock_text().replace(f"pid {os.getpid()}", "pid 999999"))
    os.link(leftover, folder / LOCK_NAME)  # killed here: both names stand
    lock = DirectoryLock(folder)
    lock.acquire()
    assert lock.held and not leftover.exists() and os.stat(folder / LOCK_NAME).st_nlink == 1
    lock.release()
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "mine.txt").write_text(_lock_text())
    os.link(other / "mine.txt", other / LOCK_NAME)
    with pytest.raises(CacheLockError, match="a file with other names"):
        DirectoryLock(other).acquire()
    assert (other / "mine.txt").exists()
