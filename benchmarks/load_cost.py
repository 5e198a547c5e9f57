"""Model load time, cold (GGUF parsed and dequantized) and warm (the cached safetensors), against
one plain forward of a 256-token prompt, in one run per model.

    python benchmarks/load_cost.py --models smollm2-135m qwen2.5-coder-0.5b

Prints per model: the first cached load (cold plus writing the cache, once per model and dtype: a
single call, and only where the cache is missing; for the first model it also carries the process's
one-off start-up), the cold load (``cached_weights=False``: what every load cost before the cache),
the warm load, one forward of 256 tokens, and the ratios cold ÷
warm and warm ÷ forward. The cold load, the warm load and the forward are each the median [min–max]
of ``--repeats`` calls after a warm-up call; the ratios are of medians.
"""

from __future__ import annotations

import argparse
import time

import torch
from measure import repeated

from effdepth_core.models import load_model
from effdepth_core.zoo import ZOO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(ZOO))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    header = f"{'model':<20} {'first s':>8} {'cold s':>24} {'warm s':>24} {'fwd256 s':>24}"
    print(f"{header} {'cold/warm':>10} {'warm/fwd':>9}")
    for alias in args.models:
        options = dict(device="cpu", dtype=args.dtype, progress=False)
        started = time.perf_counter()
        load_model(alias, **options)  # writes the cache if missing: the first cached load
        first = time.perf_counter() - started
        cold = repeated(lambda: load_model(alias, cached_weights=False, **options), args.repeats)  # noqa: B023
        warm = repeated(lambda: load_model(alias, **options), args.repeats)  # noqa: B023
        loaded = load_model(alias, **options)
        ids = torch.randint(10, loaded.vocab_size - 10, (1, 256), generator=torch.Generator().manual_seed(0))

        def forward() -> None:
            with torch.inference_mode():
                loaded.model(input_ids=ids, use_cache=False)  # noqa: B023

        fwd = repeated(forward, args.repeats)  # the first pass (the warm-up) is several times slower
        cells = [f"{t.median:.2f} [{t.low:.2f}–{t.high:.2f}]" for t in (cold, warm, fwd)]
        print(
            f"{alias:<20} {first:>8.1f} {cells[0]:>24} {cells[1]:>24} {cells[2]:>24} "
            f"{cold.median / warm.median:>10.1f} {warm.median / fwd.median:>9.2f}"
        )


if __name__ == "__main__":
    main()
