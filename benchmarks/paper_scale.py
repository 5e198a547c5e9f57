"""Every probe at the paper's model sizes: random-weight copies of Qwen2.5-1.5B, 7B, 14B and 32B
(the paper's configurations, no download: weights do not change speed), in bfloat16, against the
device's own measured matrix-multiply rate.

    python benchmarks/paper_scale.py --device cpu           # 1.5B (what fits a 24 GB CPU; --sizes 7B too)
    python benchmarks/paper_scale.py --device cuda          # all four sizes on a GPU
    python benchmarks/paper_scale.py --tiny                 # a tiny Qwen2 configuration (the suite runs this)

For each size and probe it prints the median seconds of ``--repeats`` runs (5) after a warm-up,
with the fastest and slowest, the peak memory (GPU: allocated; CPU: resident
set), the operations the probe needs (``needed_flops``: matrix products and attention, counted
from the configuration for exactly the work asked), the achieved rate, and that rate as a share of
the device's bfloat16 matrix-multiply rate measured in the same run on the model's own shapes (the
MLP's up-projection over a batch of tokens, and the head over one prompt). The causal probes are
also timed through the published loops (effdepth's ``method="slow"``, the published scripts'
algorithm: a full forward per intervention, 16 α values per pass for integrated gradients), with
the loop ÷ the fast path. The prompts are random token ids of the stated lengths: GSM8K-like
(150 tokens) for the residual cosine, the logit lens and skipping; shorter answer-bearing prompts
(``--answer-tokens`` answer tokens at the end) for erasure and integrated gradients, whose work
grows as T² and T·L·steps.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from measure import as_published, repeated

from effdepth_core.errors import EffdepthWarning
from effdepth_core.measurement.probes import (
    erasure_map,
    integrated_gradients,
    logit_lens,
    residual_cosine,
    skip_effects,
)
from effdepth_core.models import wrap_model

# the hub configurations (config.json of Qwen/Qwen2.5-{1.5B,7B,14B,32B}): layers, widths, heads,
# KV heads, intermediate size, vocabulary, RoPE, norm epsilon, tied head (the 1.5B only)
CONFIGS = {
    "1.5B": dict(num_hidden_layers=28, hidden_size=1536, intermediate_size=8960, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6),
    "7B": dict(num_hidden_layers=28, hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, rms_norm_eps=1e-6),
    "14B": dict(num_hidden_layers=48, hidden_size=5120, intermediate_size=13824, num_attention_heads=40,
                num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False, rms_norm_eps=1e-5),
    "32B": dict(num_hidden_layers=64, hidden_size=5120, intermediate_size=27648, num_attention_heads=40,
                num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False, rms_norm_eps=1e-5),
    # smollm2-135m's configuration (Llama): the one model measured on a GPU before (gpu_scale.py)
    "135M": dict(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                 num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rms_norm_eps=1e-5,
                 rope_theta=100000.0, max_position_embeddings=8192),
    "tiny": dict(num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False, rms_norm_eps=1e-6),
}  # fmt: skip
COMMON = dict(rope_theta=1_000_000.0, max_position_embeddings=32768, hidden_act="silu")
PROBES = ("cosine", "lens", "skip", "erasure", "igrad")


@dataclass(frozen=True)
class Work:
    """Operations of the probes' arithmetic (multiply-add = 2), from a Qwen2 configuration."""

    layers: int
    d: int
    d_ff: int
    kv: int  # key/value width: KV heads × head size
    vocab: int

    @classmethod
    def of(cls, config) -> Work:
        head = config.hidden_size // config.num_attention_heads
        return cls(
            config.num_hidden_layers,
            config.hidden_size,
            config.intermediate_size,
            config.num_key_value_heads * head,
            config.vocab_size,
        )

    def layer(self, queries: int, keys: float) -> float:
        """One decoder layer on ``queries`` tokens attending ``keys`` keys each (on average)."""
        projections = 2 * queries * (2 * self.d * self.d + 2 * self.d * self.kv + 3 * self.d * self.d_ff)
        return projections + 4 * queries * keys * self.d  # scores and the weighted values

    def stack(self, tokens: int, layers: int | None = None) -> float:
        """``layers`` (default all) layers over a causal prompt of ``tokens``."""
        return (self.layers if layers is None else layers) * self.layer(tokens, (tokens + 1) / 2)

    def head(self, tokens: int) -> float:
        return 2 * tokens * self.d * self.vocab

    # --- what each probe needs, per prompt of T tokens (the fast paths' algorithms)
    def cosine(self, t: int) -> float:
        return self.stack(t)

    def lens(self, t: int) -> float:  # a pass for p (its head on every token), a traced pass, L+1 decodes
        return 2 * self.stack(t) + (self.layers + 2) * self.head(t)

    def skip(self, t: int, positions: int) -> float:  # per position, each layer's skip replayed from it on
        replays = sum(self.stack(t, self.layers - s) for s in range(self.layers))
        return self.stack(t) + positions * (replays + self.layers * self.head(t // 2))

    def erasure(self, t: int, answer: int) -> float:  # every (layer, position): layers l.. over positions t..
        replays = sum(
            (self.layers - layer) * self.layer(t - p, (t + p) / 2) for layer in range(self.layers + 1) for p in range(t)
        )
        return self.stack(t) + replays + (self.layers + 1) * t * self.head(answer)

    def igrad(self, t: int, answer: int, steps: int, layers: list[int]) -> float:  # forward + backward ≈ 3 passes
        return sum(3 * steps * (self.stack(t, self.layers - 1 - layer) + self.head(answer)) for layer in layers)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    else:  # Linux: writing 5 resets the resident set's high-water mark (VmHWM)
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass


def peak_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def gemm_rate(
    device: str, m: int, k: int, n: int, seconds: float = 0.3, windows: int = 3, dtype: torch.dtype = torch.bfloat16
) -> float:
    """FLOP/s of a bfloat16 ``[m, k]`` input times a ``[n, k]`` weight (``F.linear``, the layout and
    call a model's layers use) on ``device``: after three warm-up products, the best of ``windows``
    timed windows of at least ``seconds`` each (a rate the hardware reaches, not an average)."""
    a = torch.randn(m, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype)
    best = 0.0
    with torch.inference_mode():
        for _ in range(3):
            torch.nn.functional.linear(a, w)
        for _ in range(windows):
            synchronize(device)
            count, started = 0, time.perf_counter()
            while True:
                torch.nn.functional.linear(a, w)
                count += 1
                if count % 4 == 0:
                    synchronize(device)
                    if time.perf_counter() - started >= seconds:
                        break
            best = max(best, 2 * m * k * n * count / (time.perf_counter() - started))
    return best


def profile(device: str, name: str, fn: Callable[[], object]) -> None:
    """The operations that took the time in one call of ``fn`` (torch.profiler, top 8 by self time)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profiler(activities=activities) as prof:
        fn()
        synchronize(device)
    key = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    print(f"-- profile of {name}:\n" + prof.key_averages().table(sort_by=key, row_limit=8, max_name_column_width=40))


def build(size: str, device: str, dtype: torch.dtype = torch.bfloat16):
    """A random-weight Qwen2 model of ``size``'s configuration in ``dtype`` on ``device``."""
    settings = {**COMMON, **CONFIGS[size]}
    if size == "135M":
        config = transformers.LlamaConfig(**settings)
    else:
        config = transformers.Qwen2Config(**settings, use_sliding_window=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return wrap_model(model, name=f"random {size}")


def prompts(n: int, tokens: int, vocab: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (tokens,), generator=generator) for _ in range(n)]


def measure_size(size: str, args: argparse.Namespace) -> None:
    device = args.device
    started = time.perf_counter()
    dtype = getattr(torch, args.dtype)
    loaded = build(size, device, dtype)
    work = Work.of(loaded.model.config)
    built = time.perf_counter() - started
    lens_prompts = prompts(args.n, args.tokens, work.vocab, seed=1)
    answered = [(ids, args.answer_tokens) for ids in prompts(1, args.short_tokens, work.vocab, seed=2)]
    long_prompt = lens_prompts[:1]
    spread = work.layers if size == "135M" else args.igrad_layers  # 135M: every layer, as gpu_scale.py
    igrad_layers = sorted({round(i * work.layers / spread) for i in range(spread)})
    rate = max(
        gemm_rate(device, args.n * args.tokens, work.d, work.d_ff, dtype=dtype),  # the MLP's up-projection, a batch
        gemm_rate(device, args.tokens, work.d, work.vocab, dtype=dtype),  # the head over one prompt
    )
    params = sum(p.numel() for p in loaded.model.parameters()) / 1e9
    title = "smollm2-135m" if size == "135M" else f"Qwen2.5-{size}"
    print(
        f"\n== {title} (random weights, {params:.2f}B parameters, L={work.layers}, d={work.d}, "
        f"vocab={work.vocab}) on {device}: built in {built:.1f} s; {args.dtype} matmul rate at its shapes "
        f"{rate / 1e12:.2f} TFLOP/s",
        flush=True,
    )
    igrad = dict(
        igrad_steps=args.igrad_steps, igrad_quadrature="riemann", igrad_baseline="hidden-mean", layers=igrad_layers
    )

    probes: list[tuple[str, str, Callable[[str], object], float]] = [
        ("cosine", f"{args.n}×{args.tokens}", lambda m: residual_cosine(loaded, lens_prompts, batch_size=args.n),
         args.n * work.cosine(args.tokens)),
        ("lens", f"{args.n}×{args.tokens}", lambda m: logit_lens(loaded, lens_prompts, batch_size=args.n),
         args.n * work.lens(args.tokens)),
        ("skip", f"1×{args.tokens}, {args.skip_positions} positions",
         lambda m: skip_effects(loaded, long_prompt, skip_positions=args.skip_positions, skip_parts=("layer",),
                                skip_variants=("future",), method=m),
         work.skip(args.tokens, min(args.skip_positions, len(range(8, args.tokens - 4, 8))))),
        ("erasure", f"1×{args.short_tokens}", lambda m: erasure_map(loaded, answered, method=m),
         work.erasure(args.short_tokens, args.answer_tokens)),
        ("igrad", f"1×{args.short_tokens}, Riemann-{args.igrad_steps}, layers {','.join(map(str, igrad_layers))}",
         lambda m: as_published(loaded, m, lambda: integrated_gradients(loaded, answered, method=m, slow_block=16,
                                                                        **igrad)),
         work.igrad(args.short_tokens, args.answer_tokens, args.igrad_steps, igrad_layers)),
    ]  # fmt: skip
    print(
        f"{'probe':11s} {'prompts':34s} {'median s':>9s} {'min–max':>13s} {'peak MB':>9s} {'FLOP':>9s} "
        f"{'TFLOP/s':>8s} {'of rate':>8s}  published loop (median [min–max]) ÷ the fast path's median"
    )
    sync = lambda: synchronize(device)  # noqa: E731
    fast_medians: dict[str, float] = {}
    for name, shape, fn, flops in probes:
        if name not in args.probes:
            continue
        if args.profile:
            fn("fast")
            profile(device, name, lambda fn=fn: fn("fast"))
        reset_peak(device)
        timing = repeated(lambda fn=fn: fn("fast"), args.repeats, warmup=1, sync=sync)
        peak = peak_mb(device)
        fast_medians[name] = timing.median
        achieved = flops / timing.median
        line = (
            f"{name:11s} {shape:34s} {timing.median:9.3f} {f'{timing.low:.3f}–{timing.high:.3f}':>13s} {peak:9.0f} "
            f"{flops:9.2e} {achieved / 1e12:8.3f} {achieved / rate:8.1%}"
        )
        if name in ("skip", "erasure", "igrad") and name in args.published:
            if name == "igrad":  # warmed up on one layer: a whole published run would double its cost
                first = {**igrad, "layers": [0], "method": "slow", "slow_block": 16}
                as_published(loaded, "slow", lambda first=first: integrated_gradients(loaded, answered, **first))
            slow = repeated(lambda fn=fn: fn("slow"), args.published_repeats, warmup=int(name != "igrad"), sync=sync)
            line += f"  {slow} = {slow.median / timing.median:.2f}×"
        if name == "igrad" and args.rows_before:  # the fast path as it was: 16 α rows per pass
            before = repeated(
                lambda: integrated_gradients(loaded, answered, max_rows=16, **igrad), args.repeats, sync=sync
            )
            line += f"; 16 rows per pass {before} = {before.median / timing.median:.2f}×"
        print(line, flush=True)
        if name == "igrad" and name in args.published and args.igrad_default_panels:
            # the default rule (adaptive, 1 % completeness) against the same published Riemann loop
            for panels in args.igrad_default_panels:
                frames = []

                def default_rule(panels=panels, frames=frames):
                    frames[:] = [integrated_gradients(loaded, answered, layers=igrad_layers, igrad_panels=panels)]

                timing = repeated(default_rule, args.repeats, warmup=1, sync=sync)
                frame = frames[0]
                evals = frame.filter(metric="grad_evals")["value"].to_list()
                met = int(sum(frame.filter(metric="tolerance_met")["value"].to_list()))
                print(
                    f"{'igrad-rule':11s} {f'adaptive 1 %, panels {panels}':34s} {timing.median:9.3f} "
                    f"{f'{timing.low:.3f}–{timing.high:.3f}':>13s}  gradient evaluations per layer "
                    f"{','.join(str(int(e)) for e in evals)}; tolerance met in {met}/{len(evals)} layers; "
                    f"the published Riemann-{args.igrad_steps} loop ÷ this = {slow.median / timing.median:.2f}×",
                    flush=True,
                )


# the paper's grid (Table 1): per size three models (instruct, base or math, R1-distill), cosine and
# the logit lens on 10 HellaSwag, 10 GSM8K and 5 AIME24 prompts (AIME24 kept to <= 400 tokens)
PAPER_TASKS = (("hellaswag", 10, None), ("gsm8k", 10, None), ("aime24", 5, 400))


def paper_grid() -> None:
    """The paper's whole grid on one H200, from the rates this script measured there (the cost
    model's ``GPU_RATES``) and the tasks' real prompts (tokens estimated as characters / 4)."""
    from effdepth_book.cost import gpu_rate, task_lengths
    from effdepth_core.measurement import registry
    from effdepth_core.measurement.probes.spec import Shape
    from effdepth_core.settings import RunSettings

    print("\nThe paper's grid (12 models × HellaSwag 10, GSM8K 10, AIME24 5 prompts; cosine + logit lens) on one H200:")
    total = 0.0
    for size in ("1.5B", "7B", "14B", "32B"):
        config = transformers.Qwen2Config(**{**COMMON, **CONFIGS[size]})
        with torch.device("meta"):
            n_params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())
        shape = Shape(config.num_hidden_layers, config.hidden_size, config.vocab_size, n_params)
        seconds = 0.0
        for task, n, max_tokens in PAPER_TASKS:
            settings = RunSettings("paper", task, n=n, max_tokens=max_tokens)
            lengths = task_lengths(settings)
            for probe in ("cosine", "logit_lens"):
                seconds += registry.get(probe).work(shape, settings, lengths) * gpu_rate(probe, n_params)[0]
        total += 3 * seconds
        print(f"  Qwen2.5-{size}: 3 models × {seconds:.1f} s = {3 * seconds:.1f} s of probe time")
    print(f"  in all {total:.0f} s of probe time (loading each model's weights comes on top)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--sizes", default=None, help="comma-separated of 135M,1.5B,7B,14B,32B (default: cuda all, cpu 1.5B)"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="a tiny configuration with tiny inputs (exercises the script)"
    )
    parser.add_argument("--n", type=int, default=None, help="prompts for cosine and the lens (default: cuda 8, cpu 2)")
    parser.add_argument("--tokens", type=int, default=150, help="GSM8K-like prompt length (default 150)")
    parser.add_argument(
        "--short-tokens", type=int, default=None, help="erasure and igrad prompt length (default: cuda 48, cpu 12)"
    )
    parser.add_argument(
        "--answer-tokens", type=int, default=4, help="answer tokens at the end of that prompt (default 4)"
    )
    parser.add_argument("--skip-positions", type=int, default=None, help="skip positions (default: cuda 4, cpu 1)")
    parser.add_argument("--igrad-steps", type=int, default=None, help="Riemann steps (default: cuda 256, cpu 16)")
    parser.add_argument(
        "--igrad-layers", type=int, default=None, help="layers attributed, evenly spaced (default: cuda 4, cpu 2)"
    )
    parser.add_argument("--no-published", action="store_true", help="skip the published loops")
    parser.add_argument("--published", default="skip,erasure,igrad", help="probes whose published loops are timed")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs after a warm-up (default 5)")
    parser.add_argument(
        "--published-repeats", type=int, default=None, help="published loops' timed runs (default: --repeats)"
    )
    parser.add_argument(
        "--igrad-default-panels",
        default=None,
        help="also time the default adaptive rule at these comma-separated panel counts against the published loop",
    )
    parser.add_argument("--probes", default=",".join(PROBES), help=f"which of {','.join(PROBES)} (default all)")
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's top operations per probe")
    parser.add_argument("--rows-before", action="store_true", help="also time igrad at 16 α rows per pass")
    parser.add_argument(
        "--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="the models' dtype (default bfloat16)"
    )
    parser.add_argument(
        "--tf32", action="store_true", help="float32 matrix products on a GPU's tensor cores (TF32), as printed"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads on a CPU (default: torch's)")
    parser.add_argument(
        "--paper-grid",
        action="store_true",
        help="print the paper's grid's GPU time from the measured rates; measure nothing",
    )
    args = parser.parse_args(argv)  # fmt: skip
    for name in (
        "n",
        "tokens",
        "short_tokens",
        "answer_tokens",
        "skip_positions",
        "igrad_steps",
        "igrad_layers",
        "threads",
        "repeats",
        "published_repeats",
    ):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.short_tokens is not None and args.answer_tokens >= args.short_tokens:
        parser.error(f"--answer-tokens ({args.answer_tokens}) must be fewer than --short-tokens ({args.short_tokens})")
    if args.tokens < 16:
        parser.error(f"--tokens must be at least 16 (skip positions start at token 8), got {args.tokens}")
    if args.tiny and (args.sizes or args.n or args.tokens != 150):
        parser.error("--tiny sets its own sizes, prompts and lengths: leave out --sizes, --n and --tokens")
    if args.tiny:
        args.tokens, args.short_tokens, args.n, args.igrad_steps = 24, 10, 2, 8
        sizes = ["tiny"]
    else:
        if args.sizes is not None and not args.sizes.strip():
            parser.error("--sizes is empty; give some of 135M, 1.5B, 7B, 14B, 32B")
        sizes = (args.sizes or ("135M,1.5B,7B,14B,32B" if args.device.startswith("cuda") else "1.5B")).split(",")
    unknown = [s for s in sizes if s not in CONFIGS]
    if unknown:
        parser.error(f"unknown size(s) {', '.join(unknown)}; choose from 135M, 1.5B, 7B, 14B, 32B")
    args.probes = args.probes.split(",")
    args.published = [] if args.no_published else [p for p in args.published.split(",") if p]
    if set(args.published) - {"skip", "erasure", "igrad"}:
        parser.error(f"--published takes skip, erasure, igrad; got {','.join(args.published)}")
    if args.published_repeats is None:
        args.published_repeats = args.repeats
    try:
        args.igrad_default_panels = [int(p) for p in (args.igrad_default_panels or "").split(",") if p]
    except ValueError:
        parser.error(f"--igrad-default-panels takes whole numbers, got {args.igrad_default_panels}")
    if any(p < 1 for p in args.igrad_default_panels):
        parser.error("--igrad-default-panels must be at least 1")
    if set(args.probes) - set(PROBES):
        unknown_probes = ", ".join(sorted(set(args.probes) - set(PROBES)))
        parser.error(f"unknown probe(s) {unknown_probes} in --probes; choose from {', '.join(PROBES)}")
    if args.paper_grid:
        paper_grid()
        return
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("paper_scale: no CUDA GPU on this machine: nothing measured (run it where one is)", file=sys.stderr)
        sys.exit(2)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    # bfloat16 rounding leaves integrated gradients short of their completeness tolerance on random
    # weights: the timing is the point here, not the attributions
    warnings.filterwarnings("ignore", category=EffdepthWarning)
    defaults = dict(n=(8, 2), short_tokens=(48, 12), skip_positions=(4, 1), igrad_steps=(256, 16), igrad_layers=(4, 2))
    for name, (on_gpu, on_cpu) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if cuda else on_cpu)
    where = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} thread(s)"
    print(
        f"paper_scale on {where} (torch {torch.__version__}, transformers {transformers.__version__}); {args.dtype}"
        + (" (TF32 matrix products)" if args.tf32 else "")
    )
    for size in sizes:
        measure_size(size, args)
        if cuda:
            torch.cuda.empty_cache()  # the model went with measure_size's frame
    sys.stdout.flush()


if __name__ == "__main__":
    main()
