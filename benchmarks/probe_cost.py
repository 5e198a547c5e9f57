"""Cost of the residual and logit-lens probes relative to a plain forward pass, in one run.

    python benchmarks/probe_cost.py --model smollm2-135m [--task gsm8k --n 4 --repeats 5]

Prints (all measured in this run, on the same prompts; each time the median [min–max] of ``--repeats``
calls after a warm-up call, the ratios of medians):
- residual probe time ÷ plain forward time            (goal ≤ 1.3)
- logit lens time ÷ its floor, where floor = forward + L head projections of every token
  (timed here as the same head matmuls alone)           (goal ≤ 1.5)
- the lens's peak extra resident memory over the start of the call, for the full model and a copy
  truncated to half its layers (goal: does not grow with layers)
"""

from __future__ import annotations

import argparse

import torch
from measure import PeakRSS, repeated

from effdepth_core.measurement.probes import logit_lens, residual_cosine
from effdepth_core.measurement.trace import forward, iter_batches, tokenize
from effdepth_core.models import load_model, truncate_layers
from effdepth_core.task_loading import load_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", default="gsm8k")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    loaded = load_model(args.model, device=args.device)
    prompts = [e.prompt for e in load_task(args.task, n=args.n, seed=0)]
    tokens = tokenize(loaded, prompts)
    batches = list(iter_batches(tokens, args.batch_size, loaded.input_device))
    n_tokens = sum(t.numel() for t in tokens)

    def plain_forward() -> None:
        for batch in batches:
            forward(loaded, batch, head=True)

    chunk = 512
    finals = [forward(loaded, b).last_hidden_state[b.mask] for b in batches]  # [token, d_model] per batch

    def head_projections() -> None:  # the lens's unavoidable work beyond the forward: L head matmuls
        with torch.inference_mode():
            for _ in range(loaded.n_layers):
                for final in finals:
                    for start in range(0, final.shape[0], chunk):
                        loaded.head(final[start : start + chunk])

    forward_time = repeated(plain_forward, args.repeats)  # each path warmed up by one untimed call
    residual_time = repeated(lambda: residual_cosine(loaded, prompts, batch_size=args.batch_size), args.repeats)
    heads_time = repeated(head_projections, args.repeats)
    lens_time = repeated(lambda: logit_lens(loaded, prompts, batch_size=args.batch_size), args.repeats)
    t_forward, t_residual, t_heads, t_lens = (t.median for t in (forward_time, residual_time, heads_time, lens_time))
    floor = t_forward + t_heads

    half = truncate_layers(loaded, loaded.n_layers // 2)
    memory = {}
    for label, model in (("full", loaded), ("half", half)):
        with PeakRSS() as forward_peak:
            for batch in batches:
                forward(model, batch, head=True)
        with PeakRSS() as lens_peak:
            logit_lens(model, prompts, batch_size=args.batch_size)
        memory[label] = (model.n_layers, forward_peak.extra_mb, lens_peak.extra_mb)

    print(
        f"model {loaded.name} ({loaded.n_layers} layers, vocab {loaded.vocab_size}), task {args.task}, "
        f"{len(prompts)} prompts, {n_tokens} tokens, device {args.device}, {torch.get_num_threads()} threads"
    )
    print(f"plain forward            {forward_time}")
    print(f"residual probe           {residual_time}   ratio to forward {t_residual / t_forward:5.2f}  (goal ≤ 1.3)")
    print(f"L head projections       {heads_time}")
    print(f"lens floor (fwd + heads) {floor:.2f} s (medians)")
    print(
        f"logit lens               {lens_time}   ratio to floor   {t_lens / floor:5.2f}  (goal ≤ 1.5), "
        f"to forward {t_lens / t_forward:.2f}"
    )
    for label, (layers, fwd_mb, lens_mb) in memory.items():
        print(f"peak extra RSS, {label:4s} ({layers:2d} layers): ", end="")
        print(f"plain forward {fwd_mb:7.1f} MB, logit lens {lens_mb:7.1f} MB")
    full, half_ = memory["full"][2], memory["half"][2]
    print(f"lens extra memory, full ÷ half layers: {full / max(half_, 1e-9):.2f}  (goal ≈ 1: does not grow with depth)")


if __name__ == "__main__":
    main()
