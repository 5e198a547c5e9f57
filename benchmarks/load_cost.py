"""Model load time, cold (GGUF parsed and dequantized) and warm (the cached safetensors), against
one plain forward of a 256-token prompt, in one run per model.

    python benchmarks/load_cost.py --models smollm2-135m qwen2.5-coder-0.5b

Prints per model: the cold load (``cached_weights=False``: what every load cost before the cache),
the first cached load (cold plus writing the cache, once per model and dtype), the warm load, one
forward of 256 tokens, and the ratios cold ÷ warm and warm ÷ forward.
"""

from __future__ import annotations

import argparse
import time

import torch
from measure import median_time

from effdepth_core.models import load_model
from effdepth_core.zoo import ZOO


def timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(ZOO))
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    print(f"{'model':<20} {'cold s':>8} {'first s':>8} {'warm s':>8} {'fwd256 s':>9} {'cold/warm':>10} {'warm/fwd':>9}")
    for alias in args.models:
        options = dict(device="cpu", dtype=args.dtype, progress=False)
        cold, _ = timed(lambda: load_model(alias, cached_weights=False, **options))  # noqa: B023
        first, _ = timed(lambda: load_model(alias, **options))  # noqa: B023 (writes the cache if missing)
        warm, loaded = timed(lambda: load_model(alias, **options))  # noqa: B023
        ids = torch.randint(10, loaded.vocab_size - 10, (1, 256), generator=torch.Generator().manual_seed(0))

        def forward() -> None:
            with torch.inference_mode():
                loaded.model(input_ids=ids, use_cache=False)  # noqa: B023

        forward()  # warm-up: the first pass is several times slower
        t_forward = median_time(forward, 3)
        print(
            f"{alias:<20} {cold:>8.1f} {first:>8.1f} {warm:>8.2f} {t_forward:>9.2f} {cold / warm:>10.1f} "
            f"{warm / t_forward:>9.2f}"
        )


if __name__ == "__main__":
    main()
