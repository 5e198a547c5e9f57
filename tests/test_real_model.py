"""The embedded default model (smollm2-135m, fetched by .ci/run): probe curves against a manual
layer-by-layer forward built from the HF model's own modules, in float64 reductions."""

from __future__ import annotations

import json

import pytest
import torch

from effdepth_core.cli import main
from effdepth_core.measurement.probes import logit_lens, residual_cosine, token_weighted_mean
from effdepth_core.task_loading import load_task

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def prompts():
    return [e.prompt for e in load_task("addition", n=2, digits=6, seed=0)] + ["The capital of France is Paris."]


def _manual_forward(loaded, ids: torch.Tensor):
    """h_l, a_l, m_l for every layer of a llama model, computed module by module (no hooks)."""
    model = loaded.model.model
    with torch.no_grad():
        h = model.embed_tokens(ids[None])
        position_embeddings = model.rotary_emb(h, torch.arange(ids.numel())[None])
        states = []
        for layer in model.layers:
            attn, _ = layer.self_attn(
                hidden_states=layer.input_layernorm(h), position_embeddings=position_embeddings, attention_mask=None
            )
            mlp = layer.mlp(layer.post_attention_layernorm(h + attn))
            states.append((h[0].double(), attn[0].double(), mlp[0].double()))
            h = h + attn + mlp
        reference = loaded.model(input_ids=ids[None], output_hidden_states=True)
    # the manual forward is the model's forward: same final norm input, same logits
    torch.testing.assert_close(model.norm(h), reference.hidden_states[-1], atol=1e-4, rtol=1e-4)
    return states, h[0].double(), reference


def test_cosine_curves_match_a_manual_forward(smollm2, prompts):
    sums: dict[tuple[int, str], float] = {}
    total = 0
    for text in prompts:
        ids = smollm2.encode(text)
        states, _, _ = _manual_forward(smollm2, ids)
        total += ids.numel()
        for layer, (h, a, m) in enumerate(states):
            pairs = {"attn": (a, h), "mlp": (m, h + a), "layer": (a + m, h)}
            for part, (x, ref) in pairs.items():
                cos = (x * ref).sum(-1) / (x.norm(dim=-1) * ref.norm(dim=-1))
                rel = x.norm(dim=-1) / ref.norm(dim=-1)
                sums[(layer, f"cos_{part}")] = sums.get((layer, f"cos_{part}"), 0.0) + float(cos.sum())
                sums[(layer, f"rel_{part}")] = sums.get((layer, f"rel_{part}"), 0.0) + float(rel.sum())
    frame = token_weighted_mean(residual_cosine(smollm2, prompts, batch_size=3))
    got = {(r["layer"], r["metric"]): r["value"] for r in frame.iter_rows(named=True)}
    assert len(got) == 30 * 6
    for key, value in sums.items():
        assert got[key] == pytest.approx(value / total, abs=2e-4, rel=1e-3), key


def test_lens_curves_match_the_models_own_logits(smollm2, prompts):
    sums: dict[tuple[int, str], float] = {}
    total = 0
    for text in prompts:
        ids = smollm2.encode(text)
        states, h_last, reference = _manual_forward(smollm2, ids)
        logp = torch.log_softmax(reference.logits[0].double(), -1)  # the model's own output
        top_p = logp.topk(5, -1).indices
        total += ids.numel()
        residuals = [h for h, _, _ in states] + [h_last]
        for layer, h in enumerate(residuals):
            with torch.no_grad():
                logq = torch.log_softmax(smollm2.model.lm_head(smollm2.final_norm(h.float())).double(), -1)
            kl = (logq.exp() * (logq - logp)).sum(-1)
            top_q = logq.topk(5, -1).indices
            overlap = [len(set(q.tolist()) & set(p.tolist())) / 5 for q, p in zip(top_q, top_p, strict=True)]
            sums[(layer, "kl")] = sums.get((layer, "kl"), 0.0) + float(kl.sum())
            sums[(layer, "overlap")] = sums.get((layer, "overlap"), 0.0) + sum(overlap)
    frame = token_weighted_mean(logit_lens(smollm2, prompts, batch_size=3))
    got = {(r["layer"], r["metric"]): r["value"] for r in frame.iter_rows(named=True)}
    assert len(got) == 31 * 2
    for key, value in sums.items():
        assert got[key] == pytest.approx(value / total, abs=2e-3, rel=1e-3), key
    assert got[(30, "kl")] == pytest.approx(0.0, abs=1e-4) and got[(30, "overlap")] == 1.0


def test_cli_run_on_the_default_model(tmp_path, capsys):
    out = tmp_path / "smollm2"
    assert (
        main(["run", "--model", "smollm2-135m", "--task", "gsm8k", "--n", "2", "--out", str(out), "--no-progress"]) == 0
    )
    summary = json.loads((out / "effective_depth.json").read_text())
    assert summary["n_layers"] == 30 and summary["n_examples"] == 2
    stdout = capsys.readouterr().out
    assert "smollm2-135m" in stdout and "gsm8k" in stdout


def test_pruning_and_early_exit_on_the_real_model(smollm2):
    """Removing layers equals the skip probe's all-token skip in a full forward; exiting at L is the model."""
    from effdepth_core.measurement.probes.early_exit import early_exit
    from effdepth_core.measurement.probes.prune import pruned_final
    from effdepth_core.measurement.probes.skip import skip_hooks
    from effdepth_core.measurement.probes.tuned_lens import TunedLens
    from effdepth_core.measurement.replay import clean_run
    from effdepth_core.measurement.trace import intervene

    example = load_task("addition", n=1, digits=6, seed=3)[0]
    ids = smollm2.encode(example.prompt)
    run = clean_run(smollm2, ids)
    sets = [(), (5,), (10, 11, 12, 13)]
    finals = pruned_final(smollm2, run, sets)
    for row, removed in enumerate(sets):
        hooks = [
            h for s in removed for h in skip_hooks(smollm2, "layer", s, torch.ones(1, dtype=torch.bool), slice(0, None))
        ]
        with intervene(hooks), torch.inference_mode():
            slow = smollm2.model(input_ids=ids[None], use_cache=False).logits[0]
        fast = smollm2.head(finals[row])
        # float32 logits of size ~20: the replay sums the same terms in another batch shape (~1e-5 apart)
        assert (fast - slow).abs().max() <= 1e-5 * slow.abs().max(), removed
    exits = early_exit(smollm2, [example])
    assert exits.filter(layer=smollm2.n_layers, metric="agreement")["value"].item() == 1.0
    assert early_exit(smollm2, [example], lens=TunedLens.identity(smollm2)).equals(exits)
    prompts = [example.prompt]
    assert logit_lens(smollm2, prompts, lens=TunedLens.identity(smollm2)).equals(logit_lens(smollm2, prompts))


@pytest.mark.slow
def test_dequantized_weights_equal_the_gguf_parse(smollm2):
    """The second load reads the cached safetensors: the same weights, tokens and logits as parsing
    and dequantizing the GGUF again."""
    from effdepth_core.acquire import dequantized_dir, dequantized_ready, gguf_mismatch
    from effdepth_core.models import load_model
    from effdepth_core.zoo import model_path

    folder, sha256 = dequantized_dir("smollm2-135m", model_path("smollm2-135m"), torch.float32)
    assert dequantized_ready(folder, "torch.float32", sha256)  # the fixture's load wrote it (or read it)
    assert gguf_mismatch(folder, model_path("smollm2-135m")) is None  # else every load would rebuild it
    warm = load_model("smollm2-135m", device="cpu", dtype="float32", progress=False)
    cold = load_model("smollm2-135m", device="cpu", dtype="float32", progress=False, cached_weights=False)
    warm_state, cold_state = warm.model.state_dict(), cold.model.state_dict()
    assert warm_state.keys() == cold_state.keys()
    assert all(torch.equal(warm_state[k], cold_state[k]) for k in cold_state)  # bit for bit
    text = "Question: 123 + 456 = ? Answer: 579"
    assert torch.equal(warm.encode(text), cold.encode(text))
    with torch.no_grad():
        ids = cold.encode(text)[None]
        assert torch.equal(warm.model(ids).logits, cold.model(ids).logits)


def test_arithmetic_answer_tokens_are_the_digits(smollm2):
    # as the published code measures them: the space before the result belongs to the question
    from effdepth_core.measurement.probes.shared.answers import answer_split

    for example in load_task("addition", n=4, digits=6):
        split = answer_split(smollm2, example)
        digits = [smollm2.tokenizer.decode([t]) for t in split.targets.tolist()]
        assert "".join(digits) == example.answer and all(d.isdigit() for d in digits), digits


def test_loading_an_alias_resolves_it_once(smollm2, monkeypatch):
    """Acquisition is one step: ``load_model`` asks ``acquire.resolve_model`` once, which fetches or
    verifies the GGUF once (then the verified dequantized folder is read)."""
    from effdepth_core import acquire, loading, models

    calls = {"resolve": 0, "ensure": 0}
    resolve, ensure = acquire.resolve_model, acquire.ensure_model

    def counted_resolve(*args, **kwargs):
        calls["resolve"] += 1
        return resolve(*args, **kwargs)

    def counted_ensure(*args, **kwargs):
        calls["ensure"] += 1
        return ensure(*args, **kwargs)

    monkeypatch.setattr(loading, "resolve_model", counted_resolve)  # load_model's home
    monkeypatch.setattr(acquire, "ensure_model", counted_ensure)
    loaded = models.load_model("smollm2-135m", device="cpu", dtype="float32", progress=False)
    assert calls == {"resolve": 1, "ensure": 1} and loaded.n_layers == 30
