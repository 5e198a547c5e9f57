"""Slow (one forward pass per intervention, as the published loops) vs fast paths of the causal
probes, on the same prompt in one run.

    python benchmarks/intervention_cost.py --model smollm2-135m [--task addition --digits 6]

For each probe it prints wall time, work in forward-equivalents (decoder-layer and head token
evaluations weighted by parameters, forward passes only), peak extra resident memory, the
slow/fast ratios, and the largest difference between the two results. Goals on smollm2-135m:
skip ≥ 2×, erasure ≥ 3×, integrated gradients ≥ 4× (both paths with the reference 256-step
Riemann sum; then the adaptive rule, whose completeness gaps show its accuracy against it).
"""

from __future__ import annotations

import argparse
import time

import polars as pl
from measure import PeakRSS, WorkCounter

from effdepth_core.models import load_model
from effdepth_core.probes import erasure_map, integrated_gradients, skip_effects
from effdepth_core.probes.answers import answer_split
from effdepth_core.tasks import load_task

KEYS = {
    "skip": ["example", "variant", "position", "part", "skipped_layer", "layer", "metric"],
    "erasure": ["example", "layer", "position", "metric"],
    "igrad": ["example", "layer", "position", "metric"],
}


def measure(loaded, fn):
    with PeakRSS() as memory, WorkCounter(loaded) as work:
        started = time.perf_counter()
        frame = fn()
        seconds = time.perf_counter() - started
    return frame, seconds, work, memory.extra_mb


def max_difference(a: pl.DataFrame, b: pl.DataFrame, keys: list[str], metric: str | None = None) -> float:
    if metric is not None:
        a, b = a.filter(metric=metric), b.filter(metric=metric)
    joined = a.join(b, on=keys, how="full", suffix="_b", nulls_equal=True)
    return float((joined["value"] - joined["value_b"]).abs().max())


def report_adaptive(loaded, example, layers, budget: int, slow, n_tokens: int) -> None:
    """The adaptive rule against the slow Riemann-256 run: time and completeness per layer."""
    frame, seconds, work, _ = measure(
        loaded, lambda: integrated_gradients(loaded, [example], budget, "adaptive", layers=layers)
    )
    print(
        f"igrad    adaptive-{budget} (fast) {seconds:.2f} s, {work.forward_equivalents(n_tokens):.1f} fwd-equiv; "
        f"slow Riemann-256 ÷ adaptive: time {slow[1] / seconds:.2f}×"
    )
    for label, result in (("Riemann-256", slow[0]), (f"adaptive-{budget}", frame)):
        gaps = result.filter(metric="completeness_gap").sort("layer")["value"].to_list()
        print(f"igrad    completeness gap per layer {layers}, {label}: " + " ".join(f"{g:+.1e}" for g in gaps))
    deltas = slow[0].filter(metric="target_delta").sort("layer")["value"].to_list()
    print("igrad    target change per layer: " + " ".join(f"{d:+.2f}" for d in deltas))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", default="addition")
    parser.add_argument("--digits", type=int, default=6)
    parser.add_argument("--igrad-layers", default="0,10,20,29", help="layers for igrad (the slow path is costly)")
    parser.add_argument("--igrad-steps", type=int, default=128, help="gradient budget of the adaptive rule")
    parser.add_argument("--probes", default="skip,erasure,igrad")
    args = parser.parse_args()

    loaded = load_model(args.model, device="cpu")
    (example,) = load_task(args.task, n=1, seed=0, digits=args.digits)
    ids, n_answer = answer_split(loaded, example)
    n_tokens = ids.numel()
    layers = [int(x) for x in args.igrad_layers.split(",") if int(x) < loaded.n_layers]
    skip_effects(loaded, [example.prompt], variants=("current",), parts=("layer",))  # warm-up

    runs = {
        "skip": (
            lambda: skip_effects(loaded, [example.prompt], method="slow"),
            lambda: skip_effects(loaded, [example.prompt], method="fast"),
        ),
        "erasure": (
            lambda: erasure_map(loaded, [example], method="slow"),
            lambda: erasure_map(loaded, [example], method="fast"),
        ),
        "igrad": (  # the same 256-step Riemann rule on both paths: identical numbers
            lambda: integrated_gradients(loaded, [example], 256, "riemann", method="slow", layers=layers),
            lambda: integrated_gradients(loaded, [example], 256, "riemann", method="fast", layers=layers),
        ),
    }
    print(f"model {loaded.name} ({loaded.n_layers} layers), {args.task}: {n_tokens} tokens, {n_answer} answer tokens")
    print(f"{'probe':8s} {'path':5s} {'seconds':>9s} {'fwd-equiv':>10s} {'peak MB':>8s}")
    for name in args.probes.split(","):
        slow_fn, fast_fn = runs[name]
        slow = measure(loaded, slow_fn)
        fast = measure(loaded, fast_fn)
        for label, (_, seconds, work, mb) in (("slow", slow), ("fast", fast)):
            print(f"{name:8s} {label:5s} {seconds:9.2f} {work.forward_equivalents(n_tokens):10.1f} {mb:8.1f}")
        speed = slow[1] / fast[1]
        work_ratio = slow[2].forward_equivalents(n_tokens) / fast[2].forward_equivalents(n_tokens)
        print(f"{name:8s} slow ÷ fast: time {speed:.2f}×, forward-equivalents {work_ratio:.2f}×")
        print(f"{name:8s} max |slow − fast| over all values: {max_difference(slow[0], fast[0], KEYS[name]):.2e}")
        if name == "igrad":
            report_adaptive(loaded, example, layers, args.igrad_steps, slow, n_tokens)


if __name__ == "__main__":
    main()
