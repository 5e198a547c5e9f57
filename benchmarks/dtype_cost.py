"""float32 against bfloat16 end to end on a CPU: the residual cosine and the logit lens of a real
model on GSM8K prompts, each probe's seconds in both dtypes, and where the time goes (torch.profiler:
matrix products against everything else).

    python benchmarks/dtype_cost.py [--model qwen2.5-coder-1.5b] [--n 4] [--threads 1]
    python benchmarks/dtype_cost.py --eds [--out DIR]   # bfloat16 EDs of the four models beside the book's float32 ones

On this project's CPU (AMX) a bfloat16 matrix product runs several times a float32 one, but a probe
is more than its products: the lens's softmax, KL and top-k over the vocabulary run in float32 in
both dtypes (method.md §8), as do the cosine's norms. The last table says how much of each probe's
time is matrix products, so the end-to-end ratio can be read from it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from measure import repeated
from torch.profiler import ProfilerActivity, profile

from effdepth_core.measurement.probes import logit_lens, residual_cosine
from effdepth_core.models import load_model
from effdepth_core.results import RunSettings, run
from effdepth_core.task_loading import load_task

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul", "aten::_scaled_dot_product")


def product_share(fn) -> float:
    """The share of one call's CPU time in matrix products (attention included), under the profiler."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    products = sum(e.self_cpu_time_total for e in events if e.key.startswith(MATMUL) or "mkldnn" in e.key)
    return products / total if total else float("nan")


RULES = ("cosine", "logit_lens_kl", "logit_lens_overlap")
MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def eds(out: Path) -> None:
    """Cosine and logit lens in bfloat16 on the prompts of the book's committed float32 runs (n = 20
    HellaSwag and GSM8K), each rule's ED and continuous statistic beside the committed ones."""
    root = Path(__file__).resolve().parents[1] / "book" / "results"
    header = f"{'model':19s} {'task':9s} {'rule':19s} {'ED f32':>6s} {'ED bf16':>7s}"
    print(f"{header} {'depth f32':>9s} {'depth bf16':>10s}")
    for model in MODELS:
        for task in ("hellaswag", "gsm8k"):
            committed = root / model / f"{task}-n20-seed0" / "effective_depth.json"
            if not committed.is_file():
                continue
            theirs = json.loads(committed.read_text())
            settings = RunSettings(model, task, n=20, dtype="bfloat16", progress=False)
            ours = run(settings, ["cosine", "logit_lens"], out / model / task).summary
            for rule in RULES:
                a, b = theirs.get(rule) or {}, ours.get(rule) or {}
                depth = [f"{x['depth']:.2f}" if x.get("depth") is not None else "—" for x in (a, b)]
                print(f"{model:19s} {task:9s} {rule:19s} {a.get('ed')!s:>6s} {b.get('ed')!s:>7s} {depth[0]:>9s} "
                      f"{depth[1]:>10s}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--n", type=int, default=4, help="GSM8K prompts (default 4)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each probe after a warm-up")
    parser.add_argument("--eds", action="store_true", help="bfloat16 EDs of the four models beside the book's")
    parser.add_argument("--out", type=Path, default=Path("results/dtype-eds"), help="where --eds keeps its runs")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.eds:
        eds(args.out)
        return
    prompts = [e.prompt for e in load_task("gsm8k", n=args.n, seed=0)]
    threads = torch.get_num_threads()
    print(f"{args.model}, {args.n} GSM8K prompts, CPU with {threads} thread(s), torch {torch.__version__}")
    print(f"{'dtype':9s} {'probe':11s} {'seconds, median [min–max]':>26s} {'matrix products':>16s}")
    seconds: dict[tuple[str, str], float] = {}
    for dtype in ("float32", "bfloat16"):
        loaded = load_model(args.model, dtype=dtype, progress=False)
        probes = {
            "cosine": lambda loaded=loaded: residual_cosine(loaded, prompts, progress=False),
            "logit lens": lambda loaded=loaded: logit_lens(loaded, prompts, progress=False),
        }
        for name, fn in probes.items():
            timing = repeated(fn, args.repeats)  # after a warm-up: the first forward is several times slower
            seconds[dtype, name] = timing.median
            spread = f"{timing.median:.2f} [{timing.low:.2f}–{timing.high:.2f}]"
            print(f"{dtype:9s} {name:11s} {spread:>26s} {product_share(fn):16.0%}", flush=True)
        del loaded, probes
    for name in ("cosine", "logit lens"):
        print(f"{name}: float32 ÷ bfloat16 = {seconds['float32', name] / seconds['bfloat16', name]:.2f}× (medians)")
    total = sum(seconds["float32", n] for n in ("cosine", "logit lens"))
    total_bf16 = sum(seconds["bfloat16", n] for n in ("cosine", "logit lens"))
    print(f"cosine + logit lens: float32 ÷ bfloat16 = {total / total_bf16:.2f}×")


if __name__ == "__main__":
    main()
