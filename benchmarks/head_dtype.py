"""The logit lens's head product in bfloat16 against float32 on a CPU (issue 49, item 1): the lens's
seconds with each, and what bfloat16 changes — max |ΔKL| over every token and layer, the token-layer
top-k overlaps that differ, each lens ED and its continuous statistics (the centroid, the primary
statistic, and the crossing at the default threshold) — on GSM8K and HellaSwag prompts of the book's
models found offline. Only the per-layer head matmul changes (``head_dtype``): residuals, norm,
softmax, KL, top-k and the final distribution p stay float32.

    OPENBLAS_NUM_THREADS=1 python benchmarks/head_dtype.py [--n 3] [--time-tokens 48] [--repeats 5]

Timing: one thread, the lens on the first ``--time-tokens`` tokens of one GSM8K prompt, a warm-up
then ``--repeats`` calls per dtype, alternated (float32, bfloat16, float32, …) so that background
load affects both alike; median and min–max printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from effdepth_core.devices import fast_bfloat16
from effdepth_core.measurement.probes import logit_lens
from effdepth_core.measurement.probes.shared import lens as lens_module
from effdepth_core.measurement.probes.shared.lens import (
    centroid_kl,
    centroid_overlap,
    crossing_kl,
    crossing_overlap,
    ed_kl,
    ed_overlap,
)
from effdepth_core.measurement.probes.shared.reduce import token_weighted_mean
from effdepth_core.models import load_model
from effdepth_core.task_loading import load_task

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
TASKS = ("gsm8k", "hellaswag")
CACHE = Path.home() / ".cache" / "effdepth" / "models"


def lens_with_tokens(loaded, prompts, head_dtype: str) -> tuple[pl.DataFrame, torch.Tensor]:
    """``logit_lens`` and every token-layer's (KL, overlap) it averaged, in the order computed
    (the same order for both dtypes: same prompts, batches and layers)."""
    seen: list[torch.Tensor] = []
    original = lens_module.lens_token_metrics

    def recording(*args, **kwargs):
        values = original(*args, **kwargs)
        seen.append(values.detach().cpu().clone())
        return values

    lens_module.lens_token_metrics = recording
    try:
        frame = logit_lens(loaded, prompts, progress=False, head_dtype=head_dtype)
    finally:
        lens_module.lens_token_metrics = original
    return frame, torch.cat(seen)


def statistics_of(frame: pl.DataFrame) -> dict[str, float | None]:
    """Each lens rule's ED, centroid and crossing from the token-weighted mean curves."""
    mean = token_weighted_mean(frame).sort("layer")
    kl = mean.filter(metric="kl")["value"].to_numpy()
    ov = mean.filter(metric="overlap")["value"].to_numpy()
    return {
        "ED kl": ed_kl(kl),
        "ED overlap": ed_overlap(ov),
        "centroid kl": centroid_kl(kl),
        "centroid overlap": centroid_overlap(ov),
        "crossing kl": crossing_kl(kl),
        "crossing overlap": crossing_overlap(ov),
    }


def shown(value) -> str:
    return "—" if value is None else f"{value}" if isinstance(value, int) else f"{value:.3f}"


def timed(loaded, prompt: torch.Tensor, repeats: int) -> dict[str, list[float]]:
    """Seconds of the lens on one prompt per dtype: one warm-up each, then alternated repeats."""
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for dtype in times:
        logit_lens(loaded, [prompt], progress=False, head_dtype=dtype)
    for _ in range(repeats):
        for dtype in times:
            started = time.perf_counter()
            logit_lens(loaded, [prompt], progress=False, head_dtype=dtype)
            times[dtype].append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--n", type=int, default=3, help="prompts of each task (default 3)")
    parser.add_argument("--time-tokens", type=int, default=48, help="tokens of the timed prompt (default 48)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, fast bfloat16: {fast_bfloat16('cpu')}; "
        f"n = {args.n} prompts per task; timing: {args.time_tokens} tokens, warm-up + {args.repeats} repeats",
        flush=True,
    )
    for model in args.models.split(","):
        if not (CACHE / model).is_dir():
            print(f"\n{model}: not cached under {CACHE} (offline): skipped", flush=True)
            continue
        loaded = load_model(model, device="cpu", dtype="float32", progress=False)
        print(f"\n{model}: {loaded.n_layers} layers, d_model {loaded.d_model}, vocab {loaded.vocab_size}", flush=True)
        gsm8k = load_task("gsm8k", n=1, seed=0)[0].prompt
        prompt = loaded.encode(gsm8k)[: args.time_tokens]
        times = timed(loaded, prompt, args.repeats)
        for dtype, values in times.items():
            print(
                f"  lens time {dtype:8s}: median {statistics.median(values):7.2f} s "
                f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} repeats)",
                flush=True,
            )
        ratio = statistics.median(times["float32"]) / statistics.median(times["bfloat16"])
        print(f"  float32 ÷ bfloat16 (medians): {ratio:.2f}×", flush=True)
        for task in TASKS:
            prompts = [e.prompt for e in load_task(task, n=args.n, seed=0)]
            f32, tok32 = lens_with_tokens(loaded, prompts, "float32")
            bf16, tok16 = lens_with_tokens(loaded, prompts, "bfloat16")
            dkl = (tok16[:, 0] - tok32[:, 0]).abs()
            flips = int((tok16[:, 1] != tok32[:, 1]).sum())
            kl_scale = float(tok32[:, 0].abs().max())
            print(
                f"  {task:9s}: {tok32.shape[0]} token-layers; max |ΔKL| {float(dkl.max()):.4f} nats "
                f"(largest KL {kl_scale:.2f}; mean |ΔKL| {float(dkl.mean()):.5f}); overlap flips {flips} "
                f"({flips / tok32.shape[0]:.3%})",
                flush=True,
            )
            a, b = statistics_of(f32), statistics_of(bf16)
            for name in a:
                change = (
                    "" if a[name] is None or b[name] is None else f"  Δ {float(np.subtract(b[name], a[name])):+.4f}"
                )
                print(f"    {name:17s} float32 {shown(a[name]):>8s}  bfloat16 {shown(b[name]):>8s}{change}", flush=True)
        del loaded


if __name__ == "__main__":
    main()
