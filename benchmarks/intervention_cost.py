"""The causal probes against the published loops, on the same prompts in one run.

    python benchmarks/intervention_cost.py [--model smollm2-135m] [--probes skip,erasure,igrad] [--repeats 5]

"Published loop": what the published scripts do (AheadOFpotato/what_affects_effective_depth at
commit 21b36545a85bfbdc8ef499c040f55ab811a255f9, the code of Hu et al. after Csordás et al.), run
through effdepth's ``method="slow"`` paths, which are exactly those loops (igrad's with
``measure.PublishedBatching``: the oracle alone holds its α rows from the embedding on):
- skip (``plot_layer_effects.py``): one full forward pass, batch 1, per (skipped layer, position);
- erasure (``plot_residual_erasure.py``): one full forward pass, batch 1, per (layer, position);
- igrad (``plot_integrated_gradients.py``): per layer, one forward + backward per block of 16 steps
  (``BLOCK_SIZE = 16``): the prompt at batch 1 up to the layer, 16 interpolated rows from it on
  (``slow_block=16``), with the script's baseline (the layer output's mean over the hidden
  dimension, ``hidden-mean``). effdepth's stand-in adds one pass of 2 rows per layer for the path's
  two ends (the completeness check), 1 in 17 of the passes.
The workloads: skip: the future-token variant, whole layers, 3 GSM8K prompts × 4 cut positions;
erasure: one 6-digit addition (every layer × every position); igrad: the 256-step Riemann sum on
every layer of one 6-digit addition (``--igrad-layers`` for fewer).

Per probe it prints published-loop and fast wall time (the median [min–max] of ``--repeats`` calls
after the first, ``--published-repeats`` for the published loop, the two paths alternating; the
first call is the warm-up and the one counted for work, memory and the result) and the ratio of the
medians (the default 5 repeats make the whole run about six times a single-shot one: igrad's
published loop on all 30 layers is ~13 min a call on one CPU thread); the work of each in
forward-equivalents (decoder-layer and head token evaluations weighted by parameters, counted
while running; a backward pass is not counted); the *work floor*: the evaluations the result
depends on (computed from the probe's definition: per intervention, the layers above it at the
positions it can reach, the head at the positions measured), and the published ÷ floor ratio,
which bounds what any exact method could gain at equal throughput; system time and minor page
faults (memory churn); and the largest difference between the two results.
"""

from __future__ import annotations

import argparse
import math
import resource

import polars as pl
import torch
from measure import PeakRSS, WorkCounter, alternating, as_published

from effdepth_core.measurement.probes import erasure_map, integrated_gradients, skip_effects
from effdepth_core.measurement.probes.shared.answers import answer_split
from effdepth_core.measurement.probes.skip import sample_positions
from effdepth_core.models import load_model
from effdepth_core.task_loading import load_task

KEYS = {
    "skip": ["example", "variant", "position", "part", "skipped_layer", "layer", "metric"],
    "erasure": ["example", "layer", "position", "metric"],
    "igrad": ["example", "layer", "position", "metric"],
}


def measure(loaded, fn, *args) -> dict:
    """One call of ``fn(*args)`` counted: its result, work, system time, page faults and memory."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    with PeakRSS() as memory, WorkCounter(loaded) as work:
        frame = fn(*args)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "frame": frame,
        "work": work.layer_tokens * work.layer_params + work.head_tokens * work.head_params,
        "system": after.ru_stime - before.ru_stime,
        "faults": after.ru_minflt - before.ru_minflt,
        "mb": memory.extra_mb,
    }


def max_difference(a: pl.DataFrame, b: pl.DataFrame, keys: list[str]) -> float:
    joined = a.join(b, on=keys, how="full", suffix="_b", nulls_equal=True)
    return float((joined["value"] - joined["value_b"]).abs().max())


def skip_floor(n_layers: int, lengths: list[int], cuts: list[list[int]]) -> tuple[int, int]:
    """(layer tokens, head tokens) the future-token whole-layer skips depend on: per prompt the
    clean pass; per skipped layer s the skipped prefix (positions < the last cut) at layers > s;
    per (s, t) positions ≥ t at layers > s and the head there."""
    layer_tokens = head_tokens = 0
    for n, ts in zip(lengths, cuts, strict=True):
        layer_tokens += n_layers * n
        head_tokens += sum(n - t for t in ts)  # the clean distributions
        for s in range(n_layers):
            layer_tokens += (n_layers - 1 - s) * (max(ts) + sum(n - t for t in ts))
            head_tokens += sum(n - t for t in ts)
    return layer_tokens, head_tokens


def erasure_floor(n_layers: int, n: int, n_answer: int) -> tuple[int, int]:
    """Erasing h_l[t] reaches positions t..last at layers ≥ l (last: the last answer-predicting
    position); the head runs at the measured positions ≥ t. Plus the clean pass up to last."""
    last, first = n - 2, n - 1 - n_answer
    layer_tokens, head_tokens = n_layers * (last + 1), n_answer
    for t in range(last + 1):
        for layer in range(n_layers + 1):
            layer_tokens += (n_layers - layer) * (last + 1 - t)
            head_tokens += last + 1 - max(first, t)
    return layer_tokens, head_tokens


def igrad_floor(n_layers: int, n: int, n_answer: int, layers: list[int], steps: int) -> tuple[int, int]:
    """Each step's point on the path of layer l runs layers > l on every position but the last,
    and the head at the measured positions (the path's two ends: two more forwards)."""
    layer_tokens, head_tokens = n_layers * (n - 1), 0
    for layer in layers:
        layer_tokens += (steps + 2) * (n_layers - 1 - layer) * (n - 1)
        head_tokens += (steps + 2) * n_answer
    return layer_tokens, head_tokens


BLOCK_SIZE = 16  # plot_integrated_gradients.py: steps per forward + backward


def igrad_published_work(n_layers: int, n: int, layers: list[int], steps: int) -> tuple[int, int]:
    """Per layer l and block of 16 steps: layers ≤ l at batch 1, the rest at 16 rows, the head on
    every row; plus the two ends (one pass of 2 rows) and the clean pass."""
    blocks = math.ceil(steps / BLOCK_SIZE)
    layer_tokens, head_tokens = n_layers * (n - 1), n - 1
    for layer in layers:
        layer_tokens += (
            blocks * ((layer + 1) + BLOCK_SIZE * (n_layers - 1 - layer)) + (layer + 1) + 2 * (n_layers - 1 - layer)
        ) * (n - 1)
        head_tokens += (blocks * BLOCK_SIZE + 2) * (n - 1)
    return layer_tokens, head_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--probes", default="skip,erasure,igrad")
    parser.add_argument("--igrad-layers", default="all", help="comma list of layers, or all")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each path after its first")
    parser.add_argument(
        "--published-repeats", type=int, default=None, help="the published loops' timed calls (default: --repeats)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load_model(args.model, device="cpu", progress=False)
    n_layers = loaded.n_layers
    gsm8k = [example.prompt for example in load_task("gsm8k", n=3, seed=0)]
    lengths = [loaded.encode(prompt).numel() for prompt in gsm8k]
    cuts = [sample_positions(n, 4, 0, index) for index, n in enumerate(lengths)]
    (addition,) = load_task("addition", n=1, seed=0, digits=6)
    ids, n_answer = answer_split(loaded, addition)
    n_add = ids.numel()
    if args.igrad_layers == "all":
        igrad_layers = list(range(n_layers))
    else:
        igrad_layers = [int(x) for x in args.igrad_layers.split(",") if int(x) < n_layers]
    skip_kw = dict(skip_parts=("layer",), skip_variants=("future",), skip_positions=4)

    def igrad(method: str) -> pl.DataFrame:  # the paper's Riemann-256, hidden-mean baseline, 16 α per pass
        return as_published(loaded, method, lambda: integrated_gradients(
            loaded, [addition], 256, "riemann", igrad_baseline="hidden-mean", method=method,
            layers=igrad_layers, slow_block=BLOCK_SIZE,
        ))  # fmt: skip

    runs = {
        "skip": (
            lambda method: skip_effects(loaded, gsm8k, method=method, **skip_kw),
            skip_floor(n_layers, lengths, cuts),
            # published: the clean pass, then one full forward (all positions, full head) per (s, t)
            (
                sum(n_layers * n * (1 + n_layers * len(c)) for n, c in zip(lengths, cuts, strict=True)),
                sum(n * len(c) * n_layers for n, c in zip(lengths, cuts, strict=True)),
            ),
            sum(lengths) / len(lengths),
        ),
        "erasure": (
            lambda method: erasure_map(loaded, [addition], method=method),
            erasure_floor(n_layers, n_add, n_answer),
            (n_layers * n_add * (1 + (n_layers + 1) * n_add), n_add * (1 + (n_layers + 1) * n_add)),
            n_add,
        ),
        "igrad": (
            igrad,
            igrad_floor(n_layers, n_add, n_answer, igrad_layers, 256),
            igrad_published_work(n_layers, n_add, igrad_layers, 256),
            n_add - 1,
        ),
    }
    counter = WorkCounter(loaded)
    forward = n_layers * counter.layer_params + counter.head_params  # one token through the model

    print(
        f"model {loaded.name} ({n_layers} layers, {torch.get_num_threads()} threads); "
        f"skip: GSM8K prompts of {lengths} tokens, cuts {cuts}; "
        f"erasure and igrad: a 6-digit addition of {n_add} tokens ({n_answer} answer tokens); "
        f"igrad layers {igrad_layers}"
    )
    skip_effects(loaded, gsm8k[:1], skip_parts=("layer",), skip_variants=("current",))  # warm-up
    header = f"{'probe':8s} {'path':9s} {'seconds, median [min–max]':>26s} {'fwd-equiv':>10s} {'sys s':>6s}"
    print(f"{header} {'faults':>8s} {'peak MB':>8s}")
    for name in args.probes.split(","):
        fn, floor, published_work, n_ref = runs[name]
        published, fast = measure(loaded, fn, "slow"), measure(loaded, fn, "fast")  # counted, and the warm-up
        calls = {"published": lambda fn=fn: fn("slow"), "fast": lambda fn=fn: fn("fast")}
        published_repeats = args.repeats if args.published_repeats is None else args.published_repeats
        timings = alternating(calls, {"published": published_repeats, "fast": args.repeats})
        unit = n_ref * forward
        for label, result in (("published", published), ("fast", fast)):
            timing = timings[label]
            spread = f"{timing.median:.2f} [{timing.low:.2f}–{timing.high:.2f}]"
            print(
                f"{name:8s} {label:9s} {spread:>26s} {result['work'] / unit:10.1f} "
                f"{result['system']:6.2f} {result['faults']:8d} {result['mb']:8.1f}"
            )
        floor_work = floor[0] * counter.layer_params + floor[1] * counter.head_params
        model_work = published_work[0] * counter.layer_params + published_work[1] * counter.head_params
        print(
            f"{name:8s} published ÷ fast: time {timings['published'].median / timings['fast'].median:.2f}× "
            f"(medians), "
            f"work {published['work'] / fast['work']:.2f}×; work floor ratio {model_work / floor_work:.2f}× "
            f"(floor {floor_work / unit:.1f} fwd-equiv; fast does {fast['work'] / floor_work:.2f}× the floor; "
            f"counted published work is {published['work'] / model_work:.2f}× its model)"
        )
        print(
            f"{name:8s} max |published − fast| over all values: "
            f"{max_difference(published['frame'], fast['frame'], KEYS[name]):.2e}"
        )


if __name__ == "__main__":
    main()
