"""Cost of the analyses beyond the paper, in plain forwards and peak memory, in one run.

    python benchmarks/beyond_cost.py --model smollm2-135m [--task gsm8k --n 2 --lens-steps 10 --repeats 5]

Prints for each analysis, on the same prompts: seconds (the median [min–max] of ``--repeats`` calls
after the first, which is the warm-up and the one whose work and memory are counted), seconds ÷ one
plain forward of those prompts (with head), work in forward-equivalents (layer and head token evaluations weighted by
their parameters; forward passes only — tuned-lens training also runs the head backward, to its
input only, about one more head forward per training head call), and peak extra resident memory:
- tuned-lens training (``--lens-steps`` Adam steps on the vendored corpus; the per-step cost
  scales the full training's);
- the lens probe with the tuned lens vs with the logit lens;
- layer pruning (every block of k = 1, 2, 4, ⌈L/4⌉ and ShortGPT's sets);
- early exit (logit lens);
- the cross-model linear map with the model mapped onto itself (``--map``; two models of one
  tokenizer are the real use, whose cost is the sum of both models' forwards plus the fit).
"""

from __future__ import annotations

import argparse

from measure import PeakRSS, WorkCounter, repeated

from effdepth_core.linear_map import cross_model_map
from effdepth_core.measurement.probes import early_exit, layer_pruning, logit_lens
from effdepth_core.measurement.probes.tuned_lens import LensTraining, train_tuned_lens
from effdepth_core.measurement.trace import forward, iter_batches, tokenize
from effdepth_core.models import load_model
from effdepth_core.task_loading import load_task
from effdepth_core.tasks import lens_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", default="gsm8k")
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--lens-steps", type=int, default=10)
    parser.add_argument("--map", action="store_true", help="also time the linear map (model onto itself)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each analysis after its first")
    args = parser.parse_args()

    loaded = load_model(args.model, device=args.device, progress=False)
    examples = load_task(args.task, n=args.n, seed=0)
    prompts = [e.prompt for e in examples]
    tokens = tokenize(loaded, prompts)
    n_tokens = sum(t.numel() for t in tokens)
    batches = list(iter_batches(tokens, 4, loaded.input_device))

    def plain_forward() -> None:
        for batch in batches:
            forward(loaded, batch, head=True)

    forward_time = repeated(plain_forward, args.repeats)
    t_forward = forward_time.median
    print(f"{loaded.name}: {args.n} {args.task} prompts, {n_tokens} tokens; plain forward {forward_time}")
    print(f"{'analysis':<34} {'s, median [min–max]':>24} {'÷ forward':>10} {'fwd-equiv':>10} {'peak MB':>9}")

    def report(name: str, fn) -> object:
        with PeakRSS() as peak, WorkCounter(loaded) as work:  # the first call: work, memory, warm-up
            out = fn()
        equivalents = work.forward_equivalents(n_tokens)
        timing = repeated(fn, args.repeats, warmup=0)
        spread = f"{timing.median:.2f} [{timing.low:.2f}–{timing.high:.2f}]"
        print(f"{name:<34} {spread:>24} {timing.median / t_forward:>10.1f} {equivalents:>10.1f} {peak.extra_mb:>9.0f}")
        return out

    training = LensTraining(train_tokens=2048, heldout_tokens=256, steps=args.lens_steps)
    lens, _ = report(
        f"tuned lens, {args.lens_steps} training steps", lambda: train_tuned_lens(loaded, lens_corpus(), training)
    )
    report("logit lens probe", lambda: logit_lens(loaded, prompts))
    report("tuned lens probe", lambda: logit_lens(loaded, prompts, lens=lens))
    report("pruning (all blocks + ShortGPT)", lambda: layer_pruning(loaded, examples))
    report("early exit (logit lens)", lambda: early_exit(loaded, examples))
    if args.map:
        half = max(1, len(prompts) // 2)
        report(
            "linear map (onto itself)",
            lambda: cross_model_map(loaded, loaded, prompts[:half], prompts[half:], ridge=1.0),
        )


if __name__ == "__main__":
    main()
