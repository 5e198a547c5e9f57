"""The cross-model linear map as a run (``effdepth map``, the book's map page): its examples (test,
validation and training prompts in the task's order), its measurement, and its run directory kept
as ``results.run`` keeps a probe's — read (verified) when there, else computed under the lock."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import polars as pl

from . import __version__
from .errors import EffdepthError
from .models import LoadedModel, load_model
from .results import peak_rss_mb, require_finite_frame
from .rundir import FORMAT, RunDirectory
from .settings import MAX_GENERATED, MapSettings
from .task_loading import load_task
from .tasks import Example

MAP_FRAMES = {"map": ("map", "map_by_example")}  # the map's run directory: its frames (per test prompt: by_example)


def _map_examples(settings: MapSettings, small: LoadedModel) -> tuple[list[Example], int, int]:
    """Test, validation and training examples in the task's sampling order: the first ``n`` test,
    the next ``n_validation`` validate, and then training prompts until they hold
    ``tokens_per_width`` × the small model's width tokens. Returns the examples, the number of
    training prompts and their tokens."""

    def count(text: str) -> int:
        return int(small.encode(text).numel())

    if settings.ridge is not None:  # the map before the measurement: halves of n, no validation
        examples = load_task(settings.task, count_tokens=count, **settings.task_options())
        return examples, len(examples) // 2, sum(count(e.prompt) for e in examples[: len(examples) // 2])
    held = settings.n + settings.n_validation
    wanted, examples = settings.tokens_per_width * small.d_model, []
    size = settings.pool_size() or MAX_GENERATED  # n never asks for more prompts than the task has
    n = min(held + 16, size)
    while True:
        examples = load_task(settings.task, count_tokens=count, **settings.task_options(n))
        tokens = [count(e.prompt) for e in examples[held:]]
        total = sum(tokens)
        if total >= wanted or len(examples) < n or n == size:
            break
        n = min(held + int(len(tokens) * wanted / max(total, 1) * 1.2) + 1, size)
    if total < wanted:
        raise EffdepthError(
            f"{settings.task} has {total} training tokens after the {held} held-out prompts, below "
            f"{settings.tokens_per_width} × {small.d_model} (the small model's width): lower --tokens-per-width"
        )
    kept, running = [], 0
    for example, tokens in zip(examples[held:], [count(e.prompt) for e in examples[held:]], strict=True):
        if running >= wanted:
            break
        kept.append(example)
        running += tokens
    return examples[:held] + kept, len(kept), running


def run_map(settings: MapSettings, out_dir: Path | str | None = None, overwrite: bool = False) -> pl.DataFrame:
    """The map's long frame (``map_measurement``; with a fixed ridge, ``cross_model_map``) plus its
    counts (``n_train_prompts``, ``n_train_tokens``, ``n_validation_prompts``, ``n_test_prompts``,
    ``small_width``); with ``out_dir``, kept in a run directory as ``run`` keeps a probe's results:
    read (verified) when there, else computed and written under the lock."""
    from .linear_map import cross_model_map, map_measurement

    settings.check()
    key = settings.key()
    directory = None
    if out_dir is not None:
        described = {k: v for k, v in asdict(settings).items() if k not in ("device", "progress")}
        directory = RunDirectory.open(Path(out_dir).expanduser(), key, described, MAP_FRAMES, overwrite)
    try:
        if directory is not None and directory.has_probe("map"):
            metadata = directory.read_metadata_or_fail()
            per_prompt, saved = directory.read_probes(metadata)
            return pl.concat([saved["map"], per_prompt["map"]], how="diagonal_relaxed")
        small = load_model(settings.small, device=settings.device, dtype=settings.dtype, progress=settings.progress)
        big = load_model(settings.big, device=settings.device, dtype=settings.dtype, progress=settings.progress)
        examples, n_train, train_tokens = _map_examples(settings, small)
        prompts = [e.prompt for e in examples]
        started = time.perf_counter()
        if settings.ridge is not None:
            train, test, validation = prompts[:n_train], prompts[n_train:], []
            frame = cross_model_map(small, big, train, test, ridge=settings.ridge, progress=settings.progress)
        else:
            test, validation = prompts[: settings.n], prompts[settings.n : settings.n + settings.n_validation]
            train = prompts[settings.n + settings.n_validation :]
            frame = map_measurement(small, big, train, validation, test, seed=settings.seed, progress=settings.progress)
        counts = {
            "n_train_prompts": len(train),
            "n_train_tokens": train_tokens,
            "n_validation_prompts": len(validation),
            "n_test_prompts": len(test),
            "small_width": small.d_model,
        }
        frame = pl.concat(
            [frame, pl.DataFrame({"metric": list(counts), "value": [float(v) for v in counts.values()]})],
            how="diagonal_relaxed",
        )
        require_finite_frame(frame, "linear map")
        if directory is not None:
            metadata = {
                "format": FORMAT,
                "key": key,
                "settings": {k: v for k, v in asdict(settings).items() if k != "progress"},
                "effdepth_version": __version__,
                "model_name": f"{small.name} → {big.name}",
                "n_layers": small.n_layers,
                "n_examples": len(test),
                "n_asked": settings.n,
                "n_lines": len(examples),  # test, validation and training prompts
                "probes": {},
            }
            from .provenance import environment

            metadata["environment"] = environment()
            directory.start(metadata, examples)
            by_prompt = frame.filter(pl.col("prompt").is_not_null()) if "prompt" in frame.columns else frame.head(0)
            rest = frame.filter(pl.col("prompt").is_null()) if "prompt" in frame.columns else frame
            record = {"seconds": round(time.perf_counter() - started, 4), "peak_rss_mb": peak_rss_mb(), "key": key}
            directory.save_probe("map", {"map_by_example": by_prompt, "map": rest}, record)
        return frame
    except BaseException:
        if directory is not None:
            directory.discard_if_empty()
        raise
    finally:
        if directory is not None:
            directory.release()
