"""The scale study on a GPU: qwen2.5-coder-1.5b in bfloat16 and float32, each probe's time, the
causal probes against the published loops, and the bfloat16 EDs beside the committed float32 ones.

    python benchmarks/gpu_scale.py [--model qwen2.5-coder-1.5b] [--device cuda] [--n N]

Without a CUDA GPU it says so and measures nothing (CI has none; `--device cpu --n 1` exercises the
script on a CPU). Per dtype it runs, into a temporary directory, the model's scale-section runs at
the n its committed runs settled on (``book/results``; ``--n`` overrides): cosine and logit lens on
HellaSwag, GSM8K and AIME24, and prints each probe's seconds and peak GPU memory (each the record of
that one run, as a user's run costs: the first includes CUDA's start-up; ``paper_scale.py`` times
the probes warmed up and repeated). Then, for skip (whole layers, future tokens, one GSM8K prompt),
erasure and integrated gradients (one 6-digit addition, Riemann-256 on every layer), the published
loop (effdepth's ``method="slow"``: what the published scripts do, see ``intervention_cost.py``) ÷
the fast path. Last, each ED of the bfloat16 runs beside the committed float32 one (CPU, same
prompts; the committed run at the task's default settings, never a sensitivity run with another
``max_tokens``). The causal paths are warmed up, then
timed ``--repeats`` times (``--published-repeats`` for the published loops), taking turns.

Its output on the one GPU lent so far is ``benchmarks/output/gpu_scale-smollm2-135m-h200.txt``
(read in ``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from measure import alternating

from effdepth_core.measurement.probes import erasure_map, integrated_gradients, skip_effects
from effdepth_core.models import load_model
from effdepth_core.results import RunSettings, run
from effdepth_core.settings import slug
from effdepth_core.task_loading import load_task

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("hellaswag", "gsm8k", "aime24")
RULES = ("cosine", "logit_lens_kl", "logit_lens_overlap")


def committed(model: str, task: str) -> dict | None:
    """The committed float32 summary of the model's scale run on ``task`` (the largest n at the task's
    default settings: a sensitivity run with another ``max_tokens`` measures other prompts), with
    the n it asked for as ``n_asked``."""
    runs = []
    for summary in (ROOT / "book" / "results" / slug(model)).glob(f"{task}-n*-seed0/effective_depth.json"):
        settings = json.loads((summary.parent / "metadata.json").read_text())["settings"]
        if settings.get("max_tokens") is None:
            runs.append((settings["n"], summary))
    if not runs:
        return None
    n, summary = max(runs)
    return {**json.loads(summary.read_text()), "n_asked": n}


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def causal_ratios(loaded, args: argparse.Namespace, dtype: str) -> None:
    """Skip, erasure and integrated gradients: the published loop ÷ the fast path, same inputs."""
    (addition,) = load_task("addition", n=1, seed=0, digits=6)
    gsm8k = [e.prompt for e in load_task("gsm8k", n=1, seed=0)]
    causal = {
        "skip": lambda method: skip_effects(
            loaded, gsm8k, skip_parts=("layer",), skip_variants=("future",), method=method
        ),
        "erasure": lambda method: erasure_map(loaded, [addition], method=method),
        "igrad": lambda method: integrated_gradients(
            loaded,
            [addition],
            16 if args.smoke else 256,
            "riemann",
            igrad_baseline="hidden-mean",
            method=method,
            slow_block=16,
            layers=[0, 1] if args.smoke else None,
        ),
    }
    warm_slow = {  # igrad's published loop warmed up on one layer: a whole call would double its cost
        "igrad": lambda: integrated_gradients(
            loaded, [addition], 16, "riemann", igrad_baseline="hidden-mean", method="slow", slow_block=16, layers=[0]
        )
    }
    for name, fn in causal.items():
        warm_slow.get(name, lambda fn=fn: fn("slow"))()  # warm-up (kernels, caches)
        fn("fast")
        calls = {"slow": lambda fn=fn: fn("slow"), "fast": lambda fn=fn: fn("fast")}
        published = args.repeats if args.published_repeats is None else args.published_repeats
        took = alternating(calls, {"slow": published, "fast": args.repeats}, sync=lambda: synchronize(args.device))
        slow, fast = took["slow"], took["fast"]
        print(
            f"{dtype:8s} {name:8s} published loop {slow}, fast {fast}: {slow.median / fast.median:.2f}× (medians)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", type=int, default=None, help="prompts per task (default: the committed runs' n)")
    parser.add_argument("--smoke", action="store_true", help="igrad on two layers, 16 steps: exercise the script")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each causal path after a warm-up")
    parser.add_argument(
        "--published-repeats", type=int, default=None, help="the published loops' timed calls (default: --repeats)"
    )
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU on this machine: nothing measured (run this where `torch.cuda.is_available()`)")
        return
    import transformers

    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(f"{args.model} on {where} (torch {torch.__version__}, transformers {transformers.__version__})")
    eds: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="effdepth-gpu-") as scratch:
        for dtype in ("bfloat16", "float32"):
            for task in TASKS:
                reference = committed(args.model, task)
                n = args.n or (reference["n_asked"] if reference else 20)
                settings = RunSettings(args.model, task, n=n, device=args.device, dtype=dtype, progress=False)
                if args.device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                result = run(settings, ["cosine", "logit_lens"], Path(scratch) / dtype / task)
                records = result.metadata["probes"]
                times = "  ".join(f"{p} {r['seconds']:.1f} s" for p, r in records.items())
                if any(r.get("shared_pass") for r in records.values()):  # one pass, its seconds split by operations
                    times += f" (one shared pass: {sum(r['seconds'] for r in records.values()):.1f} s)"
                peak = torch.cuda.max_memory_allocated() / 2**20 if args.device.startswith("cuda") else float("nan")
                print(f"{dtype:8s} {task:9s} n={n:3d}  {times}  peak GPU memory {peak:.0f} MB")
                eds.setdefault(dtype, {})[task] = result.summary
            causal_ratios(load_model(args.model, device=args.device, dtype=dtype, progress=False), args, dtype)
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    print("ED [95% interval] per rule: bfloat16 here | float32 here | committed float32 (CPU), same prompts")

    def cell(entry: dict) -> str:
        return f"{entry.get('ed')} [{entry.get('ci_low')}–{entry.get('ci_high')}]"

    for task in TASKS:
        reference = committed(args.model, task) or {}
        for rule in RULES:
            bf16, f32 = eds["bfloat16"][task].get(rule) or {}, eds["float32"][task].get(rule) or {}
            theirs = reference.get(rule) or {}
            verdict = "same ED" if bf16.get("ed") == theirs.get("ed") else "ED differs"
            print(f"  {task:9s} {rule:19s} {cell(bf16)} | {cell(f32)} | {cell(theirs)}  {verdict}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
