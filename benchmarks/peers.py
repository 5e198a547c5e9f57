"""Five tools side by side on the same local model: effdepth, TransformerLens, nnsight, tuned-lens and
plain transformers, each doing the logit lens (per-layer KL to the output, and the top-1 token per
layer and position of one prompt) and layer skipping (the KL at the output when a layer is skipped).

The peers live in their own virtual environment, ``.compute/peers`` (torch CPU, transformers,
transformer-lens, nnsight, tuned-lens, and polars for effdepth), not in the project's; effdepth is
imported from the checkout (``PYTHONPATH=.``). Run from the repository root, on one core::

    PYTHONPATH=. taskset -c 1 .compute/peers/bin/python benchmarks/peers.py   # --prompts 6 --skip-prompts 6

``--tasks`` splits the run (e.g. ``lens tokens`` on one core, ``skip`` and then ``skip-batched`` on
the other); ``skip-batched`` alone brings effdepth's replay along, what the batched skips are
compared against.

The workload (``--workload gsm8k``, the default) is effdepth's default GSM8K sample (seed 0, the
vendored test set; question, worked answer and final answer, as its runs probe them): the lens runs
on the first ``--prompts`` of them (6: 1,087 tokens), skipping on the first ``--skip-prompts`` (6,
the same tokens; every peer's loop is one full forward pass per layer, so fewer shorten the run);
the per-token table is one short prompt's. ``--workload short`` takes the 8 short hard-coded
questions instead (about 24 tokens each).

Each tool's part is a function below whose body is the code a user of that tool writes (``lines``
counts its non-blank, non-comment lines, docstring excluded); what each tool needs loaded once (a
TransformerLens bridge, an nnsight wrapper, a tuned-lens ``LogitLens``) is in ``setup`` and not
counted (tuned-lens 0.2.0 needs a one-line patch there to run beside TransformerLens 4). Skipping is
done twice by the peers that can batch it: a loop of one forward per skipped layer as their
tutorials write it, and a user's best batched version (``*_skip_batched``: all L variants as one
batch of L + 1 rows of the prompt, row i skipping layer i through a hook, the last row skipping
nothing), against effdepth's replay. For each (tool, task) the script prints: lines; compute
seconds (the call only, model and tool loaded; every path first called once on a short prompt, then
``--warmup`` untimed calls on the full workload, then ``--repeats`` timed calls, the paths
interleaved so that a slow spell of the machine hits every tool; median and min–max through
``measure.repeated``; the first full call's result is the one compared); peak memory (in a fresh
subprocess per (tool, task), after a warm-up call on a short prompt: the peak resident set during
the call above the resident set just before it, the peak reset through ``/proc/self/clear_refs``);
agreement with effdepth (max |difference| of the per-layer curve; the share of (layer, position)
cells whose top-1 token is effdepth's). One torch thread; the model is smollm2-135m from effdepth's
offline cache (float32, CPU). TransformerLens 4 runs eager attention whatever the model's setting
(its bridge reimplements attention so that its pattern hooks fire; printed with the table); the
others run the model's sdpa. tuned-lens cannot skip a layer as effdepth does (see ``NOT_DONE``):
its ``delete_layers`` is run once, as a different quantity.

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
# 8 short GSM8K-style questions (--workload short; the first is the per-token table's prompt)
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
WARM_UP = ["Question: What is 2 + 3?\nAnswer:"]  # every path's first call, before the timed ones
TOOLS = ("effdepth", "transformer-lens", "nnsight", "tuned-lens", "transformers")
TASKS = ("lens", "tokens", "skip", "skip-batched")
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


def transformers_skip_batched(model, _, tokenizer, prompts):
    n = model.config.num_hidden_layers

    def skip_in_row(row):  # batch row `row` skips this layer, except at position 0 (as effdepth)
        def skip(module, args, output):
            output[row, 1:] = args[0][row, 1:]
            return output

        return skip

    handles = [layer.register_forward_hook(skip_in_row(i)) for i, layer in enumerate(model.model.layers)]
    effects = []  # per prompt: [skipped layer]
    try:
        with torch.inference_mode():
            for prompt in prompts:
                ids = tokenizer(prompt, return_tensors="pt").input_ids
                logp = model(ids.expand(n + 1, -1)).logits.log_softmax(-1)  # row n skips nothing
                p = logp[n]
                effects.append((p.exp() * (p - logp[:n])).sum(-1).max(-1).values)
    finally:
        for handle in handles:
            handle.remove()
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


def transformer_lens_skip_batched(_, bridge, tokenizer, prompts):
    n = bridge.cfg.n_layers
    effects = []  # per prompt: [skipped layer]
    with torch.inference_mode():
        for prompt in prompts:
            tokens = tokenizer(prompt, return_tensors="pt").input_ids.expand(n + 1, -1)  # row n skips nothing
            inputs = {}  # layer i → its input in row i, positions 1..
            hooks = []
            for i in range(n):  # row i skips layer i, except at position 0 (as effdepth)

                def keep(resid, hook, i=i, inputs=inputs):
                    inputs[i] = resid[i, 1:].clone()
                    return resid

                def skip(resid, hook, i=i, inputs=inputs):
                    resid[i, 1:] = inputs.pop(i)
                    return resid

                hooks += [(f"blocks.{i}.hook_resid_pre", keep), (f"blocks.{i}.hook_resid_post", skip)]
            logp = bridge.run_with_hooks(tokens, fwd_hooks=hooks).log_softmax(-1)
            p = logp[n]
            effects.append((p.exp() * (p - logp[:n])).sum(-1).max(-1).values)
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


def nnsight_skip_batched(_, lm, tokenizer, prompts):
    n = len(lm.model.layers)
    effects = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            with lm.trace(ids.expand(n + 1, -1)):  # row i skips layer i; row n skips nothing
                for i, layer in enumerate(lm.model.layers):
                    layer.output[i, 1:] = layer.input[i, 1:]  # except at position 0 (as effdepth)
                logp = lm.lm_head.output.log_softmax(-1).save()
            p = logp[n]
            effects.append((p.exp() * (p - logp[:n])).sum(-1).max(-1).values)
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
    "effdepth": {"lens": effdepth_lens, "tokens": effdepth_tokens, "skip": effdepth_skip},
    "transformer-lens": {
        "lens": transformer_lens_lens,
        "tokens": transformer_lens_tokens,
        "skip": transformer_lens_skip,
        "skip-batched": transformer_lens_skip_batched,
    },
    "nnsight": {
        "lens": nnsight_lens,
        "tokens": nnsight_tokens,
        "skip": nnsight_skip,
        "skip-batched": nnsight_skip_batched,
    },
    "tuned-lens": {"lens": tuned_lens_lens, "tokens": tuned_lens_tokens},
    "transformers": {
        "lens": transformers_lens,
        "tokens": transformers_tokens,
        "skip": transformers_skip,
        "skip-batched": transformers_skip_batched,
    },
}
NOT_DONE = {
    ("tuned-lens", "skip"): "tuned-lens cannot compute effdepth's skip: its layer tools act on every position, "
    "position 0 included (model_surgery.delete_layers; causal.ablation.ablate_layer(method='zero') also fails "
    "under transformers 5, whose decoder layers return a tensor, not the tuple its hook unpacks). "
    "delete_layers is run once below, as a different quantity, not timed",
}
ATTENTION_NOTE = (
    "TransformerLens {version} runs eager attention, not sdpa: boot_transformers forces the wrapped model to "
    "eager, and its {component} reimplements attention (matmul, softmax) so that hook_attn_scores and "
    "hook_pattern fire, whatever attn_implementation the HF model has: there is no sdpa option for this "
    "architecture. The other tools run the model's own attention ({hf})"
)


# --- harness ------------------------------------------------------------------------------------


def load():
    import effdepth_core

    torch.set_num_threads(1)
    offline = effdepth_core.load_model(MODEL, progress=False)
    return offline.model, offline.tokenizer


def workload(kind: str, n: int) -> list[str]:
    """The lens's prompts: the first ``n`` GSM8K test examples effdepth samples by default (seed 0;
    question, worked answer and final answer, as its runs probe them), or the short hard-coded ones."""
    if kind == "short":
        return PROMPTS[:n]
    from effdepth_core.task_loading import load_task

    return [example.prompt for example in load_task("gsm8k", n=n)]


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
    return CALLS[tool][task](model, handle, tokenizer, prompts[0] if task == "tokens" else prompts)


def task_prompts(task: str, lens_prompts: list[str], n_skip: int) -> list[str]:
    if task == "tokens":
        return PROMPTS[:1]  # one prompt's table of top-1 tokens
    return lens_prompts[:n_skip] if task.startswith("skip") else lens_prompts


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


def worker(tool: str, task: str, args) -> None:
    """In a fresh process: load, set up, one warm-up call on a short prompt, then the measured call."""
    model, tokenizer = load()
    handle = setup(tool, model, tokenizer)
    run(model, handle, tokenizer, tool, task, WARM_UP)
    prompts = task_prompts(task, workload(args.workload, args.prompts), args.skip_prompts)
    gc.collect()
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current resident set
    run(model, handle, tokenizer, tool, task, prompts)
    peak = _status("VmHWM")
    print(json.dumps({"peak_mb": (peak - before) / 2**20, "rss_mb": before / 2**20}))


def peak_memory(tool: str, task: str, args) -> float:
    command = [sys.executable, __file__, "--worker", tool, task, "--workload", args.workload]
    command += ["--prompts", str(args.prompts), "--skip-prompts", str(args.skip_prompts)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mb"]


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    name = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), platform.processor())
    cores = sorted(os.sched_getaffinity(0))
    return f"{name}, {os.cpu_count()} cores; ran on core(s) {cores}, torch threads {torch.get_num_threads()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("gsm8k", "short"), default="gsm8k", help="the prompts (default gsm8k)")
    parser.add_argument("--prompts", type=int, default=6, help="prompts for the lens (default 6: 1,087 tokens)")
    parser.add_argument("--skip-prompts", type=int, default=6, help="the first N of them for skipping (default 6)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each path (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls on the full workload first (default 1)")
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=TOOLS, help="a subset (effdepth always runs)")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=TASKS, help="a subset (default: all)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--worker", nargs=2, metavar=("TOOL", "TASK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args)
        return
    from measure import Timing, alternating

    started, load_before = time.perf_counter(), os.getloadavg()
    prompts = workload(args.workload, args.prompts)
    model, tokenizer = load()
    tools = [tool for tool in TOOLS if tool == "effdepth" or tool in args.tools]
    handles = {tool: setup(tool, model, tokenizer) for tool in tools}
    compared = {("effdepth", "skip")} if "skip-batched" in args.tasks else set()  # what batched skips are held to
    todo = [
        (tool, task)
        for task in TASKS
        for tool in tools
        if task in CALLS[tool] and (task in args.tasks or (tool, task) in compared)
    ]
    results = {}

    def call(tool, task):
        result = run(model, handles[tool], tokenizer, tool, task, task_prompts(task, prompts, args.skip_prompts))
        results.setdefault((tool, task), result)  # the first full call's result is the one compared

    for tool, task in todo:  # the first call of each, on a short prompt: imports, tracing, caches
        run(model, handles[tool], tokenizer, tool, task, WARM_UP)
    for _ in range(args.warmup):
        for key in todo:
            call(*key)
    # interleaved: a slow spell of the machine hits every tool
    times = alternating({key: lambda key=key: call(*key) for key in todo}, args.repeats)
    skip_prompts = prompts[: args.skip_prompts]
    if "tuned-lens" in tools and "skip" in args.tasks:  # once, not timed against the others (see NOT_DONE)
        start = time.perf_counter()
        deleted = tuned_lens_delete_layers(model, handles["tuned-lens"], tokenizer, skip_prompts)
        results["tuned-lens", "delete_layers"] = deleted
        times["tuned-lens", "delete_layers"] = Timing((time.perf_counter() - start,))
    memory = {} if args.no_memory else {key: peak_memory(*key, args) for key in todo if key[1] != "tokens"}
    loads = (load_before, os.getloadavg())
    attention = (
        ""
        if "transformer-lens" not in tools
        else ATTENTION_NOTE.format(
            version=version("transformer-lens"),
            component=type(handles["transformer-lens"].blocks[0].attn).__name__,
            hf=model.config._attn_implementation,
        )
    )
    report(results, times, memory, time.perf_counter() - started, tokenizer, prompts, args, loads, attention, todo)


def table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    print()


def report(results, times, memory, elapsed, tokenizer, prompts, args, loads, attention, todo) -> None:
    tools = [tool for tool in TOOLS if any(key[0] == tool for key in todo)]

    def cell(tool, task, what):
        if task not in CALLS[tool]:
            return "n/a"
        if (tool, task) not in todo:
            return "-"
        if what == "lines":
            return str(count_lines(CALLS[tool][task]))
        if what == "s":
            t = times[tool, task]
            return f"{t.median:.2f} [{t.low:.2f}–{t.high:.2f}]"
        if what == "MB":
            return f"{memory[tool, task]:.0f}" if (tool, task) in memory else "-"
        ours, theirs = results["effdepth", task.removesuffix("-batched")], results[tool, task]
        if task == "tokens":
            same = [a == b for row, other in zip(ours, theirs, strict=True) for a, b in zip(row, other, strict=True)]
            return f"{np.mean(same):.3f} ({sum(same)}/{len(same)})"
        return f"{np.max(np.abs(np.asarray(theirs, dtype=float) - ours)):.1e}"

    lens = [("lens", "lines"), ("lens", "s"), ("lens", "MB"), ("lens", "agree")]
    lens += [("tokens", "lines"), ("tokens", "s"), ("tokens", "agree")]
    header = ["tool", "lens lines", "lens s", "lens peak MB", "lens max|Δ|", "per-token lines", "per-token s"]
    table([*header, "top-1 agreement"], [[tool, *(cell(tool, *c) for c in lens)] for tool in tools])
    how = {"skip": "loop", "skip-batched": "batched"}
    rows = [
        [f"{tool} ({'replay' if tool == 'effdepth' else how[task]})", *(cell(tool, task, w) for w in whats)]
        for task in ("skip", "skip-batched")
        for tool in tools
        if (tool, task) in todo
        for whats in [("lines", "s", "MB", "agree")]
    ]
    if rows:
        table(["skip: tool (how)", "lines", "s", "peak MB", "max|Δ|"], rows)
    for (tool, task), why in NOT_DONE.items():
        if tool in tools:
            print(f"n/a ({tool}, {task}): {why}")
    if ("tuned-lens", "delete_layers") in results:
        deleted, ours = results["tuned-lens", "delete_layers"], results["effdepth", "skip"]
        print(
            "tuned-lens delete_layers (layer l removed at every position): "
            f"{count_lines(tuned_lens_delete_layers)} lines, "
            f"{times['tuned-lens', 'delete_layers'].median:.2f} s (one cold call: a different quantity, not a timing), "
            f"max|Δ| vs effdepth's skip {np.max(np.abs(deleted - ours)):.3f} nats "
            f"(at layer {int(np.argmax(np.abs(deleted - ours)))})"
        )
    if attention:
        print(attention)
    print(
        f"s: seconds of one call, median [min–max] of {args.repeats} timed calls after a first call on a short "
        f"prompt and {args.warmup} untimed call(s) on the full workload, the tools interleaved; max|Δ|: max over "
        "layers of |tool − effdepth| (nats); agreement: share of one short prompt's (layer, position) cells, "
        "layers 0..L, with effdepth's top-1 token; peak MB: peak RSS during the call above RSS before it, fresh process"
    )
    n_tokens = [len(tokenizer(p).input_ids) for p in prompts]
    n_skip = n_tokens[: args.skip_prompts]
    print(
        f"model: {MODEL} (float32, CPU); workload {args.workload}: lens on {len(prompts)} prompts, "
        f"{sum(n_tokens)} tokens {n_tokens}; skip on the first {len(n_skip)}, {sum(n_skip)} tokens; "
        f"per-token table on one prompt of {len(tokenizer(PROMPTS[0]).input_ids)} tokens"
    )
    for task, what in (("lens", "lens KL per layer 0..L"), ("skip", "skip KL per skipped layer 0..L-1")):
        if ("effdepth", task) in results:
            print(f"effdepth {what}:", np.array2string(results["effdepth", task], precision=3, max_line_width=120))
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
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))  # the cores it was pinned to, as run
    print(f"command: PYTHONPATH=. taskset -c {cores} .compute/peers/bin/python benchmarks/peers.py {argv}".rstrip())
    print(f"total wall time: {elapsed:.0f} s")


if __name__ == "__main__":
    main()
