"""The logit lens's head product in bfloat16 (``head_dtype``): within bfloat16's rounding of an
independent float64 computation, the float32 path unchanged bit for bit, the setting resolved by
the hardware, keyed by what it resolves to (float32 runs keep their keys) and recorded."""

from __future__ import annotations

import pytest
import torch
from conftest import arch_of, make_tiny, random_prompts

from effdepth_core import devices
from effdepth_core.errors import OptionError
from effdepth_core.measurement import registry
from effdepth_core.measurement.probes import logit_lens, token_weighted_mean
from effdepth_core.results import _resolved
from effdepth_core.settings import RunSettings, check_settings

LENGTHS = [7, 12, 3, 10]
UNIT = 2.0**-8  # bfloat16 keeps 8 significant bits: rounding to nearest errs by at most 2^-9 relative


def _residuals(loaded, seed: int = 0) -> torch.Tensor:
    """Residual-like rows: each layer's input of a few random prompts (HF's own hidden states)."""
    ids = random_prompts([9], seed)[0]
    with torch.no_grad():
        hidden = loaded.model(input_ids=ids[None], output_hidden_states=True).hidden_states[:-1]
    return torch.cat([h[0] for h in hidden])


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "cohere2", "granite", "gpt_neox"])
def test_bfloat16_head_is_within_bfloat16_rounding_of_float64(arch):
    loaded = make_tiny(arch)
    residual = _residuals(loaded)
    out = torch.empty(residual.shape[0], loaded.vocab_size)
    got = loaded.head_into(residual, out, torch.bfloat16).double()
    with torch.no_grad():
        normed = loaded.final_norm(residual).double()
    weight = loaded.lm_head.weight.double()
    exact = normed @ weight.T
    # The bound, term by term: rounding a (the normed residual) and w (the head) to bfloat16 errs
    # by ≤ 2^-9 relative each, so each product a_i·w_i by ≤ (2^-9 + 2^-9 + 2^-18)|a_i w_i|, and
    # their float32 sum adds ≤ d·2^-24 Σ|a_i w_i| (no bfloat16 there); the bfloat16 output rounds
    # the logit once more, ≤ 2^-9 of its size. The logit scale multiplies the error; a soft-cap
    # c·tanh(x/c) has slope ≤ 1 so does not enlarge it. Relative to the logits' own scale, not a
    # fixed number: a logit of 40 may err by 0.08 and stay within bfloat16's rounding.
    magnitude = normed.abs() @ weight.abs().T
    bound = (UNIT * 1.01 + residual.shape[1] * 2.0**-24) * magnitude + (UNIT / 2) * exact.abs() * 1.01
    scale = abs(loaded.logit_scale) if loaded.logit_scale is not None else 1.0
    expected = torch.from_numpy(arch_of(loaded).logits(exact, loaded.model.config).numpy())
    error = (got - expected).abs()
    assert (error <= bound * scale + 1e-12).all(), float((error - bound * scale).max())
    assert (error > 0).any()  # the bfloat16 path was taken: float32 would round differently


def test_float32_head_is_unchanged_bit_for_bit():
    """The default and ``float32`` are today's computation: float32 matmul into the buffer."""
    for arch in ("llama", "gemma3_text", "cohere2"):
        loaded = make_tiny(arch)
        residual = _residuals(loaded)
        default = loaded.head_into(residual, torch.empty(residual.shape[0], loaded.vocab_size)).clone()
        explicit = loaded.head_into(residual, torch.empty_like(default), torch.float32)
        with torch.no_grad():
            reference = torch.matmul(loaded.final_norm(residual), loaded.lm_head.weight.t())
            if loaded.logit_scale is not None:
                reference.mul_(loaded.logit_scale)
            if loaded.logit_softcap:
                reference.div_(loaded.logit_softcap).tanh_().mul_(loaded.logit_softcap)
        assert torch.equal(default, explicit) and torch.equal(default, reference), arch
    prompts = random_prompts(LENGTHS)
    assert logit_lens(loaded, prompts).equals(logit_lens(loaded, prompts, head_dtype="float32"))


def test_bfloat16_copy_follows_a_weight_edited_in_place():
    loaded = make_tiny("llama")
    residual = _residuals(loaded)
    before = loaded.head_into(residual, torch.empty(residual.shape[0], loaded.vocab_size), torch.bfloat16).clone()
    with torch.no_grad():
        loaded.lm_head.weight.mul_(2.0)  # a power of two: the bfloat16 copy doubles exactly
    after = loaded.head_into(residual, torch.empty_like(before), torch.bfloat16)
    assert torch.equal(after, 2 * before)


def test_bfloat16_lens_matches_a_float64_lens_of_bfloat16_logits():
    """The lens with ``head_dtype="bfloat16"`` against the naive float64 lens of test_probes, whose
    per-layer logits are the head product of bfloat16-rounded inputs, rounded to bfloat16 (the
    product of two bfloat16 numbers is exact in float64, so only the float32 sum's last bits
    differ: a logit may round one bfloat16 step the other way, rarely; hence 1e-3 nats on means of
    KLs of O(1), not 1e-5). p is the float32 model output in both."""
    loaded = make_tiny("llama")
    prompts = random_prompts(LENGTHS)
    weight = loaded.lm_head.weight.detach().bfloat16().double()
    sums: dict[tuple[int, str], float] = {}
    total = 0
    for ids in prompts:
        with torch.no_grad():
            out = loaded.model(input_ids=ids[None], output_hidden_states=True)
            logp = torch.log_softmax(out.logits[0].double(), -1)
            normed = [loaded.final_norm(h)[0] for h in out.hidden_states[:-1]] + [out.hidden_states[-1][0]]
        total += ids.numel()
        for layer, x in enumerate(normed):
            logits = (x.bfloat16().double() @ weight.T).bfloat16().double()
            logq = torch.log_softmax(logits, -1)
            kl = (logq.exp() * (logq - logp)).sum(-1)
            # the lens's tie rule (bfloat16 logits tie): the lower index first, as a stable sort gives
            top_q = logq.sort(dim=-1, descending=True, stable=True).indices[:, :5]
            top_p = logp.sort(dim=-1, descending=True, stable=True).indices[:, :5]
            overlap = (top_q[:, :, None] == top_p[:, None, :]).any(-1).sum(-1) / 5
            sums[(layer, "kl")] = sums.get((layer, "kl"), 0.0) + float(kl.sum())
            sums[(layer, "overlap")] = sums.get((layer, "overlap"), 0.0) + float(overlap.sum())
    frame = token_weighted_mean(logit_lens(loaded, prompts, batch_size=3, head_dtype="bfloat16"))
    got = {(r["layer"], r["metric"]): r["value"] for r in frame.iter_rows(named=True)}
    assert set(got) == set(sums)
    for key, value in sums.items():
        assert got[key] == pytest.approx(value / total, abs=1e-3), key


def test_auto_resolves_by_hardware_and_weights(monkeypatch):
    monkeypatch.setattr(devices, "_cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert devices.fast_bfloat16("cpu")
    assert devices.resolve_head_dtype("auto", "cpu", torch.float32) == "bfloat16"
    assert devices.resolve_head_dtype("auto", "cpu", torch.bfloat16) == "float32"  # its own dtype already
    assert devices.resolve_head_dtype("float32", "cpu", torch.float32) == "float32"
    monkeypatch.setattr(devices, "_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert not devices.fast_bfloat16("cpu")
    assert devices.resolve_head_dtype("auto", "cpu", torch.float32) == "float32"
    assert devices.resolve_head_dtype("bfloat16", "cpu", torch.float32) == "bfloat16"  # asked: done
    assert not devices.fast_bfloat16("meta")


@pytest.mark.parametrize("fast", [True, False])
def test_the_resolved_head_dtype_is_keyed_and_recorded(monkeypatch, fast):
    flags = frozenset({"amx_bf16"} if fast else {"avx2"})
    monkeypatch.setattr(devices, "_cpu_flags", lambda: flags)

    def settings(**values) -> RunSettings:
        return RunSettings("smollm2-135m", "gsm8k", device="cpu", **values)

    auto, f32, bf16 = settings(head_dtype="auto"), settings(head_dtype="float32"), settings(head_dtype="bfloat16")
    assert settings().key() == auto.key()  # the default is auto: bfloat16 where fast, float32's key elsewhere
    lens, cosine = registry.get("logit_lens"), registry.get("cosine")
    # float32 is the key's absent value: a float32 run keeps the key every run had before the option
    assert "head_dtype" not in f32.key_fields() and "head_dtype" not in str(f32.key_fields())
    assert bf16.key_fields()["head_dtype"] == "bfloat16" and bf16.key() != f32.key()
    assert bf16.probe_key(lens) != f32.probe_key(lens)
    assert bf16.probe_key(cosine, base=f32.base_fields()) == f32.probe_key(cosine)  # not a cosine option
    same = bf16 if fast else f32
    assert auto.key() == same.key() and auto.probe_key(lens) == same.probe_key(lens)
    assert _resolved(lens, auto) == {"head_dtype": "bfloat16" if fast else "float32"}
    assert _resolved(lens, f32) == {"head_dtype": "float32"} and _resolved(cosine, auto) == {}
    # a bfloat16 model multiplies its head in bfloat16 whatever auto says: auto adds nothing to its key
    assert "head_dtype" not in settings(dtype="bfloat16", head_dtype="auto").key_fields()


def test_a_bad_head_dtype_is_one_line():
    with pytest.raises(OptionError, match=r"head_dtype \(--head-dtype\) must be one of auto, float32, bfloat16"):
        check_settings(RunSettings("smollm2-135m", "gsm8k", head_dtype="bf16"), ["logit_lens"])
    with pytest.raises(OptionError, match="head_dtype"):
        logit_lens(make_tiny("llama"), random_prompts([3]), head_dtype="float16")


def test_a_bad_head_dtype_exits_2_on_the_command_line(capsys):
    from effdepth_core import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--model", "smollm2-135m", "--task", "gsm8k", "--head-dtype", "half"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "--head-dtype" in err


def test_the_book_keeps_float32():
    from effdepth_book.study import task_settings

    settings = task_settings("smollm2-135m", {"task": "gsm8k"}, {"seed": 0, "device": "auto", "dtype": "auto"})
    assert settings.head_dtype == "float32" and "head_dtype" not in settings.key_fields()
