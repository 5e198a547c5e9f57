"""The lens's top-k on a CPU: ``largest`` (span maxima, then the k largest among the k best spans)
against ``torch.topk`` over whole vocabulary rows, one thread, 16 rows (the lens's block) of
float32 logits at the book's vocabulary sizes. Checks they agree, then times each: a warm-up, then
``--repeats`` calls alternated; median and min–max printed.

    python benchmarks/topk_cost.py [--repeats 21] [--k 5]
"""

from __future__ import annotations

import argparse

import torch
from measure import Timing, repeated

from effdepth_core.topk import largest

VOCABS = {"smollm2-135m": 49152, "qwen2.5-coder": 151936, "gemma3-270m": 262144}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, 16 rows, k = {args.k}, {args.repeats} repeats after a warm-up")
    for model, vocab in VOCABS.items():
        logits = torch.randn(16, vocab, generator=torch.Generator().manual_seed(0)) * 4
        expected, got = logits.topk(args.k, dim=-1), largest(logits, args.k)
        assert torch.equal(expected.values, got.values) and torch.equal(expected.indices, got.indices)
        calls = {"topk": lambda x=logits: x.topk(args.k, dim=-1), "largest": lambda x=logits: largest(x, args.k)}
        runs: dict[str, list[float]] = {name: [] for name in calls}
        for repeat in range(args.repeats + 1):  # alternated; round 0 is the warm-up
            for name, call in calls.items():
                took = repeated(call, repeats=1, warmup=0).runs[0] * 1e3
                runs[name] += [took] if repeat else []
        times = {name: Timing(tuple(values)) for name, values in runs.items()}
        spread = "; ".join(f"{n} {t.median:.3f} ms ({t.low:.3f}–{t.high:.3f})" for n, t in times.items())
        medians = {name: t.median for name, t in times.items()}
        print(f"{model:14s} vocab {vocab:7d}: {spread}; topk ÷ largest {medians['topk'] / medians['largest']:.1f}×")


if __name__ == "__main__":
    main()
