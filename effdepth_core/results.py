"""One orchestrator: run probes for (model, task), cache results on disk, resume, compute ED.

A run directory holds ``<probe>.parquet`` (curves: ``layer, metric, value``),
``<probe>_by_example.parquet`` (per prompt, for intervals), ``examples.jsonl`` (the exact
prompts), ``effective_depth.json`` and ``metadata.json`` (the run's parameters and key).
Every file is written to a temporary name and renamed, so an interrupted run leaves none
half-written; a rerun with the same parameters recomputes only what is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl

from . import __version__
from .depth import KL_FRACTION, OVERLAP_THRESHOLD, DepthResult, effective_depth
from .errors import EffdepthError
from .models import LoadedModel, load_model
from .probes import logit_lens, residual_cosine, token_weighted_mean
from .tasks import Example, check_task, load_task

DEFAULT_PROBES = ("cosine", "logit_lens")


def _cosine(loaded: LoadedModel, prompts: list[str], settings: RunSettings) -> pl.DataFrame:
    return residual_cosine(loaded, prompts, batch_size=settings.batch_size, progress=settings.progress)


def _lens(loaded: LoadedModel, prompts: list[str], settings: RunSettings) -> pl.DataFrame:
    return logit_lens(loaded, prompts, top_k=settings.top_k, batch_size=settings.batch_size, progress=settings.progress)


# name -> (loaded, prompts, settings) -> per-example frame
PROBES: dict[str, Callable[[LoadedModel, list[str], RunSettings], pl.DataFrame]] = {
    "cosine": _cosine,
    "logit_lens": _lens,
}


@dataclass
class RunSettings:
    """Everything that determines a run's numbers (and so its cache key), plus how to show it."""

    model: str
    task: str
    n: int = 10
    seed: int = 0
    source: str = "local"
    level: int | None = None
    digits: int = 6
    top_k: int = 5
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = 4
    kl_fraction: float = KL_FRACTION
    overlap_threshold: float = OVERLAP_THRESHOLD
    progress: bool = True

    def key(self) -> str:
        """Hash of the settings that change numbers (not device, batch size, or display)."""
        fields = asdict(self)
        for ignored in ("device", "batch_size", "progress", "kl_fraction", "overlap_threshold"):
            fields.pop(ignored)
        task_path = Path(self.task).expanduser()
        if task_path.is_file():
            fields["task_sha256"] = hashlib.sha256(task_path.read_bytes()).hexdigest()
        fields["version"] = __version__
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class RunResult:
    """What ``run`` produced: where, the curves, the per-example frames and the ED per rule."""

    out_dir: Path
    curves: dict[str, pl.DataFrame]
    per_example: dict[str, pl.DataFrame]
    depth: dict[str, DepthResult]
    summary: dict = field(default_factory=dict)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(text).stem if text.endswith((".jsonl", ".gguf")) else text).strip("_")


def default_out_dir(settings: RunSettings, root: Path | str = "results") -> Path:
    name = f"{slug(settings.task)}-n{settings.n}-seed{settings.seed}"
    if settings.level is not None:
        name += f"-level{settings.level}"
    if settings.task in ("addition", "multiplication"):
        name += f"-digits{settings.digits}"
    return Path(root) / slug(settings.model) / name


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def atomic_write_json(path: Path, payload: dict) -> None:
    atomic_write_bytes(path, (json.dumps(payload, indent=2) + "\n").encode())


def atomic_write_parquet(path: Path, frame: pl.DataFrame) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    frame.write_parquet(tmp)
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def parse_probes(probes: str | Sequence[str]) -> list[str]:
    names = [p.strip() for p in probes.split(",")] if isinstance(probes, str) else list(probes)
    names = [p for p in names if p]
    unknown = [p for p in names if p not in PROBES]
    if unknown or not names:
        raise EffdepthError(f"unknown probe(s) {', '.join(unknown) or '(none given)'}; available: {', '.join(PROBES)}")
    return names


def run(
    settings: RunSettings,
    probes: str | Sequence[str] = DEFAULT_PROBES,
    out_dir: Path | str | None = None,
    loaded: LoadedModel | None = None,
    examples: list[Example] | None = None,
    n_bootstrap: int = 1000,
) -> RunResult:
    """Run ``probes`` for the settings' model and task, reusing any finished results in ``out_dir``.

    ``loaded`` / ``examples`` may be passed to skip loading (tests, notebooks, benchmarks).
    """
    names = parse_probes(probes)
    check_task(settings.task)
    out = Path(out_dir) if out_dir is not None else default_out_dir(settings)
    out.mkdir(parents=True, exist_ok=True)
    key = settings.key()
    meta_path = out / "metadata.json"
    metadata = _read_json(meta_path) or {}
    if metadata.get("key") != key:  # other parameters were used here: start afresh
        for stale in [*out.glob("*.parquet"), out / "examples.jsonl", out / "effective_depth.json"]:
            stale.unlink(missing_ok=True)
        metadata = {"key": key, "settings": {k: v for k, v in asdict(settings).items() if k != "progress"}}
        metadata["effdepth_version"] = __version__
        metadata["probes"] = {}
    missing = [p for p in names if not (out / f"{p}_by_example.parquet").is_file()]

    if missing or not (out / "examples.jsonl").is_file():
        if loaded is None:
            loaded = load_model(settings.model, device=settings.device, dtype=settings.dtype)
        if examples is None:
            examples = load_task(
                settings.task,
                n=settings.n,
                seed=settings.seed,
                source=settings.source,
                level=settings.level,
                digits=settings.digits,
                count_tokens=lambda text: int(loaded.encode(text).numel()),
            )
        atomic_write_bytes(out / "examples.jsonl", "".join(json.dumps(e.to_json()) + "\n" for e in examples).encode())
        metadata.update(
            model_name=loaded.name,
            model_type=loaded.model_type,
            n_layers=loaded.n_layers,
            d_model=loaded.d_model,
            dtype=str(loaded.dtype).removeprefix("torch."),
            n_examples=len(examples),
        )
        prompts = [e.prompt for e in examples]
        for name in missing:
            started = time.perf_counter()
            per_example = PROBES[name](loaded, prompts, settings)
            atomic_write_parquet(out / f"{name}_by_example.parquet", per_example)
            atomic_write_parquet(out / f"{name}.parquet", token_weighted_mean(per_example))
            metadata["probes"][name] = {"seconds": round(time.perf_counter() - started, 2)}
            atomic_write_json(meta_path, metadata)
    atomic_write_json(meta_path, metadata)

    present = [p for p in PROBES if (out / f"{p}_by_example.parquet").is_file()]  # earlier calls' too
    per_example = {p: pl.read_parquet(out / f"{p}_by_example.parquet") for p in present}
    curves = {p: pl.read_parquet(out / f"{p}.parquet") for p in present}
    n_layers = int(metadata["n_layers"])
    depth = effective_depth(
        per_example.get("cosine"),
        per_example.get("logit_lens"),
        n_layers,
        kl_fraction=settings.kl_fraction,
        overlap_threshold=settings.overlap_threshold,
        n_bootstrap=n_bootstrap,
        seed=settings.seed,
    )
    summary = {
        "model": settings.model,
        "task": settings.task,
        "n_layers": n_layers,
        "n_examples": int(metadata["n_examples"]),
        **{rule: result.to_json() for rule, result in depth.items()},
    }
    atomic_write_json(out / "effective_depth.json", summary)
    return RunResult(out, curves, per_example, depth, summary)
