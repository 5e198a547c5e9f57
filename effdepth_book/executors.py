"""The grid on a Ray cluster: each unit of cells (``grid.units``) a Ray task, asking for one GPU
when the runs' device is cuda and for CPUs and memory sized from its largest model. Workers write
the same run directories as the local executor — the checkout (``root``) must be at the same path
on every node, on a shared filesystem whose locks work across nodes (book/using/grid.md).

A worker killed mid-cell is retried by Ray (``max_retries``): the run directory's lock died with it,
and the next attempt removes what it left half-written (``rundir``) and resumes. Ctrl-C at the driver
cancels every task; what finished is on disk, so a rerun goes on from there."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from effdepth_core.errors import EffdepthError

from .grid import AnyCell, Cell, GridPlan, Outcome, hours, run_local, run_unit

MAX_RETRIES = 3  # a worker killed (node lost, out of memory) is retried this often


def _require_ray():
    try:
        import ray
    except ImportError as exc:
        raise EffdepthError("--executor ray needs Ray: pip install 'effdepth[cluster]'") from exc
    return ray


def _device(cell: AnyCell) -> str:
    return str(cell.settings.device if isinstance(cell, Cell) else cell.shared.get("device", "auto"))


def resources(unit: Sequence[AnyCell], cpus: int, calibration, gpus_in_cluster: float = 0, memory_gb=None) -> dict:
    """Ray resources of one unit: ``cpus`` CPUs; a GPU when its runs use cuda (``auto`` included,
    when the cluster has GPUs); memory for the largest model's weights in float32 three times over
    plus 1 GiB (activations, the tokenizer), or ``memory_gb`` (required when a model's shape is
    unknown: a hub model whose config is not cached here)."""
    from .cost import shape_of

    devices = {_device(c) for c in unit}
    cuda = any(d.startswith("cuda") for d in devices) or ("auto" in devices and gpus_in_cluster > 0)
    if memory_gb is not None:
        memory = int(memory_gb * (1 << 30))
    else:
        models = [m for c in unit for m in (c.model.split(" → ") if not isinstance(c, Cell) else [c.model])]
        shapes = {m: shape_of(m, calibration) for m in models}
        unknown = sorted(m for m, shape in shapes.items() if shape is None)
        if unknown:
            raise EffdepthError(
                f"the memory {', '.join(unknown)} needs is unknown here (no cached run or config): give "
                "--memory-per-cell GB"
            )
        memory = int(max(shape.n_params for shape in shapes.values()) * 4 * 3 + (1 << 30))
    return {"num_cpus": cpus, "num_gpus": 1 if cuda else 0, "memory": memory}


def _check_schedulable(requests: list[dict], cluster: dict) -> None:
    """A task no node can hold would wait forever: refuse it before submitting anything."""
    for request in requests:
        for name, key in (("num_cpus", "CPU"), ("num_gpus", "GPU"), ("memory", "memory")):
            if request[name] > cluster.get(key, 0):
                have = cluster.get(key, 0)
                gib = key == "memory"
                what = f"{request[name] / (1 << 30):.1f} GiB of" if gib else str(request[name])
                has = f"{have / (1 << 30):.1f} GiB" if gib else f"{have:g}"
                raise EffdepthError(
                    f"a grid task asks for {what} {key} but the Ray cluster has {has} in all: lower "
                    "--cpus-per-cell or --memory-per-cell, or add nodes"
                )


def _remote_unit(root: str, unit: list, threads: int) -> list[tuple[int, str, str, float, float]]:
    """Runs in a Ray worker: the unit's cells, from the checkout, quietly; plain tuples back."""
    os.chdir(root)  # params/ name results folders relative to the checkout
    os.environ["TQDM_DISABLE"] = "1"
    import torch

    from effdepth_core.models import quiet_libraries

    torch.set_num_threads(threads)
    quiet_libraries(progress=False)
    for cell in unit:
        cell.quiet()
    return [(i, o.status, o.detail, o.seconds, o.peak_rss_mb) for i, o in enumerate(run_unit(unit))]


CONNECT_SECONDS = 5.0  # how long a cluster address may take to answer before the grid gives up


def check_address(address: str | None) -> None:
    """A cluster address is ``auto``, ``local``, ``host:port`` or ``ray://host:port`` whose port
    answers within ``CONNECT_SECONDS``; ``ray://`` also needs Ray's client. One line otherwise, before
    Ray is started (Ray itself would retry an unreachable address for minutes)."""
    import re
    import socket

    if address is None or address in ("auto", "local"):
        return
    match = re.fullmatch(r"(?:(ray)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})", address)
    if match is None or not 0 < int(match[3]) < 65536:
        raise EffdepthError(f"--address {address!r} is not a Ray address: use auto, host:port or ray://host:port")
    if match[1]:
        try:
            import grpc  # noqa: F401
            import ray.util.client  # noqa: F401
        except ImportError as exc:
            raise EffdepthError(
                f"--address {address} uses Ray's client, which is not installed: pip install 'effdepth[cluster]'"
            ) from exc
    host = match[2].strip("[]")
    try:
        socket.create_connection((host, int(match[3])), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise EffdepthError(
            f"cannot reach the Ray cluster at {address} ({exc.strerror or type(exc).__name__}); check --address "
            "and that the cluster is running"
        ) from exc


def run_ray(
    groups: Sequence[Sequence[AnyCell]],
    root: Path,
    address: str | None,
    cpus: int,
    calibration,
    report: Callable[[Outcome], None],
    memory_gb: float | None = None,
) -> list[Outcome]:
    """Every unit a Ray task on the cluster at ``address`` (None: a local one); ``report`` hears each
    cell's outcome as its unit finishes. effdepth must be installed on every node, and the checkout
    be at ``root`` there."""
    ray = _require_ray()
    check_address(address)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    pending: dict = {}
    outcomes: list[Outcome] = []
    try:
        cluster = ray.cluster_resources()
        requests = [resources(u, cpus, calibration, cluster.get("GPU", 0), memory_gb) for u in groups]
        _check_schedulable(requests, cluster)
        remote = ray.remote(max_retries=MAX_RETRIES)(_remote_unit)
        for unit, request in zip(groups, requests, strict=True):
            pending[remote.options(**request).remote(str(root), list(unit), cpus)] = unit
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            unit = pending.pop(ready[0])
            try:
                results = ray.get(ready[0])
            except ray.exceptions.RayError as exc:  # retries exhausted, or the unit raised
                cause = getattr(exc, "cause", None) or exc
                message = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
                failed = f"its Ray task failed ({message}); what it finished is cached: rerun for the rest"
                results = [(i, "failed", failed, 0.0, 0.0) for i in range(len(unit))]
            for index, status, detail, seconds, peak in results:
                outcome = Outcome(unit[index], status, detail, seconds, peak)
                outcomes.append(outcome)
                report(outcome)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)  # the workers stop; finished runs stay on disk
        raise
    finally:
        if started_here:
            ray.shutdown()
    return outcomes


__all__ = ["MAX_RETRIES", "compute_plan", "resources", "run_ray"]


def compute_plan(
    plan: GridPlan,
    root: Path,
    executor: str = "local",
    address: str | None = None,
    cpus_per_cell: int = 1,
    memory_per_cell: float | None = None,
    progress: bool = True,
) -> list[Outcome]:
    """Compute what the plan has left, here or on Ray, under one bar whose ETA is the cost model's
    scaled by how the estimates fared so far."""
    from tqdm import tqdm

    todo, estimates = plan.todo, plan.estimates
    total = plan.n_todo
    bar = tqdm(total=total, unit="cell", disable=not progress, dynamic_ncols=True)
    state = {
        "estimated": 0.0,
        "measured": 0.0,
        "left": sum(estimates[id(c)].cpu_seconds or 0.0 for u in todo for c in u),
    }
    # units computed side by side: on Ray as many as the tasks in flight (at most the units), here one
    parallel = len(todo) if executor == "ray" else 1

    def advance(outcome: Outcome) -> None:
        estimated = estimates[id(outcome.cell)].cpu_seconds
        state["left"] -= estimated or 0.0
        if outcome.status == "done" and estimated:  # cells of unknown cost do not skew the correction
            state["estimated"] += estimated
            state["measured"] += outcome.seconds
        scale = state["measured"] / state["estimated"] if state["estimated"] else 1.0
        eta = max(state["left"], 0.0) * scale / max(1, min(parallel, total - bar.n))
        bar.set_postfix_str(f"ETA {hours(eta)} (cost model)")
        bar.update(1)

    def log(text: str) -> None:
        (tqdm.write if progress else print)(text)

    try:
        if executor == "ray":

            def report(outcome: Outcome) -> None:
                log(f"{outcome.cell.name}\n{outcome.line()}")
                advance(outcome)

            return run_ray(todo, root, address, cpus_per_cell, plan.calibration, report, memory_per_cell)
        for unit in todo:
            for cell in unit:
                cell.quiet()
        return run_local(todo, log=log, progress=advance)
    finally:
        bar.close()
