"""A cached run of a model in memory is returned only when the model computes now what it computed
then: its first prompt's final residual and logits (the canary, ``results.canary``) are recomputed
and compared bit for bit with those its run directory recorded. Each case below changed the
computation in a way no cheap fingerprint saw (a weight byte outside the sampled positions, a class
patch of a forward, an attention-registry entry), and each once returned the first call's numbers."""

from __future__ import annotations

import pytest
import torch

from effdepth_core import measure
from effdepth_core.errors import EffdepthError
from effdepth_core.measurement.probes import residual_cosine
from effdepth_core.models import load_model

PROMPTS = ["the capital of france is", "two plus two is four"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _edit_one_weight(loaded) -> None:
    """One element of one tensor, through ``.data`` (the last element: past any sampled positions)."""
    weight = loaded.layers[0].mlp.down_proj.weight
    weight.data.view(-1)[-1] += 0.5


def _patch_mlp_class(loaded, monkeypatch) -> None:
    cls = type(loaded.layers[0].mlp)
    original = cls.forward
    monkeypatch.setattr(cls, "forward", lambda self, x: 2.0 * original(self, x))


def _swap_sdpa(loaded, monkeypatch) -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = loaded.model.config._attn_implementation
    original = ALL_ATTENTION_FUNCTIONS[name]

    def ignoring_the_mask(module, query, key, value, attention_mask, **kwargs):
        return original(module, query, key, value, None, **{**kwargs, "is_causal": False})

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, name, ignoring_the_mask)


@pytest.mark.parametrize("change", ["weight byte", "class patch", "attention registry"])
def test_a_cached_run_is_returned_only_for_the_model_as_it_computes_now(cache, tiny_dir, monkeypatch, change):
    loaded = load_model(str(tiny_dir), device="cpu", dtype="float32", progress=False)
    first = measure(loaded, PROMPTS, probes="cosine", progress=False, cache=True)
    assert measure(loaded, PROMPTS, probes="cosine", progress=False, cache=True).out_dir == first.out_dir  # a hit
    {"weight byte": lambda: _edit_one_weight(loaded), "class patch": lambda: _patch_mlp_class(loaded, monkeypatch),
     "attention registry": lambda: _swap_sdpa(loaded, monkeypatch)}[change]()  # fmt: skip
    truth = residual_cosine(loaded, PROMPTS)  # the model as it is now, computed directly
    assert not truth.equals(first.per_example["cosine"]), "the change must change the numbers"
    again = measure(loaded, PROMPTS, probes="cosine", progress=False, cache=True)
    assert again.out_dir != first.out_dir  # keyed by what it computes now
    assert again.per_example["cosine"].equals(truth)
    again_hit = measure(loaded, PROMPTS, probes="cosine", progress=False, cache=True)  # and that is cached too
    assert again_hit.out_dir == again.out_dir and again_hit.per_example["cosine"].equals(truth)


def test_a_changed_model_in_a_named_folder_is_refused_in_one_line(cache, tiny_dir):
    loaded = load_model(str(tiny_dir), device="cpu", dtype="float32", progress=False)
    measure(loaded, PROMPTS, probes="cosine", progress=False, out=cache / "mine")
    _edit_one_weight(loaded)
    with pytest.raises(EffdepthError, match="computes otherwise than the one whose results are kept") as refused:
        measure(loaded, PROMPTS, probes="cosine", progress=False, out=cache / "mine")
    assert "\n" not in str(refused.value)


def test_the_canary_sees_every_byte_and_nothing_else(tiny_dir):
    from effdepth_core.results import canary
    from effdepth_core.tasks import Example

    loaded = load_model(str(tiny_dir), device="cpu", dtype="float32", progress=False)
    examples = [Example(PROMPTS[0], "")]
    before = canary(loaded, examples)
    assert canary(loaded, examples) == before  # deterministic at one batch shape
    with torch.no_grad():
        loaded.layers[-1].mlp.down_proj.weight.data.view(-1)[-1] += 1e-3
    assert canary(loaded, examples) != before


def test_a_changed_model_borrows_no_rows_from_its_earlier_runs(cache, tiny_dir, monkeypatch):
    """A larger run borrows the first examples' rows of an earlier one with the same probe key: a
    model in memory only from a run whose model computed the same canary."""
    from effdepth_core.task_loading import load_task

    loaded = load_model(str(tiny_dir), device="cpu", dtype="float32", progress=False)
    options = dict(probes="cosine", progress=False, cache=True, digits=2)
    measure(loaded, "addition", n=2, **options)
    lent = measure(loaded, "addition", n=3, **options)
    assert lent.metadata["probes"]["cosine"]["reused"]["examples"] == 2  # unchanged: rows are borrowed
    _patch_mlp_class(loaded, monkeypatch)
    changed = measure(loaded, "addition", n=4, **options)
    assert "reused" not in changed.metadata["probes"]["cosine"]
    prompts = [e.prompt for e in load_task("addition", n=4, digits=2)]
    assert changed.per_example["cosine"].equals(residual_cosine(loaded, prompts))


def test_a_run_without_a_comparable_canary_is_read_as_before(cache, tiny_dir):
    """Runs written before the canary (the book's committed results), or on another machine whose
    kernels may round otherwise, carry none this machine can compare bit for bit: they are read as
    before, by their key and their files' sha256, never refused for it."""
    import json

    loaded = load_model(str(tiny_dir), device="cpu", dtype="float32", progress=False)
    first = measure(loaded, PROMPTS, probes="cosine", progress=False, out=cache / "kept")
    metadata = json.loads((cache / "kept" / "metadata.json").read_text())
    assert metadata["canary"] and metadata["canary_where"]
    from effdepth_core.measurement.identity import CANARY_DEFINITION

    ours = f" canary {CANARY_DEFINITION}"
    older = metadata["canary_where"].replace(ours, f" canary {CANARY_DEFINITION - 1}")  # an older definition
    assert older != metadata["canary_where"]
    for change in ({"canary_where": "another host"}, {"canary": None, "canary_where": None},
                   {"canary": "0" * 64, "canary_where": older}):  # fmt: skip
        (cache / "kept" / "metadata.json").write_text(json.dumps({**metadata, **change}))
        again = measure(loaded, PROMPTS, probes="cosine", progress=False, out=cache / "kept")
        assert again.per_example["cosine"].equals(first.per_example["cosine"])


def test_one_canary_serves_every_cache_and_sees_the_final_residual_and_logits_bit_for_bit(tiny_dir):
    """The one canary (``identity.canary_digest``): the sha256 of the ids, the final residual h_L
    (the final norm's input) and the logits at every position, recomputed here by hand; the run
    canary is that digest, the checked-once canary its logits-only form on the probe input. A
    rescale of h_L, which an RMSNorm hides from the logits, changes it."""
    import hashlib

    from effdepth_core.measurement.identity import _check_canary, canary_comparable, canary_digest, canary_record
    from effdepth_core.results import canary

    loaded = load_model(str(tiny_dir), device="cpu", dtype="float32", progress=False)
    ids = loaded.encode(PROMPTS[0])[:32]
    with torch.inference_mode():
        out = loaded.model(input_ids=ids[None], output_hidden_states=True)
    h_last = out.hidden_states[-1]  # the final norm's output in transformers' record: recompute its input
    with torch.inference_mode():
        h = loaded.model.model.embed_tokens(ids[None])
        position = torch.arange(ids.numel())[None]
        rotary = loaded.model.model.rotary_emb(h, position)
        for layer in loaded.layers:
            h = layer(h, position_embeddings=rotary, position_ids=position)
            h = h[0] if isinstance(h, tuple) else h
    assert torch.equal(loaded.final_norm(h), h_last)  # the manual forward is the model's
    by_hand = hashlib.sha256()
    for tensor in (ids, h.float(), out.logits.float()):
        by_hand.update(f"{tuple(tensor.shape)}:{tensor.dtype};".encode() + tensor.contiguous().numpy().tobytes())
    assert canary_digest(loaded.model, ids, loaded.final_norm) == by_hand.hexdigest()
    assert canary(loaded, PROMPTS) == by_hand.hexdigest()
    vocab = loaded.model.config.vocab_size
    assert _check_canary(loaded.model) == canary_digest(loaded.model, torch.arange(9) % (vocab - 1) + 1)
    record = canary_record(loaded.model, ids, loaded.final_norm)
    assert canary_comparable(record) and not canary_comparable({**record, "canary_where": "elsewhere"})
    assert not canary_comparable(None) and not canary_comparable({"canary_where": record["canary_where"]})

    # the last layer's output doubled: h_L doubles, and an RMSNorm with a negligible eps hides it from the logits
    loaded.final_norm.variance_epsilon = 1e-12
    before_logits, before = loaded.model(input_ids=ids[None]).logits, canary(loaded, PROMPTS)
    last = loaded.layers[-1]
    plain = last.forward
    last.forward = lambda *args, **kwargs: (lambda out: 2 * out if torch.is_tensor(out) else (2 * out[0], *out[1:]))(
        plain(*args, **kwargs)
    )
    try:
        torch.testing.assert_close(loaded.model(input_ids=ids[None]).logits, before_logits, rtol=1e-5, atol=1e-5)
        assert canary(loaded, PROMPTS) != before
    finally:
        del last.forward
