"""A decoder's blocks read off one forward pass, whatever its modules are named: which two of a
block's sublayer outputs add up to what it adds to the residual (the attention's and the MLP's
writes), or why no two do, said about the model (post-norm blocks, layers run more than once, a
third write)."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
from torch import nn

# how far a layout's writes may miss a block's change, relative to it: float32 and float64 forward
# passes round at ~1e-7 and ~1e-16 of the values; bf16/fp16 (3e-2) at ~4e-3, summed over a block
LAYOUT_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9}
HALF_TOLERANCE = 3e-2


class BlockReading(NamedTuple):
    """What ``read_blocks`` found: the layer list (``layers``, a dotted path), the two children of
    each block whose outputs add up to its change (``writes``, attention first), the norms beside the
    layer list that may be the final norm, and why no two writes add up (``reason``, about the model)."""

    layers: str | None = None
    writes: tuple[str, str] | None = None
    final_norms: tuple[str, ...] = ()
    reason: str | None = None


def share(fraction: float) -> str:
    """A relative gap as a percentage that never rounds a real gap to 0 %: ``12.3%``, ``0.047%``."""
    percent = 100 * fraction
    return f"{percent:.1f}%" if percent >= 0.1 else f"{percent:.2g}%"


def _is_norm(module: nn.Module) -> bool:
    """A normalization layer (``nn.LayerNorm``, ``LlamaRMSNorm``, …; not ``RobertaPreLayerNormOutput``)."""
    return isinstance(module, nn.LayerNorm | nn.GroupNorm) or type(module).__name__.endswith("Norm")


def _stacks(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """Every list of blocks of one class (each with submodules), longest first."""
    found = [
        (path, module)
        for path, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        and len(module)
        and len({type(block) for block in module}) == 1
        and any(True for _ in module[0].children())
    ]
    return sorted(found, key=lambda item: -len(item[1]))


def _one_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else 'no message'}"


def _first_tensor(value: object) -> torch.Tensor | None:
    value = value[0] if isinstance(value, tuple | list) and value else value
    return value if isinstance(value, torch.Tensor) else None


def _record(model: nn.Module, stacks: list[tuple[str, nn.ModuleList]], device: torch.device | str) -> dict:
    """One forward on 9 tokens with hooks on every block of ``stacks`` and each block's children:
    per block its calls, its first call's input and output, its children's outputs in call order and
    the outputs of the norms anywhere inside it."""
    seen: dict[tuple[str, int], dict] = {}
    handles = []

    def block_hooks(key: tuple[str, int]):
        def before(module, args, kwargs):
            entry = seen.setdefault(key, {"calls": 0, "children": [], "norms": []})
            entry["calls"] += 1
            if entry["calls"] == 1:
                entry["h_in"] = _first_tensor(args[0] if args else kwargs.get("hidden_states"))

        def after(module, args, kwargs, output):
            entry = seen[key]
            if entry["calls"] == 1 and "h_out" not in entry:
                out = _first_tensor(output)
                entry["h_out"] = None if out is None else out.detach().clone()

        return before, after

    def child_hook(key: tuple[str, int], name: str, kind: str):
        def after(module, args, output):
            entry = seen.get(key)
            out = _first_tensor(output)
            if entry is not None and entry["calls"] == 1 and "h_out" not in entry and out is not None:
                entry[kind].append((name, out.detach().clone()))

        return after

    vocab = int(getattr(model.config, "vocab_size", 8) or 8)
    try:
        for path, stack in stacks:
            for index, block in enumerate(stack):
                before, after = block_hooks((path, index))
                handles.append(block.register_forward_pre_hook(before, with_kwargs=True))
                handles.append(block.register_forward_hook(after, with_kwargs=True))
                for name, child in block.named_children():
                    handles.append(child.register_forward_hook(child_hook((path, index), name, "children")))
                for name, inner in block.named_modules():
                    if name and _is_norm(inner):
                        handles.append(inner.register_forward_hook(child_hook((path, index), name, "norms")))
        with torch.inference_mode():
            model(input_ids=(torch.arange(9) % max(vocab - 1, 1) + 1)[None].to(device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _gap(change: torch.Tensor, writes: list[torch.Tensor]) -> float:
    return float((change - sum(writes)).norm() / change.norm().clamp_min(1e-12))


def read_blocks(model: nn.Module, write_scale: float = 1.0, device: torch.device | str = "cpu") -> BlockReading:
    """Read the longest list of blocks that carries the residual stream (a ``[1, 9, d]`` state in and
    out, each block's output the next one's input) on one forward pass of 9 tokens: its blocks' two
    writes when two of each block's children's outputs add up to its change, else the reason no two
    do; an empty reading, with the reason where there is one, when no such list is found.
    ``write_scale``: what each write is multiplied by as the block adds it (a residual multiplier its
    config names); ``device``: where the model takes its input ids."""
    stacks = _stacks(model)
    try:
        seen = _record(model, stacks, device)
    except Exception as exc:  # a forward the hooks cannot follow: nothing to read
        return BlockReading(reason=f"its forward fails on a plain 9-token input ({_one_line(exc)})")
    unchained = None
    for path, stack in stacks:
        blocks = [seen.get((path, index)) for index in range(len(stack))]
        first = blocks[0]
        if first is None or first.get("h_in") is None or first.get("h_out") is None:
            continue
        if first["h_in"].dim() == 4 and first["h_in"].shape == first["h_out"].shape and first["h_in"].shape[1] == 9:
            return BlockReading(
                path,
                None,
                (),
                f"its blocks carry {first['h_in'].shape[2]} residual streams that each block mixes "
                f"(a [batch, token, {first['h_in'].shape[2]}, d] state: hyper-connections), not one residual stream",
            )
        if first["h_in"].dim() != 3 or first["h_in"].shape != first["h_out"].shape:
            continue  # not the residual stream ([batch, token, d] in and out)
        parent = model.get_submodule(path.rpartition(".")[0]) if "." in path else model
        prefix = path.rpartition(".")[0] + "." if "." in path else ""
        norms = tuple(prefix + name for name, child in parent.named_children() if _is_norm(child))
        repeated = [(index, block["calls"]) for index, block in enumerate(blocks) if block and block["calls"] > 1]
        if repeated:
            index, calls = repeated[0]
            return BlockReading(
                path,
                None,
                norms,
                f"it runs its blocks more than once per forward ({path}[{index}] {calls} times), so "
                "a block has no one depth in the stack",
            )
        if any(block is None or block.get("h_out") is None for block in blocks):
            continue
        if not all(  # a stack of blocks: each one's output is the next one's input (float32 copies: 1e-6)
            before["h_out"].shape == after["h_in"].shape
            and torch.allclose(before["h_out"].float(), after["h_in"].float(), rtol=1e-6, atol=0.0)
            for before, after in itertools.pairwise(blocks)
        ):
            unchained = unchained or path
            continue
        try:
            return _read_writes(model, path, stack, blocks, norms, write_scale, device)
        except Exception as exc:  # the second forward (one position moved) failed
            return BlockReading(
                path, None, norms, f"its blocks cannot be re-run with one position moved ({_one_line(exc)})"
            )
    if unchained:
        return BlockReading(
            reason=f"no list of its modules runs as a stack of blocks, each one's output the next one's input "
            f"({unchained}'s do not): its layers are not modules effdepth can hook"
        )
    return BlockReading()


def _read_writes(
    model: nn.Module, path: str, stack: nn.ModuleList, blocks: list[dict], norms: tuple, write_scale: float, device
) -> BlockReading:
    tolerance = LAYOUT_TOLERANCE.get(blocks[0]["h_out"].dtype, HALF_TOLERANCE)
    changes = [(block["h_out"] - block["h_in"]).float() for block in blocks]
    outputs = []  # per block: {child: output shaped as the residual}, in call order
    for block in blocks:
        shape, calls = block["h_in"].shape, [name for name, _ in block["children"]]
        outputs.append(
            {
                name: write_scale * out.float().reshape(shape)
                for name, out in block["children"]
                if out.numel() == block["h_in"].numel() and calls.count(name) == 1  # a write runs once a block
            }
        )
    names = [name for name in outputs[0] if all(name in each for each in outputs)]

    def block_output_of(kind: str) -> list[str]:  # children (or norms inside) whose output is the block's, always
        return [
            name
            for name, _ in blocks[0][kind]
            if all(
                any(
                    n == name
                    and out.shape == block["h_out"].shape
                    # the same tensor, up to a copy's rounding: 1e-5 of each value (float32 rounds at 1e-7)
                    and torch.allclose(out.float(), block["h_out"].float(), rtol=1e-5, atol=0.0)
                    for n, out in block[kind]
                )
                for block in blocks
            )
        ]

    if post_norms := block_output_of("norms"):
        return BlockReading(
            path,
            None,
            norms,
            f"it is post-norm: each block's output is that of its normalization layer {path}[i].{post_norms[-1]}, "
            "so the residual stream is re-normalized inside every block; the probes assume pre-norm blocks "
            "(h_(l+1) = h_l + attention's write + MLP's write)",
        )
    returning = [name for name in block_output_of("children") if _has_parameters(stack[0].get_submodule(name))]
    if returning:
        return BlockReading(
            path,
            None,
            norms,
            f"its sublayers return the residual with their writes (each block's output is that of "
            f"{path}[i].{returning[-1]}), so no module's output is a write alone",
        )

    def worst(group: tuple[str, ...]) -> float:
        return max(_gap(change, [each[name] for name in group]) for change, each in zip(changes, outputs, strict=True))

    pairs = sorted(itertools.combinations(names, 2), key=worst)
    fitting = [pair for pair in pairs if worst(pair) <= tolerance]
    weighted = [pair for pair in fitting if all(_has_parameters(stack[0].get_submodule(name)) for name in pair)]
    fitting = weighted or fitting  # a parameter-free copy (dropout, identity) of a write yields to the write
    if len(fitting) > 1:
        return BlockReading(
            path,
            None,
            norms,
            f"two pairs of its blocks' sublayer outputs add up to a block's change ({' + '.join(fitting[0])}; "
            f"{' + '.join(fitting[1])}), so which modules write is ambiguous; describe the layout with "
            "wrap_model(adapter=Adapter(...))",
        )
    if fitting:
        attn, mlp = fitting[0]
        outputs_of_first = dict(blocks[0]["children"])
        if not _mixes_tokens(model, stack[0], attn, outputs_of_first[attn], device):
            second = _mixes_tokens(model, stack[0], mlp, outputs_of_first[mlp], device)
            return BlockReading(
                path,
                None,
                norms,
                f"the first of its blocks' two writes ({attn}, then {mlp}) does not mix tokens"
                + (
                    ": an MLP runs before the attention, where the method's split reads the attention's write first"
                    if second
                    else ", nor does the second: its blocks have no token mixer to read"
                ),
            )
        return BlockReading(path, fitting[0], norms)
    triples = [group for group in itertools.combinations(names, 3) if worst(group) <= tolerance]
    if triples:
        return BlockReading(
            path,
            None,
            norms,
            f"each block adds three writes to the residual ({', '.join(triples[0])}), where the "
            "method splits a block into one attention and one MLP write; name the third with its group "
            "(wrap_model(adapter=Adapter(attn_out=…, mlp_out=…, mlp_also=(…,))))",
        )
    closest = f" (closest: {' + '.join(pairs[0])}, off by {share(worst(pairs[0]))})" if pairs else ""
    return BlockReading(
        path,
        None,
        norms,
        f"no two of its blocks' sublayer outputs add up to a block's change{closest}: its blocks are not "
        "h + attention's write + MLP's write",
    )


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _mixes_tokens(model: nn.Module, block: nn.Module, name: str, clean: torch.Tensor, device) -> bool:
    """Whether ``block.<name>``'s output at positions 1.. moves when only position 0 of the block's
    input does (a token mixer's does under any causal mask; an MLP's does not), on the same 9 tokens."""
    moved = {}

    def nudge(module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        h = h.clone()  # a random direction: a LayerNorm would take a uniform shift back out
        direction = torch.randn(h.shape[-1], generator=torch.Generator().manual_seed(0)).to(h.device, h.dtype)
        h[:, 0] += direction * (1.0 + h[:, 0].abs().mean())
        return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})

    def keep(module, args, output):
        moved.setdefault("out", _first_tensor(output))

    handles = [block.register_forward_pre_hook(nudge, with_kwargs=True)]
    handles.append(block.get_submodule(name).register_forward_hook(keep))
    vocab = int(getattr(model.config, "vocab_size", 8) or 8)
    try:
        with torch.inference_mode():
            model(input_ids=(torch.arange(9) % max(vocab - 1, 1) + 1)[None].to(device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    after, before = moved["out"].float().reshape(1, 9, -1), clean.float().reshape(1, 9, -1)
    # a per-token module's later positions come out as they were, up to rounding (~1e-7 of the values
    # in float32, ~4e-3 in bfloat16); a mixer's move by a share of the nudge, which is of their size
    tolerance = 1e-4 if clean.dtype in (torch.float32, torch.float64) else HALF_TOLERANCE
    return not torch.allclose(after[:, 1:], before[:, 1:], rtol=tolerance, atol=tolerance * float(before.abs().max()))
