"""Tiny random models of every supported architecture, built in memory, and the real-model fixture."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from effdepth_core.models import LoadedModel, wrap_model

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # pytest -n N: the cores shared out, not oversubscribed
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

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


def _llama_mlp(layer, h, attn, config):
    return layer.mlp(layer.post_attention_layernorm(h + attn))


def _post_norm_mlp(layer, h, attn, config):  # Gemma 2/3: norms before and after the MLP
    return layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h + attn)))


@dataclass(frozen=True)
class Arch:
    """One tiny architecture and how an independent computation reads it: ``config`` overrides
    (sliding windows shorter than the prompts, soft-capping on); ``mlp(layer, h, attn, config)``
    recomputes what the MLP sublayer adds to the residual by the architecture's own formula;
    ``logits(logits, config)`` is what its forward does after ``lm_head``; ``write_scale(config)``
    multiplies what each sublayer's module outputs (a residual multiplier); ``attn_write(output, h)``
    and ``mlp_write(output, h + a)`` read a sublayer module's output as its write (BLOOM's include the
    residual they are given; OPT's MLP returns ``[batch · token, d]``)."""

    config: dict = field(default_factory=dict)
    mlp: Callable = _llama_mlp
    logits: Callable = lambda logits, config: logits
    write_scale: Callable = lambda config: 1.0
    attn_write: Callable = lambda output, h: output
    mlp_write: Callable = lambda output, h: output


def _softcap(logits, config):
    cap = config.final_logit_softcapping
    return torch.tanh(logits / cap) * cap


_GEMMA = {"head_dim": 8, "sliding_window": 4, "final_logit_softcapping": 5.0, "query_pre_attn_scalar": 8}
ARCHS: dict[str, Arch] = {
    "llama": Arch(),
    "qwen2": Arch(),
    "qwen3": Arch({"head_dim": 8}),
    "mistral": Arch({"sliding_window": 5}),
    "phi3": Arch(),
    "gemma2": Arch(_GEMMA, mlp=_post_norm_mlp, logits=_softcap),
    "gemma3_text": Arch(_GEMMA, mlp=_post_norm_mlp, logits=_softcap),
    "olmo2": Arch(mlp=lambda layer, h, attn, config: layer.post_feedforward_layernorm(layer.mlp(h + attn))),
    "gpt_neox": Arch(  # parallel: the MLP reads h_l, not h_l + a_l
        {"use_parallel_residual": True}, mlp=lambda layer, h, attn, config: layer.mlp(layer.post_attention_layernorm(h))
    ),
    "gpt2": Arch(  # Conv1D sublayers
        {"n_inner": 64, "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0},
        mlp=lambda layer, h, attn, config: layer.mlp(layer.ln_2(h + attn)),
    ),
    "mixtral": Arch({"num_local_experts": 4, "num_experts_per_tok": 2}),  # a routed mixture of experts
    "qwen3_moe": Arch(
        {
            "head_dim": 8,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
    ),
    "gpt_neox_sequential": Arch({"use_parallel_residual": False}),
    # parallel blocks whose head scales the logits (Cohere 2 with sliding-window layers too)
    "cohere": Arch(
        {"logit_scale": 0.0625},
        mlp=lambda layer, h, attn, config: layer.mlp(layer.input_layernorm(h)),
        logits=lambda logits, config: logits * config.logit_scale,
    ),
    "cohere2": Arch(
        {"logit_scale": 0.0625, "sliding_window": 4, "head_dim": 8},
        mlp=lambda layer, h, attn, config: layer.mlp(layer.input_layernorm(h)),
        logits=lambda logits, config: logits * config.logit_scale,
    ),
    # realistic multipliers: each write × 0.5, the logits ÷ 4
    "granite": Arch(
        {"residual_multiplier": 0.5, "logits_scaling": 4.0},
        mlp=lambda layer, h, attn, config: config.residual_multiplier * _llama_mlp(layer, h, attn, config),
        logits=lambda logits, config: logits / config.logits_scaling,
        write_scale=lambda config: config.residual_multiplier,
    ),
    # a sublayer given the residual returns it with its write (the MLP's oracle passes it zero)
    "bloom": Arch(
        {"hidden_dropout": 0.0, "attention_dropout": 0.0},
        mlp=lambda layer, h, attn, config: layer.mlp(layer.post_attention_layernorm(h + attn), torch.zeros_like(h)),
        attn_write=lambda output, h: output - h,
        mlp_write=lambda output, h: output - h,
    ),
    # an MLP of bare linear layers run on [batch · token, d] (its write flattened, viewed back)
    "opt": Arch(
        {"ffn_dim": 64, "word_embed_proj_dim": 32, "dropout": 0.0, "attention_dropout": 0.0},
        mlp=lambda layer, h, attn, config: layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(h + attn)))),
        mlp_write=lambda output, h: output.view(h.shape),
    ),
}


def arch_of(loaded: LoadedModel) -> Arch:
    """The ``ARCHS`` entry of a model ``make_tiny`` built."""
    return ARCHS[loaded.name.removeprefix("tiny-")]


def make_tiny(arch: str, seed: int = 0) -> LoadedModel:
    """A 3-layer random model of ``arch`` in float32 (weights deterministic for ``seed``)."""
    model_type = arch.removesuffix("_sequential")
    kwargs = {**COMMON, **ARCHS[arch].config}
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
