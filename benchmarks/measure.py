"""Measuring helpers shared by the benchmarks: peak resident memory, timing, work counting."""

from __future__ import annotations

import gc
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from effdepth_core.models import LoadedModel

_PAGE = 4096


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE


class PeakRSS:
    """Peak resident memory above the level at entry, sampled every millisecond."""

    def __enter__(self) -> PeakRSS:
        gc.collect()
        self.start = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.start) / 2**20


@dataclass(frozen=True)
class Timing:
    """Seconds of repeated calls after warm-up: the median, with the fastest and slowest beside it."""

    runs: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def low(self) -> float:
        return min(self.runs)

    @property
    def high(self) -> float:
        return max(self.runs)

    def __str__(self) -> str:
        return f"{self.median:.2f} s [{self.low:.2f}–{self.high:.2f}, {len(self.runs)} runs]"


def repeated(
    fn: Callable[[], object], repeats: int = 5, warmup: int = 1, sync: Callable[[], None] | None = None
) -> Timing:
    """Time ``fn`` ``repeats`` times after ``warmup`` untimed calls (kernels, caches, the allocator);
    ``sync`` (a device synchronisation) runs before each clock reading."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        fn()
        sync()
        runs.append(time.perf_counter() - started)
    return Timing(tuple(runs))


def alternating(
    calls: dict[str, Callable[[], object]],
    repeats: int | dict[str, int] = 5,
    sync: Callable[[], None] | None = None,
) -> dict[str, Timing]:
    """Seconds of each call ``repeats`` times (or ``repeats[name]``), the calls taking turns (a slow
    spell of the machine hits them alike); warm each up before."""
    counts = repeats if isinstance(repeats, dict) else dict.fromkeys(calls, repeats)
    runs: dict[str, list[float]] = {name: [] for name in calls}
    for turn in range(max(counts.values(), default=0)):
        for name, call in calls.items():
            if turn < counts[name]:
                runs[name] += repeated(call, repeats=1, warmup=0, sync=sync).runs
    return {name: Timing(tuple(times)) for name, times in runs.items()}


class PublishedBatching:
    """While active, the model runs a batch of identical prompt rows as the published
    ``plot_integrated_gradients.py`` does: one row of the prompt up to layer l, whose output hook
    then holds a row per α (16 per pass). The library's integrated-gradients oracle
    (``method="slow"``) runs a row per α from the embedding on (BLOOM's ALiBi takes batch-sized
    arguments in every layer): more work than the published loop below layer l (1.6× on
    smollm2-135m's layers 0, 10, 20, 29). A forward pre-hook on ``loaded.model`` trims such a batch
    to its first row; other calls (a single prompt, a padded batch of different prompts) pass as
    they are. Architectures whose layers take per-row arguments (ALiBi) cannot be timed this way."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded

    @staticmethod
    def _one_row(module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and len(ids) > 1 and bool((ids == ids[:1]).all()):
            kwargs["input_ids"] = ids[:1]  # the α rows come from the layer's output hook
        return args, kwargs

    def __enter__(self) -> None:
        self._handle = self.loaded.model.register_forward_pre_hook(self._one_row, with_kwargs=True)

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def as_published(loaded: LoadedModel, method: str, call: Callable[[], object]) -> object:
    """``call()`` (an integrated-gradients call with ``method=method``): under ``PublishedBatching``
    for ``"slow"``, the published loop; as it is for ``"fast"``."""
    if method == "fast":
        return call()
    with PublishedBatching(loaded):
        return call()


class WorkCounter:
    """Counts token evaluations of the decoder layers and of the LM head while active (a backward
    pass is not counted; for gradients, count it as about twice its forward)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.layer_tokens = 0
        self.head_tokens = 0

    def _count_layer(self, module, args, kwargs) -> None:
        h = args[0] if args else kwargs["hidden_states"]
        self.layer_tokens += h.shape[0] * h.shape[1]

    def _count_head(self, module, args) -> None:
        self.head_tokens += args[0].numel() // args[0].shape[-1]

    def __enter__(self) -> WorkCounter:
        self._handles = [
            layer.register_forward_pre_hook(self._count_layer, with_kwargs=True) for layer in self.loaded.layers
        ]
        # the head's tokens are counted at the final norm: ``LoadedModel.head_into`` multiplies by
        # the head's weight without calling the module, and every head application normalises first
        self._handles.append(self.loaded.final_norm.register_forward_pre_hook(self._count_head))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()

    @property
    def layer_params(self) -> int:
        return sum(p.numel() for p in self.loaded.layers[0].parameters())

    @property
    def head_params(self) -> int:
        return self.loaded.lm_head.weight.numel()

    def forward_equivalents(self, n_tokens: int) -> float:
        """Work in units of one plain forward of ``n_tokens`` (layers + head, weighted by parameters)."""
        work = self.layer_tokens * self.layer_params + self.head_tokens * self.head_params
        return work / (n_tokens * (self.loaded.n_layers * self.layer_params + self.head_params))
