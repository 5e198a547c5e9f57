"""Five tools side by side on the same local model: effdepth, TransformerLens, nnsight, tuned-lens and
plain transformers, each doing the logit lens (per-layer KL to the output, and the top-1 token per
layer and position of one prompt) and layer skipping (the KL at the output when a layer is skipped).

The peers live in their own virtual environment, ``.compute/peers`` (torch CPU, transformers,
transformer-lens, nnsight, tuned-lens), not in the project's; effdepth is imported from the checkout
(``PYTHONPATH=.``). Run from the repository root, on one core::

    PYTHONPATH=. taskset -c 1 .compute/peers/bin/python benchmarks/peers.py   # --prompts 8 --no-memory

It runs the first 3 of the 8 hard-coded prompts by default (``--prompts N``): with 3 the whole run
(timing, then one subprocess per (tool, task) for memory) takes about 14 minutes on one core of
this project's 2-core CPU machine; the peers' layer skipping is one full forward pass per layer.
effdepth needs polars in that environment (``.compute/peers/bin/pip install polars==2.1.0``).

Each tool's part is a function below whose body is the code a user of that tool writes (``lines``
counts its non-blank, non-comment lines, docstring excluded); what each tool needs loaded once (a
TransformerLens bridge, an nnsight wrapper, a tuned-lens ``LogitLens``) is in ``setup`` and not
counted (tuned-lens 0.2.0 needs a one-line patch there to run beside TransformerLens 4). For each
(tool, task) the script prints: lines; compute seconds (the call only, model and tool loaded, after
one warm-up call on a short prompt; median of 3 repeats, the tools interleaved; the first repeat's
result is the one compared); peak memory (in a fresh subprocess per (tool, task), after the same
warm-up: the peak resident set during the call above the resident set just before it, the peak
reset through ``/proc/self/clear_refs``); agreement with effdepth (max |difference| of the per-layer
curve; the share of (layer, position) cells whose top-1 token is effdepth's). One torch thread; the
model is smollm2-135m from effdepth's offline cache (float32, CPU). tuned-lens cannot skip a layer as
effdepth does (see ``NOT_DONE``): its ``delete_layers`` is run once, as a different quantity.

What is compared, computed as effdepth computes it:
- logit lens: KL(q_l || p) in nats, q_l = softmax(head(final_norm(h_l))) with h_l the input of layer
  l (l = 0..L-1; layer L is the output itself, KL 0) and p the model's output distribution, averaged
  over every token of every prompt (``token_weighted_mean``);
- skipping: layer l's output replaced by its input at positions 1.. (effdepth's ``current`` variant
  leaves position 0 unskipped), then KL(p || p_skip) at the output, max over the prompt's tokens,
  mean over the prompts (``skip_effects(..., skip_variants="current", output_metric="kl")``, then
  ``skip_summary``'s ``mean``).
Every tool gets the same token ids (the tokenizer's own encoding, as effdepth's ``encode``).
"""

from __future__ import annotations

import argparse
import ast
import copy
import gc
import inspect
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import textwrap
import time
from importlib.metadata import version
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub: the model comes from effdepth's offline cache

import numpy as np
import torch

MODEL = "smollm2-135m"
REPEATS = 3
# 8 short GSM8K-style questions, hard-coded so that every tool sees the same tokens
PROMPTS = [
    "Question: Tom has 5 apples and buys 7 more. How many apples does he have now?\nAnswer:",
    "Question: A train travels 60 miles per hour for 3 hours. How far does it go?\nAnswer:",
    "Question: Sara reads 12 pages a day. How many pages does she read in a week?\nAnswer:",
    "Question: A box holds 24 pencils. If 9 are red, how many are not red?\nAnswer:",
    "Question: Five friends share 40 cookies equally. How many cookies does each friend get?\nAnswer:",
    "Question: A shirt costs $15 and is on sale for 20% off. What is the sale price?\nAnswer:",
    "Question: Mia had 30 stickers, gave away 8 and got 5 more. How many stickers does she have?\nAnswer:",
    "Question: A garden has 6 rows of 8 tomato plants. How many tomato plants are there?\nAnswer:",
]
WARM_UP = ["Question: What is 2 + 3?\nAnswer:"]  # the memory workers' first call, before the measured one
TOOLS = ("effdepth", "transformer-lens", "nnsight", "tuned-lens", "transformers")
TASKS = ("lens", "tokens", "skip")
PACKAGES = ("torch", "transformers", "transformer-lens", "nnsight", "tuned-lens", "polars", "numpy")


# --- effdepth ----------------------------------------------------------------------------------


def effdepth_lens(model, _, tokenizer, prompts):
    import effdepth_core
    from effdepth_core.measurement.probes import token_weighted_mean

    frame = effdepth_core.logit_lens(model, prompts, tokenizer=tokenizer)
    return token_weighted_mean(frame).filter(metric="kl").sort("layer")["value"].to_numpy()


def effdepth_tokens(model, _, tokenizer, prompt):
    from effdepth_core.measurement.probes import lens_by_token, prediction_table

    table = prediction_table(lens_by_token(model, prompt, tokenizer=tokenizer, top_k=1), 0)
    return [list(row[1:]) for row in table.iter_rows()]  # [layer][position], column 0 is the layer


def effdepth_skip(model, _, tokenizer, prompts):
    import effdepth_core
    from effdepth_core.measurement.probes import skip_summary

    frame = effdepth_core.skip_effects(
        model, prompts, tokenizer=tokenizer, skip_parts="layer", skip_variants="current", output_metric="kl"
    )
    return skip_summary(frame.filter(metric="output_kl")).sort("skipped_layer")["mean"].to_numpy()


# --- plain transformers ------------------------------------------------------------------------


def transformers_lens(model, _, tokenizer, prompts):
    kls = []  # per prompt: [layer, token]
    with torch.inference_mode():
        for prompt in prompts:
            out = model(tokenizer(prompt, return_tensors="pt").input_ids, output_hidden_states=True)
            p = out.logits[0].log_softmax(-1)
            # hidden_states[l] is layer l's input; the last one is normed already: its decode is the output
            qs = [model.lm_head(model.model.norm(h[0])).log_softmax(-1) for h in out.hidden_states[:-1]]
            kls.append(torch.stack([(q.exp() * (q - p)).sum(-1) for q in [*qs, p]]))
    return torch.cat(kls, dim=1).mean(1).numpy()


def transformers_tokens(model, _, tokenizer, prompt):
    with torch.inference_mode():
        out = model(tokenizer(prompt, return_tensors="pt").input_ids, output_hidden_states=True)
        top = [model.lm_head(model.model.norm(h[0])).argmax(-1) for h in out.hidden_states[:-1]]
        top.append(out.logits[0].argmax(-1))
    return [[tokenizer.decode([i]) for i in layer.tolist()] for layer in top]


def transformers_skip(model, _, tokenizer, prompts):
    def skip(module, args, output):  # the layer's output is its input, except at position 0 (as effdepth)
        return torch.cat([output[:, :1], args[0][:, 1:]], dim=1)

    effects = []  # per prompt: [skipped layer]
    with torch.inference_mode():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            p = model(ids).logits[0].log_softmax(-1)
            row = []
            for layer in model.model.layers:
                handle = layer.register_forward_hook(skip)
                q = model(ids).logits[0].log_softmax(-1)
                handle.remove()
                row.append((p.exp() * (p - q)).sum(-1).max())
            effects.append(torch.stack(row))
    return torch.stack(effects).mean(0).numpy()


# --- TransformerLens (4.x: TransformerBridge) ---------------------------------------------------


def transformer_lens_lens(_, bridge, tokenizer, prompts):
    from transformer_lens.tools.analysis import logit_lens

    kls = []
    with torch.inference_mode():
        for prompt in prompts:
            tokens = tokenizer(prompt, return_tensors="pt").input_ids
            logp = logit_lens(bridge, tokens, positions=None, return_type="log_probs").values[:, 0]
            kls.append((logp.exp() * (logp - logp[-1])).sum(-1))  # the last stack entry is the output
    return torch.cat(kls, dim=1).mean(1).numpy()


def transformer_lens_tokens(_, bridge, tokenizer, prompt):
    from transformer_lens.tools.analysis import logit_lens

    tokens = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        result = logit_lens(bridge, tokens, positions=None, top_k=1)
    return [[top[0] for top in layer[0]] for layer in result.top_tokens(tokenizer).values()]


def transformer_lens_skip(_, bridge, tokenizer, prompts):
    effects = []
    with torch.inference_mode():
        for prompt in prompts:
            tokens = tokenizer(prompt, return_tensors="pt").input_ids
            logits, cache = bridge.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_resid_pre"))
            p = logits[0].log_softmax(-1)
            row = []
            for layer in range(bridge.cfg.n_layers):
                # resid_post := resid_pre (unchanged by a skip at this layer), except at position 0
                def skip(resid, hook, pre=cache[f"blocks.{layer}.hook_resid_pre"]):
                    return torch.cat([resid[:, :1], pre[:, 1:]], dim=1)

                q = bridge.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.hook_resid_post", skip)])
                q = q[0].log_softmax(-1)
                row.append((p.exp() * (p - q)).sum(-1).max())
            effects.append(torch.stack(row))
    return torch.stack(effects).mean(0).numpy()


# --- nnsight ------------------------------------------------------------------------------------


def nnsight_lens(_, lm, tokenizer, prompts):
    import nnsight

    kls = []
    with torch.no_grad():
        for prompt in prompts:
            with lm.trace(tokenizer(prompt, return_tensors="pt").input_ids):
                qs = nnsight.save([lm.lm_head(lm.model.norm(layer.input)).log_softmax(-1) for layer in lm.model.layers])
                p = lm.lm_head.output.log_softmax(-1).save()
            qs = torch.cat([*qs, p])  # [layer, token, vocab]
            kls.append((qs.exp() * (qs - p)).sum(-1))
    return torch.cat(kls, dim=1).mean(1).numpy()


def nnsight_tokens(_, lm, tokenizer, prompt):
    import nnsight

    with torch.no_grad(), lm.trace(tokenizer(prompt, return_tensors="pt").input_ids):
        top = nnsight.save([lm.lm_head(lm.model.norm(layer.input)).argmax(-1) for layer in lm.model.layers])
        top.append(lm.lm_head.output.argmax(-1))
    return [[tokenizer.decode([i]) for i in layer[0].tolist()] for layer in top]


def nnsight_skip(_, lm, tokenizer, prompts):
    effects = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            with lm.trace(ids):
                p = lm.lm_head.output[0].log_softmax(-1).save()
            row = []
            for layer in lm.model.layers:
                with lm.trace(ids):
                    layer.output[:, 1:] = layer.input[:, 1:]  # skipped, except at position 0 (as effdepth)
                    q = lm.lm_head.output[0].log_softmax(-1).save()
                row.append((p.exp() * (p - q)).sum(-1).max())
            effects.append(torch.stack(row))
    return torch.stack(effects).mean(0).numpy()


# --- tuned-lens (its LogitLens and PredictionTrajectory) ----------------------------------------


def tuned_lens_lens(model, lens, tokenizer, prompts):
    from tuned_lens.plotting import PredictionTrajectory

    kls = []
    for prompt in prompts:
        traj = PredictionTrajectory.from_lens_and_model(lens, model, tokenizer(prompt).input_ids, tokenizer)
        output = PredictionTrajectory(np.broadcast_to(traj.model_log_probs, traj.log_probs.shape), traj.input_ids)
        kls.append(traj.kl_divergence(output).stats)  # KL(lens || output), [layer, token]
    return np.concatenate(kls, axis=1).mean(1)


def tuned_lens_tokens(model, lens, tokenizer, prompt):
    from tuned_lens.plotting import PredictionTrajectory

    traj = PredictionTrajectory.from_lens_and_model(lens, model, tokenizer(prompt).input_ids, tokenizer)
    return [[tokenizer.decode([i]) for i in layer] for layer in traj.log_probs.argmax(-1).tolist()]


def tuned_lens_delete_layers(model, lens, tokenizer, prompts):
    from tuned_lens.model_surgery import delete_layers

    effects = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            p = model(ids).logits[0].log_softmax(-1)
            row = []
            for layer in range(model.config.num_hidden_layers):
                with delete_layers(model, [layer]):  # gone at every position, position 0 included
                    q = model(ids).logits[0].log_softmax(-1)
                row.append((p.exp() * (p - q)).sum(-1).max())
            effects.append(torch.stack(row))
    return torch.stack(effects).mean(0).numpy()


CALLS = {
    "effdepth": (effdepth_lens, effdepth_tokens, effdepth_skip),
    "transformers": (transformers_lens, transformers_tokens, transformers_skip),
    "transformer-lens": (transformer_lens_lens, transformer_lens_tokens, transformer_lens_skip),
    "nnsight": (nnsight_lens, nnsight_tokens, nnsight_skip),
    "tuned-lens": (tuned_lens_lens, tuned_lens_tokens, None),
}
NOT_DONE = {
    ("tuned-lens", "skip"): "tuned-lens cannot compute effdepth's skip: its layer tools act on every position, "
    "position 0 included (model_surgery.delete_layers; causal.ablation.ablate_layer(method='zero') also fails "
    "under transformers 5, whose decoder layers return a tensor, not the tuple its hook unpacks). "
    "delete_layers is run once below, as a different quantity, not timed",
}


# --- harness ------------------------------------------------------------------------------------


def load():
    import effdepth_core

    torch.set_num_threads(1)
    offline = effdepth_core.load_model(MODEL, progress=False)
    return offline.model, offline.tokenizer


def setup(tool, model, tokenizer):
    """What the tool needs loaded once (not counted in its lines, not timed). TransformerLens and
    nnsight get their own copy of the model: both change the module they wrap (the bridge switches
    it to eager attention, nnsight installs hooks on every module), which would change the others'."""
    if tool == "transformer-lens":
        from transformer_lens.model_bridge import TransformerBridge

        own = copy.deepcopy(model)
        return TransformerBridge.boot_transformers(own.config._name_or_path, hf_model=own, tokenizer=tokenizer)
    if tool == "nnsight":
        from nnsight import TransformersModel

        return TransformersModel(copy.deepcopy(model), task="text-generation", tokenizer=copy.deepcopy(tokenizer))
    if tool == "tuned-lens":
        from tuned_lens import model_surgery
        from tuned_lens.nn import LogitLens

        # tuned-lens 0.2.0 tests isinstance(model, transformer_lens.HookedTransformer) when
        # transformer_lens imports, and TransformerLens 4 raises ImportError for that removed name
        model_surgery._transformer_lens_available = False
        return LogitLens.from_model(model)
    return None


def run(model, handle, tokenizer, tool, task, prompts):
    fn = CALLS[tool][TASKS.index(task)]
    return fn(model, handle, tokenizer, prompts[0] if task == "tokens" else prompts)


def count_lines(fn) -> int:
    """Non-blank, non-comment lines of a function's body, its docstring excluded."""
    source = textwrap.dedent(inspect.getsource(fn))
    body = ast.parse(source).body[0].body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    lines = source.splitlines()[body[0].lineno - 1 : body[-1].end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def worker(tool: str, task: str, n_prompts: int) -> None:
    """In a fresh process: load, set up, one warm-up call on a short prompt, then the measured call."""
    model, tokenizer = load()
    handle = setup(tool, model, tokenizer)
    run(model, handle, tokenizer, tool, task, WARM_UP)
    gc.collect()
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current resident set
    run(model, handle, tokenizer, tool, task, PROMPTS[:n_prompts])
    peak = _status("VmHWM")
    print(json.dumps({"peak_mb": (peak - before) / 2**20, "rss_mb": before / 2**20}))


def peak_memory(tool: str, task: str, n_prompts: int) -> float:
    command = [sys.executable, __file__, "--worker", tool, task, "--prompts", str(n_prompts)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mb"]


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    name = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), platform.processor())
    cores = sorted(os.sched_getaffinity(0))
    return f"{name}, {os.cpu_count()} cores; ran on core(s) {cores}, torch threads {torch.get_num_threads()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3, help=f"how many of the {len(PROMPTS)} prompts (default 3)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--worker", nargs=2, metavar=("TOOL", "TASK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args.prompts)
        return
    started, load_before = time.perf_counter(), os.getloadavg()
    prompts = PROMPTS[: args.prompts]
    model, tokenizer = load()
    handles = {tool: setup(tool, model, tokenizer) for tool in TOOLS}
    todo = [(tool, task) for task in TASKS for tool in TOOLS if (tool, task) not in NOT_DONE]
    for tool, task in todo:  # warm-up: the first call of each is slower
        run(model, handles[tool], tokenizer, tool, task, WARM_UP)
    results, times = {}, {key: [] for key in todo}
    for _ in range(REPEATS):  # interleaved: a slow spell of the machine hits every tool
        for tool, task in todo:
            start = time.perf_counter()
            result = run(model, handles[tool], tokenizer, tool, task, prompts)
            times[tool, task].append(time.perf_counter() - start)
            results.setdefault((tool, task), result)  # the first repeat's is compared
    start = time.perf_counter()  # once, not timed against the others: a different quantity (see NOT_DONE)
    results["tuned-lens", "delete_layers"] = tuned_lens_delete_layers(model, handles["tuned-lens"], tokenizer, prompts)
    times["tuned-lens", "delete_layers"] = [time.perf_counter() - start]
    memory = {} if args.no_memory else {key: peak_memory(*key, args.prompts) for key in todo if key[1] != "tokens"}
    loads = (load_before, os.getloadavg())
    report(results, times, memory, time.perf_counter() - started, tokenizer, prompts, loads)


def report(results, times, memory, elapsed, tokenizer, prompts, loads) -> None:
    n_tokens = [len(tokenizer(p).input_ids) for p in prompts]

    def cell(tool, task, what):
        if (tool, task) in NOT_DONE:
            return "n/a"
        if what == "lines":
            return str(count_lines(CALLS[tool][TASKS.index(task)]))
        if what == "s":
            return f"{statistics.median(times[tool, task]):.2f}"
        if what == "MB":
            return f"{memory[tool, task]:.0f}" if (tool, task) in memory else "-"
        ours, theirs = results["effdepth", task], results[tool, task]
        if task == "tokens":
            same = [a == b for row, other in zip(ours, theirs, strict=True) for a, b in zip(row, other, strict=True)]
            return f"{np.mean(same):.3f} ({sum(same)}/{len(same)})"
        return f"{np.max(np.abs(np.asarray(theirs, dtype=float) - ours)):.1e}"

    columns = [
        ("tool", None, None),
        ("lens lines", "lens", "lines"),
        ("lens s", "lens", "s"),
        ("lens peak MB", "lens", "MB"),
        ("lens max|Δ|", "lens", "agree"),
        ("per-token top-1 agreement", "tokens", "agree"),
        ("skip lines", "skip", "lines"),
        ("skip s", "skip", "s"),
        ("skip max|Δ|", "skip", "agree"),
        ("per-token lines", "tokens", "lines"),
        ("per-token s", "tokens", "s"),
        ("skip peak MB", "skip", "MB"),
    ]
    rows = [[tool, *(cell(tool, task, what) for _, task, what in columns[1:])] for tool in TOOLS]
    widths = [max(len(c[0]), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    print(" | ".join(c[0].ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    print()
    for (tool, task), why in NOT_DONE.items():
        print(f"n/a ({tool}, {task}): {why}")
    deleted = results["tuned-lens", "delete_layers"]
    print(
        f"tuned-lens delete_layers (layer l removed at every position): {count_lines(tuned_lens_delete_layers)} lines, "
        f"{times['tuned-lens', 'delete_layers'][0]:.2f} s (one call), "
        f"max|Δ| vs effdepth's skip {np.max(np.abs(deleted - results['effdepth', 'skip'])):.3f} nats "
        f"(at layer {int(np.argmax(np.abs(deleted - results['effdepth', 'skip'])))})"
    )
    print(
        f"max|Δ|: max over layers of |tool − effdepth| (nats); agreement: share of the first prompt's "
        f"(layer, position) cells, layers 0..L, with effdepth's top-1 token; s: median of {REPEATS}; "
        "peak MB: peak RSS during the call above RSS before it, fresh process"
    )
    print(
        f"model: {MODEL} (float32, CPU); {len(prompts)} of the {len(PROMPTS)} prompts, "
        f"{sum(n_tokens)} tokens {n_tokens}"
    )
    print(
        "effdepth lens KL per layer 0..L:",
        np.array2string(results["effdepth", "lens"], precision=3, max_line_width=120),
    )
    print(
        "effdepth skip KL per skipped layer 0..L-1:",
        np.array2string(results["effdepth", "skip"], precision=3, max_line_width=120),
    )
    print(
        "versions:",
        ", ".join(f"{p} {version(p)}" for p in PACKAGES),
        f"(effdepth: the checkout); python {platform.python_version()}",
    )
    print("machine:", machine())
    print(
        "load average (1, 5, 15 min) at start {:.2f} {:.2f} {:.2f}, at end {:.2f} {:.2f} {:.2f}".format(
            *loads[0], *loads[1]
        )
    )
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(f"command: PYTHONPATH=. taskset -c 1 .compute/peers/bin/python benchmarks/peers.py {argv}".rstrip())
    print(f"total wall time: {elapsed:.0f} s")


if __name__ == "__main__":
    main()
