"""The grid past one machine: a tiny 2-model × 2-task profile computed by the local executor, by two
shards and on a local Ray cluster gives byte-identical results; a killed Ray worker is retried, an
interrupted driver loses nothing, a cell another process holds is left to it; the plan's costs come
from the cache's measurements."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import statistics
import threading
import time
from pathlib import Path

import pytest
from conftest import make_tiny, save_tiny_dir

from effdepth_book import grid
from effdepth_book.cost import Calibration
from effdepth_core import cache
from effdepth_core.cli import main

COMMON = """profiles:
  quick:
    tasks:
      - {{task: addition, digits: 3, n: 3}}
      - {{task: {task}, n: 2}}
    seed: 0
    device: cpu
    dtype: float32
    results_dir: res
"""
SCALE = """title: Tiny scale
profiles:
  quick:
    sets:
      - name: both
        models: [{a}, {b}]
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("grid-models")
    return save_tiny_dir(base / "llama", "llama"), save_tiny_dir(base / "qwen2", "qwen2")


def _root(where: Path, models) -> Path:
    root = where / "checkout"
    (root / "params").mkdir(parents=True)
    task = models[0].parent / "prompts.jsonl"  # one path for every root: it names the run directories
    task.write_text('{"prompt": "the cat sat on the mat and"}\n{"prompt": "two plus two is four, so"}\n')
    (root / "params" / "common.yml").write_text(COMMON.format(task=task))
    (root / "params" / "scale.yml").write_text(SCALE.format(a=models[0], b=models[1]))
    return root


def _results(root: Path) -> dict[str, str]:
    """Every result file's sha256 (metadata.json holds timings and hosts: not a result)."""
    found = {}
    for path in sorted((root / "res").rglob("*")):
        if path.is_file() and path.name not in ("metadata.json", cache.LOCK_NAME):
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _grid(root: Path, *extra: str) -> int:
    cwd = os.getcwd()
    try:
        return main(["grid", "quick", "--root", str(root), "--section", "scale", "--no-progress", *extra])
    finally:
        os.chdir(cwd)  # the grid runs in the checkout


@pytest.fixture(scope="module")
def local(tmp_path_factory, models):
    root = _root(tmp_path_factory.mktemp("local"), models)
    assert _grid(root) == 0
    results = _results(root)
    assert len([p for p in results if p.endswith("effective_depth.json")]) == 4  # 2 models × 2 tasks
    return results


def test_the_plan_has_four_cells_in_two_units_per_model(tmp_path, models):
    root = _root(tmp_path, models)
    plan = grid.cells(root, "quick", ["scale"])
    assert len(plan) == 4 and len(grid.units(plan)) == 4
    assert [len(s) for s in (grid.shard(grid.units(plan), i, 2) for i in range(2))] == [2, 2]


def test_two_shards_give_the_local_executors_bytes(tmp_path, models, local, capsys):
    root = _root(tmp_path, models)
    assert _grid(root, "--shard", "0/2") == 0
    half = _results(root)
    assert 0 < len(half) < len(local)  # a slice, not the whole
    assert _grid(root, "--shard", "1/2") == 0
    assert _results(root) == local


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="the cluster extra (pip install 'effdepth[cluster]') is not installed")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.mark.xdist_group("ray")  # one local cluster at a time (pytest -n 2 --dist loadgroup)
def test_ray_gives_the_local_executors_bytes(tmp_path, models, local, ray_cluster):
    root = _root(tmp_path, models)
    assert _grid(root, "--executor", "ray") == 0
    assert _results(root) == local


@pytest.mark.xdist_group("ray")  # one local cluster at a time (pytest -n 2 --dist loadgroup)
def test_a_killed_ray_worker_is_retried(tmp_path, models, local, ray_cluster, capsys):
    root = _root(tmp_path, models)
    killed: list[int] = []

    def kill_first_writer() -> None:  # the pid in the first lock that appears: a worker mid-cell
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for lock in (root / "res").rglob(cache.LOCK_NAME) if (root / "res").is_dir() else []:
                try:
                    pid = int(lock.read_text().split("pid ")[1].split()[0])
                except (OSError, IndexError, ValueError):
                    continue
                if pid != os.getpid():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_first_writer)
    killer.start()
    code = _grid(root, "--executor", "ray")
    killer.join()
    assert killed, "no worker was caught mid-cell"
    assert code == 0, capsys.readouterr().out
    assert _results(root) == local  # the retry removed what the killed worker left and finished it


@pytest.mark.xdist_group("ray")  # one local cluster at a time (pytest -n 2 --dist loadgroup)
def test_an_interrupted_ray_driver_cancels_and_loses_nothing(tmp_path, models, local, ray_cluster, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = _root(tmp_path, models)
    real_wait, real_cancel, cancelled, calls = ray_cluster.wait, ray_cluster.cancel, [], []

    def wait_then_interrupt(refs, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # after the first unit came back: Ctrl-C
            raise KeyboardInterrupt
        return real_wait(refs, **kwargs)

    monkeypatch.setattr(ray_cluster, "wait", wait_then_interrupt)

    def cancel(ref, force=False):
        cancelled.append(ref)
        real_cancel(ref, force=force)

    monkeypatch.setattr(ray_cluster, "cancel", cancel)
    with pytest.raises(KeyboardInterrupt):
        from effdepth_book.executors import run_ray

        monkeypatch.chdir(root)
        plan = grid.units(grid.cells(root, "quick", ["scale"]))
        run_ray(plan, root, None, 1, Calibration(), lambda outcome: None)
    assert len(cancelled) == 3  # every unit still pending
    monkeypatch.undo()
    for ref in cancelled:  # wait until each cancelled task is gone (killed mid-cell) or had finished
        try:
            ray_cluster.get(ref)
        except ray_cluster.exceptions.RayError:
            pass
    assert _grid(root) == 0  # the rerun removes what they left half-written and resumes
    assert _results(root) == local


def test_an_interrupted_local_driver_keeps_what_finished(tmp_path, models, local, monkeypatch, capsys):
    root = _root(tmp_path, models)
    real = grid.Cell.compute
    count = []

    def compute_then_interrupt(self, loader):
        if count:
            raise KeyboardInterrupt
        count.append(1)
        return real(self, loader)

    monkeypatch.setattr(grid.Cell, "compute", compute_then_interrupt)
    assert _grid(root) == 130
    assert "interrupted; finished results are kept" in capsys.readouterr().err
    kept = _results(root)
    monkeypatch.undo()
    assert _grid(root) == 0
    assert "1 cached, 3 to compute" in capsys.readouterr().out
    after = _results(root)
    assert after == local and all(after[k] == v for k, v in kept.items())


def test_a_cell_another_process_holds_is_left_to_it(tmp_path, models, local, capsys):
    root = _root(tmp_path, models)
    plan = grid.cells(root, "quick", ["scale"])
    held = root / next(iter(plan[0].directories()))  # relative to the checkout
    held.mkdir(parents=True)
    lock = cache.DirectoryLock(held)
    lock.acquire()  # another driver's run, mid-cell
    try:
        assert _grid(root) == 0
        out = capsys.readouterr().out
        assert "3 done, 1 busy" in out and "rerun to pick them up" in out
    finally:
        lock.release()
    assert _grid(root) == 0
    assert _results(root) == local


def test_the_cost_model_is_calibrated_by_the_cache(tmp_path, models, monkeypatch):
    from effdepth_book.cost import estimate, task_lengths

    root = _root(tmp_path, models)
    assert _grid(root) == 0
    monkeypatch.chdir(root)
    calibration = Calibration.from_cache([root / "res"])
    assert {(m.model, m.probe) for m in calibration.measurements} == {
        (str(m), p) for m in models for p in ("cosine", "logit_lens")
    }
    plan = grid.cells(root, "quick", ["scale"])
    assert all(c.state() == "cached" and c.estimate(calibration).cpu_seconds == 0 for c in plan)
    # the cosine probe's work is one forward pass, 2 × parameters per token (tokens ≈ characters / 4):
    # its rate is the median over the model's runs of seconds ÷ work, computed here by hand
    cell = plan[0]
    rates, n_params = [], None
    for metadata_path in sorted((root / "res").rglob("metadata.json")):
        metadata = json.loads(metadata_path.read_text())
        if metadata["settings"]["model"] != cell.model:
            continue
        n_params = metadata["n_params"]
        prompts = [json.loads(line)["prompt"] for line in (metadata_path.parent / "examples.jsonl").open()]
        work = 2 * n_params * sum(math.ceil(len(p) / 4) for p in prompts)
        if metadata["probes"]["cosine"]["seconds"] > 0:  # a run too fast to time measured nothing
            rates.append(metadata["probes"]["cosine"]["seconds"] / work)
    assert rates
    lengths = task_lengths(cell.settings)
    expected = statistics.median(rates) * 2 * n_params * sum(lengths)
    got = estimate(cell.settings, ["cosine"], lengths, calibration).cpu_seconds
    assert got == pytest.approx(expected, rel=1e-9)  # the same arithmetic in another order: rounding only
    double = estimate(cell.settings, ["cosine"], lengths * 2, calibration).cpu_seconds
    assert double == pytest.approx(2 * got, rel=1e-9)  # linear in tokens


def test_a_failing_cell_is_reported_and_the_others_computed(tmp_path, models, monkeypatch, capsys):
    from effdepth_core.errors import EffdepthError

    root = _root(tmp_path, models)
    real = grid.Cell.compute

    def fail_on_the_file_task(self, loader):
        if "prompts.jsonl" in self.name and "llama" in self.model:
            raise EffdepthError("this cell cannot be computed")
        return real(self, loader)

    monkeypatch.setattr(grid.Cell, "compute", fail_on_the_file_task)
    assert _grid(root) == 1
    out = capsys.readouterr().out
    assert "failed: this cell cannot be computed" in out and "3 done" in out and "1 failed" in out


def test_ray_requests_are_sized_and_checked(models):
    from effdepth_book.executors import _check_schedulable, resources
    from effdepth_core.errors import EffdepthError

    cell = grid.Cell("scale", "both", "tasks", _record(models[0], "cpu"), Path("res"))
    request = resources([cell], 2, Calibration())
    n_params = sum(p.numel() for p in make_tiny("llama").model.parameters())
    assert request["num_cpus"] == 2 and request["num_gpus"] == 0
    # three float32 copies of the weights (from the folder's config.json) plus 1 GiB
    assert abs(request["memory"] - (12 * n_params + (1 << 30))) < 0.02 * 12 * n_params + 1
    auto = grid.Cell("scale", "both", "tasks", _record(models[0], "auto"), Path("res"))
    assert resources([auto], 1, Calibration(), gpus_in_cluster=4)["num_gpus"] == 1  # auto takes the GPU there
    assert resources([auto], 1, Calibration(), gpus_in_cluster=0)["num_gpus"] == 0
    unknown = grid.Cell("scale", "both", "tasks", _record("someone/not-cached-here", "cpu"), Path("res"))
    with pytest.raises(EffdepthError, match="--memory-per-cell"):
        resources([unknown], 1, Calibration())
    assert resources([unknown], 1, Calibration(), memory_gb=2)["memory"] == 2 << 30
    with pytest.raises(EffdepthError, match="asks for 4 CPU but the Ray cluster has 2"):
        _check_schedulable([{"num_cpus": 4, "num_gpus": 0, "memory": 1}], {"CPU": 2, "memory": 10})


def _record(model, device):
    from effdepth_book.study import record_of

    return record_of(str(model), {"task": "addition", "digits": 3, "n": 1}, {"device": device})


def test_quiet_cells_draw_no_bars_of_their_own(models, tmp_path):
    """`grid --no-progress` (and every Ray worker) quiets each cell: a run's bars and the map's."""
    from effdepth_book.study import map_settings

    plan = grid.cells(_root(tmp_path, models), "quick", ["scale"])
    mapped = grid.MapCell("beyond", "map", {"small": str(models[0]), "big": str(models[1])}, {}, tmp_path)
    for cell in [*plan, mapped]:
        cell.quiet()
    assert all(cell.record.settings.progress is False for cell in plan)
    assert map_settings(mapped.pair, mapped.shared, mapped.results_dir)[0].progress is False


def test_the_gpu_rates_are_those_paper_scale_measured():
    """``cost.GPU_RATES`` recomputed from the committed H200 output: each probe's seconds ÷ its
    ``work`` (integrated gradients on the layers it attributed, a share of all of them)."""
    import re
    from types import SimpleNamespace

    from effdepth_book.cost import GPU_RATES, gpu_rate
    from effdepth_core.measurement import registry
    from effdepth_core.measurement.probes.spec import Shape

    shapes = {"smollm2-135m": Shape(30, 576, 49152, 134515008), "Qwen2.5-1.5B": Shape(28, 1536, 151936, 1543714304),
              "Qwen2.5-7B": Shape(28, 3584, 152064, 7615616512), "Qwen2.5-14B": Shape(48, 5120, 152064, 14770033664),
              "Qwen2.5-32B": Shape(64, 5120, 152064, 32763876352)}  # fmt: skip
    output = Path(__file__).resolve().parents[1] / "benchmarks" / "output"
    text = (output / "paper_scale-h200.txt").read_text().split("== after")[-1]
    text += (output / "paper_scale-large-h200.txt").read_text()
    measured, model = {}, None
    for line in text.splitlines():
        if found := re.match(r"== (\S+) \(random weights", line):
            model = found.group(1)
        elif found := re.match(r"(cosine|lens|skip|erasure|igrad)\s+(\d+)×(\d+)(.*?)\s{2,}([\d.]+)\s", line):
            name, n, tokens, rest, seconds = found.groups()
            probe, shape = {"lens": "logit_lens"}.get(name, name), shapes[model]
            positions = re.search(r"(\d+) positions", rest)
            settings = SimpleNamespace(skip_parts="layer", skip_variants="future", igrad_steps=256, lens="logit",
                                       skip_positions=int(positions.group(1)) if positions else 4)  # fmt: skip
            layers = re.search(r"layers ([\d,]+)", rest)
            share = len(layers.group(1).split(",")) / shape.n_layers if layers else 1.0
            work = registry.get(probe).work(shape, settings, [int(tokens)] * int(n)) * share
            measured[probe, shape.n_params] = float(seconds) / work
    table = {(probe, n): rate for probe, rows in GPU_RATES.items() for n, rate in rows}
    assert table.keys() == measured.keys()
    for key, rate in table.items():
        assert rate == pytest.approx(measured[key], rel=1e-3), key  # a transcription check: 4 significant digits
    assert gpu_rate("cosine", 1_000_000_000) == (GPU_RATES["cosine"][1][1], True)  # nearest: 1.5B
    assert gpu_rate("prune", 10**9)[1] is False
