"""Tiny random models of every supported architecture, built in memory, and the real-model fixture."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from effdepth_core.models import LoadedModel, wrap_model

VOCAB = 64
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# per architecture: config overrides (sliding windows shorter than the prompts, soft-capping on)
ARCHS: dict[str, dict] = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 8},
    "mistral": {"sliding_window": 5},
    "phi3": {},
    "gemma2": {"head_dim": 8, "sliding_window": 4, "final_logit_softcapping": 5.0, "query_pre_attn_scalar": 8},
    "gemma3_text": {"head_dim": 8, "sliding_window": 4, "final_logit_softcapping": 5.0, "query_pre_attn_scalar": 8},
    "olmo2": {},
    "gpt_neox": {"use_parallel_residual": True},
    "gpt2": {"n_inner": 64, "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0},  # Conv1D sublayers
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},  # a routed mixture of experts
    "qwen3_moe": {
        "head_dim": 8,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    "gpt_neox_sequential": {"use_parallel_residual": False},
    "cohere": {"logit_scale": 0.0625},  # a parallel block; its head scales the logits
    "cohere2": {"logit_scale": 0.0625, "sliding_window": 4, "head_dim": 8},  # and sliding-window layers
    # realistic multipliers: each write × 0.5, the logits ÷ 4
    "granite": {"residual_multiplier": 0.5, "logits_scaling": 4.0},
}


def make_tiny(arch: str, seed: int = 0) -> LoadedModel:
    """A 3-layer random model of ``arch`` in float32 (weights deterministic for ``seed``)."""
    model_type = arch.removesuffix("_sequential")
    kwargs = {**COMMON, **ARCHS[arch]}
    if model_type == "gpt_neox":
        kwargs.pop("num_key_value_heads")
    config = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # norms start at identity; perturb them so their weights matter
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.3 * torch.randn_like(param))
    return wrap_model(model, tokenizer=None, name=f"tiny-{arch}")


@pytest.fixture(params=sorted(ARCHS))
def tiny(request) -> LoadedModel:
    return make_tiny(request.param)


def random_prompts(lengths: list[int], seed: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=generator) for n in lengths]


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    """The embedded default model, fetched by .ci/run; never silently skipped in CI."""
    from effdepth_core.models import load_model
    from effdepth_core.zoo import is_cached

    if not is_cached("smollm2-135m") and os.environ.get("EFFDEPTH_ALLOW_FETCH", "1") == "0":
        pytest.skip("smollm2-135m is not cached and EFFDEPTH_ALLOW_FETCH=0 forbids fetching it")
    return load_model("smollm2-135m", device="cpu", dtype="float32")


def char_tokenizer():
    """A character-level fast tokenizer over VOCAB ids (enough to exercise text → ids → probes)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = " abcdefghijklmnopqrstuvwxyz0123456789+*=.,?:!'\"$\\{}[]()-_\n"
    vocab = {"[PAD]": 0, "[BOS]": 1, "[UNK]": 2}
    vocab.update({c: i + 3 for i, c in enumerate(dict.fromkeys(chars)) if i + 3 < VOCAB})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")


def save_tiny_dir(path, arch: str = "llama", poison: bool = False):
    """Save a tiny random model and tokenizer as a local HF directory; ``poison`` puts a NaN in layer 1."""
    loaded = make_tiny(arch)
    if poison:
        with torch.no_grad():
            loaded.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    loaded.model.save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return save_tiny_dir(tmp_path_factory.mktemp("tiny-llama"))
