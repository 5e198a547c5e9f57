"""What the canary costs: the check a cached result of a model in memory (a run, a probe's rows, a
tuned lens) must pass before it is returned, against what it protects, in one run.

    python benchmarks/canary_cost.py --model smollm2-135m

Prints, as medians of repeated calls after a warm-up: the run canary (``results.canary``: the first
prompt's first 32 tokens, its logits at every position, hashed), the tuned lens's canary
(``tuned_lens._lens_canary``, the same on the lens corpus's first text), a cached ``measure`` of 10
GSM8K prompts (a hit: canary included), and the probes it returns computed afresh; then the ratios
canary ÷ hit and canary ÷ fresh.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from measure import repeated

from effdepth_core import measure
from effdepth_core.measurement.probes.tuned_lens import _lens_canary
from effdepth_core.models import load_model
from effdepth_core.results import canary
from effdepth_core.task_loading import load_task
from effdepth_core.tasks import lens_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    loaded = load_model(args.model, device="cpu", dtype="float32", progress=False)
    examples = load_task("gsm8k", n=args.n, seed=0)
    corpus = lens_corpus()
    run_canary = repeated(lambda: canary(loaded, examples), args.repeats)
    lens_canary = repeated(lambda: _lens_canary(loaded, corpus), args.repeats)
    with tempfile.TemporaryDirectory() as folder:

        def kept():
            return measure(loaded, examples, probes="cosine,logit_lens", out=f"{folder}/run", progress=False)

        fresh = repeated(lambda: measure(loaded, examples, probes="cosine,logit_lens", progress=False), args.repeats)
        kept()  # computed and kept once: every timed call below is a cache hit
        hit = repeated(kept, args.repeats)
    print(f"model {args.model}, {args.n} GSM8K prompts, torch threads {torch.get_num_threads()}")
    print(f"run canary            {run_canary}")
    print(f"tuned-lens canary     {lens_canary}")
    print(f"cached measure (hit)  {hit}")
    print(f"fresh measure         {fresh}")
    print(f"canary / hit          {run_canary.median / hit.median:.2f}")
    print(f"canary / fresh        {run_canary.median / fresh.median:.4f}")


if __name__ == "__main__":
    main()
