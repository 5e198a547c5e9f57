"""Residual-cosine and logit-lens probes against slow independent computations: one prompt at a
time, per-token Python loops in float64, HF's own forward for hidden states and final logits."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from conftest import arch_of, make_tiny, random_prompts

from effdepth_core.measurement.probes import logit_lens, residual_cosine, token_weighted_mean
from effdepth_core.measurement.probes.cosine import RESIDUAL_METRICS

LENGTHS = [7, 12, 3, 10]


def _capture(loaded, ids: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """h_l, a_l, m_l, h_{l+1} for one prompt through plain hooks written here (not effdepth's)."""
    store: dict[str, list] = {"h_in": [], "attn": [], "mlp": [], "h_out": []}
    handles = []
    for index, layer in enumerate(loaded.layers):
        attn, mlp = loaded.sublayers(index)
        handles.append(
            layer.register_forward_pre_hook(
                lambda m, a, k: store["h_in"].append(a[0] if a else k["hidden_states"]), with_kwargs=True
            )
        )
        handles.append(
            attn.register_forward_hook(lambda m, a, o: store["attn"].append(o[0] if isinstance(o, tuple) else o))
        )
        handles.append(mlp.register_forward_hook(lambda m, a, o: store["mlp"].append(o.clone())))
        handles.append(
            layer.register_forward_hook(lambda m, a, o: store["h_out"].append(o[0] if isinstance(o, tuple) else o))
        )
    try:
        with torch.no_grad():
            loaded.model(input_ids=ids[None])
    finally:
        for handle in handles:
            handle.remove()
    arch = arch_of(loaded)  # the architecture's own reading of a sublayer's output as its write
    store["attn"] = [arch.attn_write(a, h) for a, h in zip(store["attn"], store["h_in"], strict=True)]
    store["mlp"] = [
        arch.mlp_write(m, h + a) for m, h, a in zip(store["mlp"], store["h_in"], store["attn"], strict=True)
    ]
    scale = arch.write_scale(loaded.model.config)  # what each sublayer's output is multiplied by
    return {k: [t[0].double() * (scale if k in ("attn", "mlp") else 1.0) for t in v] for k, v in store.items()}


def naive_residual(loaded, prompts) -> dict[tuple[int, str], float]:
    """Token-weighted means of the six method.md §1 metrics, token by token in float64."""
    sums: dict[tuple[int, str], float] = {}
    total = 0
    for ids in prompts:
        cap = _capture(loaded, ids)
        total += ids.numel()
        for layer in range(loaded.n_layers):
            h, a, m, out = (cap[k][layer] for k in ("h_in", "attn", "mlp", "h_out"))
            for t in range(ids.numel()):
                pairs = {"attn": (a[t], h[t]), "mlp": (m[t], h[t] + a[t]), "layer": (out[t] - h[t], h[t])}
                for part, (x, ref) in pairs.items():
                    cos = float(x @ ref / (x.norm() * ref.norm()))
                    rel = float(x.norm() / ref.norm())
                    sums[(layer, f"cos_{part}")] = sums.get((layer, f"cos_{part}"), 0.0) + cos
                    sums[(layer, f"rel_{part}")] = sums.get((layer, f"rel_{part}"), 0.0) + rel
    return {key: value / total for key, value in sums.items()}


def _softcap(loaded, logits: torch.Tensor) -> torch.Tensor:
    """The head's tail after lm_head, as the architecture's forward writes it (``Arch.logits``)."""
    return arch_of(loaded).logits(logits, loaded.model.config)


def naive_lens(loaded, prompts, k: int = 5) -> dict[tuple[int, str], float]:
    """KL(q_l || p) and top-k overlap for l = 0..L, token by token in float64; p is the model's
    own output logits and h_l HF's own hidden states."""
    sums: dict[tuple[int, str], float] = {}
    total = 0
    for ids in prompts:
        with torch.no_grad():
            out = loaded.model(input_ids=ids[None], output_hidden_states=True)
            logp = torch.log_softmax(out.logits[0].double(), -1)
            layers = [loaded.lm_head(loaded.final_norm(h))[0] for h in out.hidden_states[:-1]]
            layers.append(loaded.lm_head(out.hidden_states[-1])[0])  # HF's last entry is already normed
        total += ids.numel()
        for layer, logits in enumerate(layers):
            logq = torch.log_softmax(_softcap(loaded, logits).double(), -1)
            for t in range(ids.numel()):
                kl = float((logq[t].exp() * (logq[t] - logp[t])).sum())
                top_q = set(torch.topk(logq[t], k).indices.tolist())
                top_p = set(torch.topk(logp[t], k).indices.tolist())
                sums[(layer, "kl")] = sums.get((layer, "kl"), 0.0) + kl
                sums[(layer, "overlap")] = sums.get((layer, "overlap"), 0.0) + len(top_q & top_p) / k
    return {key: value / total for key, value in sums.items()}


def _as_dict(frame: pl.DataFrame) -> dict[tuple[int, str], float]:
    return {(row["layer"], row["metric"]): row["value"] for row in token_weighted_mean(frame).iter_rows(named=True)}


def test_residual_cosine_matches_naive(tiny):
    prompts = random_prompts(LENGTHS)
    expected = naive_residual(tiny, prompts)
    got = _as_dict(residual_cosine(tiny, prompts, batch_size=3))
    assert set(got) == set(expected) == {(layer, m) for layer in range(tiny.n_layers) for m in RESIDUAL_METRICS}
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=2e-5), key


def test_logit_lens_matches_naive(tiny):
    prompts = random_prompts(LENGTHS)
    expected = naive_lens(tiny, prompts)
    got = _as_dict(logit_lens(tiny, prompts, batch_size=3))
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=5e-5), key


def test_lens_on_the_final_residual_is_exact(tiny):
    frame = token_weighted_mean(logit_lens(tiny, random_prompts(LENGTHS)))
    last = frame.filter(pl.col("layer") == tiny.n_layers)
    assert last.filter(metric="kl")["value"][0] == pytest.approx(0.0, abs=1e-5)
    assert last.filter(metric="overlap")["value"][0] == 1.0


def test_the_one_pass_lens_equals_the_two_pass_lens_bit_for_bit(tiny, monkeypatch):
    """The lens keeps a batch's residuals and decodes them after one forward pass when they fit in
    its budget, else it runs a first pass for p: the same tensors decoded against the same p, so
    the same bits, on every tiny architecture (same batches; only the budget's spare part moved)."""
    from effdepth_core.measurement.probes.shared import lens as lens_module
    from effdepth_core.measurement.trace import forward

    prompts = random_prompts(LENGTHS)  # two batches of at most 3
    first_passes = []
    monkeypatch.setattr(lens_module, "forward", lambda *a, **k: first_passes.append(1) or forward(*a, **k))
    one_pass = logit_lens(tiny, prompts, batch_size=3)
    assert not first_passes  # a tiny model's batch fits the default budget
    real = lens_module._decode_measure
    monkeypatch.setattr(lens_module, "_decode_measure", lambda *a: real(*a[:-1], 0))  # no spare bytes
    two_pass = logit_lens(tiny, prompts, batch_size=3)
    assert len(first_passes) == 2  # one first pass per batch
    assert one_pass.equals(two_pass)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "gpt_neox"])
def test_batching_and_chunking_do_not_change_numbers(arch):
    loaded = make_tiny(arch)
    prompts = random_prompts(LENGTHS)
    one_at_a_time = residual_cosine(loaded, prompts, batch_size=1)
    batched = residual_cosine(loaded, prompts, batch_size=4)
    np.testing.assert_allclose(batched["value"].to_numpy(), one_at_a_time["value"].to_numpy(), atol=1e-5)
    lens_single = logit_lens(loaded, prompts, batch_size=1)
    # a tiny memory budget forces one-token chunks and one-prompt batches
    lens_chunked = logit_lens(loaded, prompts, batch_size=4, memory_budget_mb=0)
    np.testing.assert_allclose(lens_chunked["value"].to_numpy(), lens_single["value"].to_numpy(), atol=1e-5)


def test_per_example_frames_keep_each_prompt():
    loaded = make_tiny("qwen2")
    prompts = random_prompts(LENGTHS)
    frame = residual_cosine(loaded, prompts, batch_size=2)
    assert frame.columns == ["example", "layer", "metric", "value", "n_tokens"]
    counts = frame.group_by("example").agg(pl.col("n_tokens").first()).sort("example")["n_tokens"].to_list()
    assert counts == LENGTHS
    # each example's own curve equals the probe run on that prompt alone
    alone = residual_cosine(loaded, prompts[1:2])
    np.testing.assert_allclose(
        frame.filter(example=1).sort("metric", "layer")["value"].to_numpy(),
        alone.sort("metric", "layer")["value"].to_numpy(),
        atol=1e-5,
    )


def test_top_k_is_a_parameter():
    loaded = make_tiny("llama")
    prompts = random_prompts(LENGTHS)
    expected = naive_lens(loaded, prompts, k=1)
    got = _as_dict(logit_lens(loaded, prompts, top_k=1))
    for layer in range(loaded.n_layers + 1):
        assert got[(layer, "overlap")] == pytest.approx(expected[(layer, "overlap")], abs=1e-6)


def test_every_prompt_probe_takes_one_input_contract():
    """A string is one prompt; Examples are their prompts; ids as tensors, lists, a padded
    [batch, token] tensor with its mask (a pair or a tokenizer's dict, padded left or right) give
    the numbers of the plain texts — the padding is never averaged in."""
    from conftest import char_tokenizer

    from effdepth_core.errors import EffdepthError
    from effdepth_core.measurement.probes.norm import residual_norm
    from effdepth_core.models import wrap_model
    from effdepth_core.tasks import Example

    loaded = wrap_model(make_tiny("llama").model, char_tokenizer(), name="tiny")
    texts = ["hello world", "abc"]
    ids = [loaded.encode(t) for t in texts]
    right = torch.zeros(2, 11, dtype=torch.long)
    left = torch.zeros(2, 11, dtype=torch.long)
    mask_right, mask_left = torch.zeros_like(right), torch.zeros_like(left)
    for i, t in enumerate(ids):
        right[i, : t.numel()], mask_right[i, : t.numel()] = t, 1
        left[i, 11 - t.numel() :], mask_left[i, 11 - t.numel() :] = t, 1
    for probe in (residual_cosine, residual_norm, lambda m, p: logit_lens(m, p, top_k=3)):
        expected = probe(loaded, texts)
        for given in (
            [Example(t) for t in texts],
            ids,
            [t.tolist() for t in ids],
            (right, mask_right),
            {"input_ids": left, "attention_mask": mask_left},
        ):
            assert probe(loaded, given).equals(expected)
        one = probe(loaded, "hello world")
        alone = expected.filter(example=0)
        assert one.select(pl.exclude("value")).equals(alone.select(pl.exclude("value")))  # one prompt, not 11
        # alone vs in a padded batch of two: float32 matmuls round differently, ~1e-7 of the scale
        assert (one["value"] - alone["value"]).abs().max() <= 1e-5 * max(1.0, alone["value"].abs().max())
        assert one["n_tokens"].unique().to_list() == [ids[0].numel()]
    with pytest.raises(EffdepthError, match="a prompt must be text, an Example, or token ids"):
        residual_cosine(loaded, [3.5])
    # what is not a prompt is one line naming it, never a raw error or other tokens probed silently
    for given, said in (
        (42, "prompts must be text, an Example, token ids"),
        (None, "prompts must be text, an Example, token ids"),
        (torch.rand(1, 5), "token ids must be whole numbers, got a float32 tensor"),
        ([[5, 6.5, 7]], "token ids must be whole numbers"),
        ([[5, 6, 9999]], r"prompt 0 has token id 9999, outside the vocabulary of 'tiny' \(0\.\.63\)"),
        ([[5, -1, 7]], r"prompt 0 has token id -1, outside the vocabulary"),
    ):
        with pytest.raises(EffdepthError, match=said):
            residual_cosine(loaded, given)
    with pytest.raises(EffdepthError, match="wrap_model takes a transformers causal LM"):
        wrap_model(torch.nn.Linear(3, 3))


def test_a_model_whose_attention_reads_padded_positions_is_measured_one_prompt_at_a_time():
    """Five sparse-attention models (an indexer picking top-k keys over all positions, padded ones
    included) were silently wrong under padding. Here a layer that mixes in the mean over every
    position stands for them: the load-time check finds it, says so once, and every batched probe
    then gives each prompt's own numbers (equal to one prompt per batch), where a padded batch would
    not."""
    import warnings

    from conftest import char_tokenizer, make_tiny

    from effdepth_core.errors import EffdepthWarning
    from effdepth_core.measurement.probes import residual_cosine
    from effdepth_core.models import wrap_model

    tiny = make_tiny("llama")

    def mix_all_positions(module, args, kwargs):  # what an indexer over padded keys does to a prompt
        if args:
            return ((args[0] + 0.5 * args[0].mean(dim=1, keepdim=True), *args[1:]), kwargs)
        hidden = kwargs["hidden_states"]
        return (args, {**kwargs, "hidden_states": hidden + 0.5 * hidden.mean(dim=1, keepdim=True)})

    handle = tiny.model.model.layers[1].register_forward_pre_hook(mix_all_positions, with_kwargs=True)
    try:
        with pytest.warns(EffdepthWarning, match="effdepth measures it one prompt at a time"):
            loaded = wrap_model(tiny.model, char_tokenizer(), name="sparse")
        assert not loaded.pads_safely and loaded.rows(4) == 1
        prompts = ["a short one", "a much longer prompt than that one", "mid length"]
        batched = residual_cosine(loaded, prompts, batch_size=4).sort("example", "layer", "metric")
        alone = residual_cosine(loaded, prompts, batch_size=1).sort("example", "layer", "metric")
        assert batched["value"].to_list() == alone["value"].to_list()  # the same single-prompt batches
        loaded.pads_safely = True  # a load-time verdict that missed it: the run's own prompts are checked too
        with pytest.warns(EffdepthWarning, match="this run's prompts .* one prompt at a time"):
            rechecked = residual_cosine(loaded, prompts, batch_size=4).sort("example", "layer", "metric")
        assert rechecked["value"].to_list() == alone["value"].to_list()
        loaded.rows = lambda batch_size, token_lists=None: batch_size  # what a padded batch would have given
        padded = residual_cosine(loaded, prompts, batch_size=4).sort("example", "layer", "metric")
        assert float((padded["value"] - alone["value"]).abs().max()) > 1e-3
    finally:
        handle.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plain model: no warning, batched as asked
        assert wrap_model(tiny.model, char_tokenizer(), name="plain").rows(4) == 4


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_the_lens_by_token_averages_to_the_logit_lens_and_names_its_tokens(arch):
    """Per-token KL and overlap of one prompt, averaged over its tokens, are the logit-lens probe's
    per-example values (the probe is a mean of exactly these); the top tokens are the head's
    argmax decoded by the tokenizer (a hand check at one position and layer)."""
    import torch
    from conftest import char_tokenizer, make_tiny

    from effdepth_core.measurement.probes import lens_by_token, logit_lens
    from effdepth_core.models import wrap_model

    loaded = wrap_model(make_tiny(arch).model, char_tokenizer(), name=arch)
    prompt = "what is 12 + 30? it is 42."
    rows = lens_by_token(loaded, prompt, top_k=3)
    n_tokens = int(loaded.encode(prompt).numel())
    assert rows.height == n_tokens * (loaded.n_layers + 1)
    means = rows.group_by("layer").agg(pl.col("kl").mean(), pl.col("overlap").mean()).sort("layer")
    probe = logit_lens(loaded, [prompt], top_k=3, progress=False)
    for metric in ("kl", "overlap"):
        theirs = probe.filter(metric=metric).sort("layer")["value"].to_numpy()
        # float32 sums of the same per-token terms in another order: ~1e-6 of KL values of order 1
        assert means[metric].to_numpy() == pytest.approx(theirs, rel=1e-4, abs=1e-5)
    assert rows.filter(layer=loaded.n_layers)["kl"].abs().max() < 1e-5  # the output decoded is p itself
    row = rows.filter(layer=1, position=4).row(0, named=True)
    from effdepth_core.measurement.trace import residual_states

    with torch.inference_mode():
        states = torch.cat(list(residual_states(loaded, [loaded.encode(prompt)], 1)))  # [token, L+1, d_model]
        logits = loaded.head_of_normed(loaded.final_norm(states[4, 1]))  # the model's soft-cap included
    assert row["top_tokens"][0] == loaded.tokenizer.decode([int(logits.argmax())])
    assert row["token"] == loaded.tokenizer.decode([int(loaded.encode(prompt)[4])])
    assert row["top_probs"][0] == pytest.approx(float(torch.softmax(logits, -1).max()), rel=1e-5)


def test_the_lens_by_token_is_the_same_in_chunks_of_any_size(monkeypatch):
    """Positions are decoded a chunk at a time, every layer of a chunk in one product: one position
    per chunk (the smallest) gives the rows of one chunk for all, in the same order."""
    from conftest import char_tokenizer, make_tiny

    from effdepth_core.measurement.probes import lens_by_token, lens_tokens
    from effdepth_core.models import wrap_model

    loaded = wrap_model(make_tiny("llama").model, char_tokenizer(), name="llama")
    prompt = "what is 12 + 30? it is 42."
    whole = lens_by_token(loaded, prompt, top_k=3)
    monkeypatch.setattr(lens_tokens, "TOKEN_CHUNK", 1)  # one position per chunk
    apart = lens_by_token(loaded, prompt, top_k=3)
    assert apart.select("position", "layer", "top_tokens").equals(whole.select("position", "layer", "top_tokens"))
    # the same float32 products over fewer rows: rounding of ~1e-7 of KL values of order 1
    assert apart["kl"].to_numpy() == pytest.approx(whole["kl"].to_numpy(), rel=1e-5, abs=1e-6)
    assert apart["top_probs"].list.get(0).to_numpy() == pytest.approx(
        whole["top_probs"].list.get(0).to_numpy(), rel=1e-5
    )


@pytest.mark.parametrize(
    ("dtype", "drift", "leak", "safe"),
    [
        (torch.bfloat16, 0.03, 0.0, True),  # deep bf16 rounding of another batch shape, every row alike
        (torch.bfloat16, 0.0, 0.03, False),  # the padded prompt alone moves: padding
        (torch.bfloat16, 0.03, 0.3, False),  # padding on top of the rounding, well beyond it
        (torch.float32, 0.0, 1e-3, False),  # float32: a 0.1 % move of the padded prompt is padding
        (torch.float32, 1e-3, 0.0, True),
    ],
)
def test_padding_is_told_from_the_batchs_own_rounding(dtype, drift, leak, safe):
    """On an H200 random bf16 Qwen2.5-1.5B/7B weights moved a batch's last states by 1.4-3.6 %
    whether padded or not, and were measured one prompt at a time (7x slower): the unpadded prompt's
    own drift is the batch's rounding, and only a padded prompt's move beyond it is padding."""
    import types

    from effdepth_core.models import pads_safely

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = types.SimpleNamespace(vocab_size=50)
            self.embed = torch.nn.Embedding(50, 8, dtype=dtype)
            self.first = torch.nn.Identity()

        def forward(self, input_ids, attention_mask, use_cache=False):
            h = self.first(self.embed(input_ids).float())  # [batch, token, d_model]
            if input_ids.shape[0] > 1:
                h = h * (1 + drift)  # every row of the batch, by the batch shape's rounding
                padded = (attention_mask == 0).any(dim=1)  # [batch]
                h = h * (1 + leak * padded[:, None, None])
            return types.SimpleNamespace(last_hidden_state=h)

    stack = Stack()
    assert pads_safely(stack, stack, stack.first) is safe


def test_per_token_means_leave_padding_out_whatever_it_holds_and_refuse_a_prompts_own_nan():
    """A probe's per-token ratio is 0/0 at padded positions: the means of a padded batch of two
    lengths equal the hand-computed ones (1 + position, averaged), and a NaN at a prompt's own token
    is refused in one line."""
    from effdepth_core.errors import NonFiniteActivationError
    from effdepth_core.measurement.probes.shared.activations import per_token_means

    loaded = make_tiny("llama")
    prompts = random_prompts([3, 6])

    def measure(batch, poison=False):
        def per_layer(trace):
            real = batch.mask[..., None].float()  # [batch, token, 1]: 0/0 where padded
            position = torch.arange(real.shape[1], dtype=torch.float32)[None, :, None]
            values = (1.0 + position) * real / real
            if poison:
                values[0, 0, 0] = float("nan")  # a real token: the first prompt's first
            return [(trace.layer, values)]

        return per_layer

    frame = per_token_means(loaded, prompts, ["ratio"], loaded.n_layers, measure, "ratio", batch_size=2)
    means = frame.filter(layer=0).sort("example")["value"].to_list()
    assert means == [2.0, 3.5]  # (1+2+3)/3 and (1+…+6)/6: the batch pads on the right
    with pytest.raises(NonFiniteActivationError, match="ratio"):
        per_token_means(loaded, prompts, ["ratio"], loaded.n_layers, lambda b: measure(b, True), "ratio", batch_size=2)


def test_the_lens_by_token_at_top_1_is_the_first_of_its_top_3_and_averages_to_the_probe():
    """k = 1 takes the max rather than topk: the same token and probability as the first of the
    top 3, and the overlap at k = 1 averages to the logit-lens probe's at k = 1."""
    from conftest import char_tokenizer

    from effdepth_core.measurement.probes import lens_by_token
    from effdepth_core.models import wrap_model

    loaded = wrap_model(make_tiny("llama").model, char_tokenizer(), name="llama")
    prompt = "what is 12 + 30? it is 42."
    one, three = lens_by_token(loaded, prompt, top_k=1), lens_by_token(loaded, prompt, top_k=3)
    assert one["top_tokens"].list.get(0).to_list() == three["top_tokens"].list.get(0).to_list()
    np.testing.assert_allclose(one["top_probs"].list.get(0), three["top_probs"].list.get(0), rtol=1e-6)
    means = one.group_by("layer").agg(pl.col("overlap").mean()).sort("layer")["overlap"].to_numpy()
    probe = logit_lens(loaded, [prompt], top_k=1, progress=False).filter(metric="overlap").sort("layer")
    np.testing.assert_allclose(means, probe["value"].to_numpy(), atol=1e-6)  # shares of whole tokens


@pytest.mark.parametrize("vocab", [100, 5120, 49152, 151936, 262144 + 77])
def test_largest_is_a_stable_sorts_first_k(vocab):
    """``largest`` against an independent rule: a stable descending sort of the whole row, its first
    k (on a tie the lower index). On continuous logits that is also ``topk``'s answer; on rows of
    ties (a bfloat16 head product's logits tie often) it is the sort's; vocabularies a multiple of
    the span or not, rows with fewer finite entries than k, integer rows."""
    from effdepth_core.topk import largest

    def reference(values, k):
        found, indices = values.sort(dim=-1, descending=True, stable=True)
        return found[..., :k], indices[..., :k]

    generator = torch.Generator().manual_seed(vocab)
    values = torch.randn(7, vocab, generator=generator) * 4
    values[1, -1] = 100.0  # the largest entry in the last (shorter) span
    values[2, :5] = 50.0 + torch.arange(5.0)  # all k in one span
    for k in (2, 5, 10):
        expected, got = values.topk(k, dim=-1), largest(values, k)
        assert torch.equal(got.values, expected.values) and torch.equal(got.indices, expected.indices), k
    ties = torch.randint(0, 3, (4, vocab), generator=generator).float()  # thousands of tied maxima
    grid = (torch.randn(4, vocab, generator=generator) * 4).bfloat16().float()  # bfloat16-rounded logits
    sparse = torch.full((2, vocab), float("-inf"))
    sparse[:, -1], sparse[1, 3] = 1.0, 2.0  # fewer finite entries than k
    many = torch.cat([ties] * 9).long()  # 36 rows: the sort path takes them 16 at a time
    nan = values[:5].clone()  # NaN sorts above every number (a broken head's logits must not crash)
    nan[0, 3], nan[1, ::7], nan[2, -1], nan[3], nan[4, 5] = (float("nan"),) * 4 + (float("inf"),)
    for rows in (ties, grid, sparse, ties.long(), grid[None], many, nan):  # a 3-D batch too
        for k in (1, 5, 9):
            got, (values_k, indices_k) = largest(rows, k), reference(rows, k)
            assert torch.equal(got.indices, indices_k), (rows.dtype, k)
            assert torch.allclose(got.values, values_k, equal_nan=True), (rows.dtype, k)  # exact but NaN


def test_the_lens_with_span_maxima_matches_naive(monkeypatch):
    """The lens's overlap through ``largest``'s span path (spans of 2 entries, so that a tiny
    vocabulary of 64 takes it) against the naive float64 lens."""
    from effdepth_core import topk as topk_module

    monkeypatch.setattr(topk_module, "_SPAN", 2)
    monkeypatch.setattr(topk_module, "_SPAN_MIN_VOCAB", 0)
    calls = []
    sort = torch.Tensor.sort
    monkeypatch.setattr(torch.Tensor, "sort", lambda self, *a, **k: calls.append(self.shape[-1]) or sort(self, *a, **k))
    loaded = make_tiny("llama")
    prompts = random_prompts(LENGTHS)
    expected = naive_lens(loaded, prompts)
    got = _as_dict(logit_lens(loaded, prompts, batch_size=3))
    assert calls and max(calls) < loaded.vocab_size  # sorted: only span maxima and candidates
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=5e-5), key


def test_a_shared_pass_equals_each_probe_alone_bit_for_bit(tiny, monkeypatch):
    """The residual cosine (sublayer writes), the one-pass lens (kept residuals, decoded after the
    pass) and the residual norm read during one forward pass per batch give the same bits as each
    run alone, on every tiny architecture: the hooks only read, and the batches are the same."""
    from effdepth_core.measurement.probes.cosine import residual_cosine_part
    from effdepth_core.measurement.probes.norm import residual_norm, residual_norm_part
    from effdepth_core.measurement.probes.shared import activations
    from effdepth_core.measurement.probes.shared.lens import logit_lens_part

    prompts = random_prompts(LENGTHS)  # two batches of at most 3
    alone = [residual_cosine(tiny, prompts, batch_size=3), logit_lens(tiny, prompts, batch_size=3)]
    alone.append(residual_norm(tiny, prompts, batch_size=3))
    passes = []
    real_forward = activations.forward
    monkeypatch.setattr(activations, "forward", lambda *a, **k: passes.append(1) or real_forward(*a, **k))
    parts = [residual_cosine_part(tiny), logit_lens_part(tiny), residual_norm_part(tiny)]
    together = activations.shared_pass_means(tiny, prompts, parts, batch_size=3)
    assert len(passes) == 2  # one forward pass per batch for all three
    for one, shared in zip(alone, together, strict=True):
        assert one.equals(shared)


def test_the_lens_with_logits_far_below_their_peak_matches_naive():
    """Logits spread over hundreds (the head scaled up, as smollm2-135m's layer 0 is): the lens
    holds exp's argument above -87 (a CPU's exp slows ~40x below it), which no float32 sum can
    see beside the peak's 1 — the float64 lens agrees, and the spread is really there."""
    loaded = make_tiny("llama")
    with torch.no_grad():
        loaded.lm_head.weight.mul_(60.0)
    prompts = random_prompts(LENGTHS)
    with torch.no_grad():
        out = loaded.model(input_ids=prompts[0][None], output_hidden_states=True)
        spread = loaded.lm_head(loaded.final_norm(out.hidden_states[0]))[0]
    assert float((spread.amax(-1) - spread.amin(-1)).min()) > 200  # entries held at the floor
    expected = naive_lens(loaded, prompts)
    got = _as_dict(logit_lens(loaded, prompts, batch_size=3))
    scale = max(abs(v) for (_, metric), v in expected.items() if metric == "kl")
    for key, value in expected.items():
        # float32 KL of logits in the hundreds rounds at ~1e-7 of their size per term: 1e-5 of
        # the largest KL, while a floor that mattered would move KL by whole units
        assert got[key] == pytest.approx(value, abs=1e-5 * scale), key


def test_the_lens_kernel_on_wide_rows_matches_float64_and_names_a_minus_inf_logit():
    """``lens_token_metrics`` on 4,096-wide rows (``largest``'s span path, as real vocabularies take
    it; its row maxima are the softmax's peaks) spread over hundreds, in 3-row blocks of 5-row
    chunks, against float64 KL and top-k overlap; a row holding a -inf or a NaN logit gives NaN
    (which ``require_finite`` names), not a KL clamped to 0 or a shape error from the top-k."""
    from types import SimpleNamespace

    from effdepth_core.measurement.probes.shared.lens import lens_token_metrics

    torch.manual_seed(0)
    logits = torch.randn(11, 4096) * 60  # [token, vocab]: rows spanning ~500
    final_logp = torch.log_softmax(torch.randn(11, 4096) * 3, -1)
    final_top = torch.topk(final_logp, 5).indices
    loaded = SimpleNamespace(head_into=lambda residual, out, dtype: out[: len(residual)].copy_(residual))
    buffers = (torch.empty(5, 4096), torch.empty(3, 4096))
    got = lens_token_metrics(loaded, logits, final_logp, final_top, buffers)
    logq = torch.log_softmax(logits.double(), -1)
    kl = (logq.exp() * (logq - final_logp.double())).sum(-1)
    overlap = [
        len(set(a.tolist()) & set(b.tolist())) / 5 for a, b in zip(logits.topk(5).indices, final_top, strict=True)
    ]
    # float32 over 4,096 terms of logits in the hundreds: 1e-5 of the largest KL
    assert got[:, 0].tolist() == pytest.approx(kl.tolist(), abs=1e-5 * float(kl.abs().max()))
    assert got[:, 1].tolist() == overlap
    logits[4, 7], logits[8, 100] = -float("inf"), float("nan")
    got = lens_token_metrics(loaded, logits, final_logp, final_top, buffers)
    assert got[[4, 8], 0].isnan().all() and got[[0, 1, 2, 3, 5, 6, 7, 9, 10], 0].isfinite().all()
