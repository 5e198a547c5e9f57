"""Quantization control (issue 30, item 4): how far does one more lossy quantization step move the
primary depth statistic? The book's models are 4-bit GGUF checkpoints dequantized to float32; the
paper's are bf16. This requantizes every weight matrix of a model once more (the ``gguf`` package's
own quantizer, round trip through ``--quant``, Q4_0 by default: a coarser format than the files'
Q4_K_M blocks) and measures the cosine and logit lens on the prompts of the book's committed cells
(n = 20 HellaSwag and GSM8K, read from their ``examples.jsonl``), before and after, paired.

    python benchmarks/quantization_control.py [--models smollm2-135m,qwen2.5-coder-0.5b] [--quant Q4_0] [--save]

Per model, task and rule it prints the primary statistic before and after (layers) and the paired
difference after − before with its 95 % bootstrap interval over prompts (2000 resamples), beside the
integer ED's. A shift well inside one layer says the models' 4-bit origin does not decide a verdict
whose margin is at least a layer. ``--save`` merges the rows into ``book/results/quantization_control.json``
(a file this script writes and only this script overwrites), which the scale page reads to state the
control's size next to its verdict.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from effdepth_core.measurement import registry
from effdepth_core.measurement.depth import difference_draws, interval, primary_statistic
from effdepth_core.measurement.probes import logit_lens, residual_cosine
from effdepth_core.models import load_model
from effdepth_core.settings import RunSettings

RESULTS = Path(__file__).resolve().parents[1] / "book" / "results"
RULES = ("cosine", "logit_lens_kl", "logit_lens_overlap")
SAVED = RESULTS / "quantization_control.json"
MARK = '{"written_by": "effdepth benchmarks/quantization_control.py"'  # the claim: only such a file is overwritten
BLOCK = 32  # every GGUF block format quantizes rows in blocks of 32 (or 256) values


def requantize(model: torch.nn.Module, kind: GGMLQuantizationType) -> int:
    """Round-trip every 2-D weight whose rows split into blocks through ``kind``, in place; the
    number of tensors changed."""
    changed = 0
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim != 2 or parameter.shape[-1] % BLOCK:
                continue
            weights = parameter.detach().to(torch.float32).cpu().numpy()
            restored = quants.dequantize(quants.quantize(weights, kind), kind).reshape(weights.shape)
            parameter.copy_(torch.from_numpy(np.ascontiguousarray(restored)).to(parameter.dtype))
            changed += 1
    return changed


def frames(loaded, prompts: list[str], settings: RunSettings) -> dict[str, object]:
    """The per-example frames of the cosine and logit-lens probes, as the book's runs compute them."""
    return {
        "cosine": residual_cosine(loaded, prompts, batch_size=settings.batch_size, progress=False),
        "logit_lens": logit_lens(loaded, prompts, top_k=settings.top_k, batch_size=settings.batch_size, progress=False),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--tasks", default="hellaswag,gsm8k")
    parser.add_argument("--quant", default="Q4_0", help="a gguf quantization type with a numpy quantizer")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap seed (default 0)")
    parser.add_argument(
        "--save", action="store_true", help=f"merge the rows into {SAVED.relative_to(RESULTS.parents[1])}"
    )
    args = parser.parse_args()
    try:
        kind = GGMLQuantizationType[args.quant]
    except KeyError:
        parser.error(f"--quant {args.quant!r} is not a gguf quantization type (e.g. Q4_0, Q8_0, Q5_0)")
    models, tasks = args.models.split(","), args.tasks.split(",")
    cells = {(m, t): RESULTS / m / f"{t}-n20-seed0" / "examples.jsonl" for m in models for t in tasks}
    missing = [str(p) for p in cells.values() if not p.is_file()]
    if missing:
        parser.error(f"no committed cell for {', '.join(missing)}")
    rules = registry.rules()
    saved: list[dict] = []
    print(f"requantized once more through {args.quant}; paired over the book's n = 20 prompts; 95 % intervals")
    print(f"{'model':19s} {'task':9s} {'rule':19s} {'before':>7s} {'after':>7s} {'shift [95 % interval]':>25s} "
          f"{'ED shift':>9s}")  # fmt: skip
    for model in models:
        started = time.perf_counter()
        loaded = load_model(model, progress=False)
        before, after = {}, {}
        prompts = {t: [json.loads(line)["prompt"] for line in cells[model, t].read_text().splitlines()] for t in tasks}
        settings = RunSettings(model, tasks[0], n=20, progress=False)
        for task in tasks:
            before[task] = frames(loaded, prompts[task], settings)
        changed = requantize(loaded.model, kind)
        for task in tasks:
            after[task] = frames(loaded, prompts[task], settings)
        n_layers = len(loaded.layers)
        for task in tasks:
            for key in RULES:
                spec, rule = rules[key]
                frame = rule.frame or spec.name
                statistic = primary_statistic(rule)
                common = (rule, after[task][frame], before[task][frame], (n_layers, n_layers), settings, True)
                shift = interval(*difference_draws(*common, n_bootstrap=2000, seed=args.seed, statistic=statistic))
                ed = interval(*difference_draws(*common, n_bootstrap=2000, seed=args.seed, statistic="ed"))
                base = _point(rule, before[task][frame], n_layers, settings, statistic)
                moved = _point(rule, after[task][frame], n_layers, settings, statistic)
                text = (
                    f"{shift['point']:+.2f} [{shift['low']:+.2f}, {shift['high']:+.2f}]"
                    if shift["point"] is not None
                    else "undefined"
                )
                ed_text = f"{ed['point']:+.0f}" if ed["point"] is not None else "—"
                saved.append({"model": model, "task": task, "rule": key, "quant": args.quant, "n": len(prompts[task]),
                              "seed": args.seed, "before": base, "after": moved, "shift": shift["point"],
                              "low": shift["low"], "high": shift["high"], "ed_shift": ed["point"]})  # fmt: skip
                print(f"{model:19s} {task:9s} {key:19s} {_fmt(base):>7s} {_fmt(moved):>7s} {text:>25s} {ed_text:>9s}",
                      flush=True)  # fmt: skip
        print(f"  ({model}: {changed} weight matrices requantized, {time.perf_counter() - started:.0f} s)", flush=True)
        del loaded
    if args.save:
        save(saved)


def save(rows: list[dict]) -> None:
    """Merge ``rows`` into ``SAVED`` (a row per model, task, rule and quantization type; a new
    measurement replaces the old one), never over a file this script did not write."""
    from effdepth_book.runner import write_generated
    from effdepth_core.cache import read_json

    kept = []
    if SAVED.is_file() and not SAVED.is_symlink() and SAVED.read_text(encoding="utf-8").startswith(MARK):
        kept = list(read_json(SAVED)["rows"])
    new = {(r["model"], r["task"], r["rule"], r["quant"]) for r in rows}
    merged = [r for r in kept if (r["model"], r["task"], r["rule"], r["quant"]) not in new] + rows
    merged.sort(key=lambda r: (r["model"], r["task"], r["rule"], r["quant"]))
    body = json.dumps(merged, indent=1, allow_nan=False)  # a non-finite shift is never written
    write_generated(SAVED, f'{MARK},\n "rows": {body}}}\n', MARK)
    print(f"  saved {len(rows)} rows to {SAVED}")


def _point(rule, frame, n_layers, settings, statistic) -> float | None:
    from effdepth_core.measurement.depth import depth_samples

    point, _ = depth_samples(rule, frame, n_layers, settings, np.ones((0, frame["example"].n_unique())), statistic)
    return point


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
