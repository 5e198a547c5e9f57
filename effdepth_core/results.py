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
from .probes import (
    depth_scores,
    erasure_map,
    integrated_gradients,
    logit_lens,
    residual_cosine,
    skip_effects,
    skip_summary,
    token_weighted_mean,
)
from .tasks import Example, check_task, load_task

DEFAULT_PROBES = ("cosine", "logit_lens")


def _prompts(examples: list[Example]) -> list[str]:
    return [e.prompt for e in examples]


def _cosine(loaded: LoadedModel, examples: list[Example], settings: RunSettings) -> pl.DataFrame:
    return residual_cosine(loaded, _prompts(examples), batch_size=settings.batch_size, progress=settings.progress)


def _lens(loaded: LoadedModel, examples: list[Example], settings: RunSettings) -> pl.DataFrame:
    return logit_lens(
        loaded, _prompts(examples), top_k=settings.top_k, batch_size=settings.batch_size, progress=settings.progress
    )


def _skip(loaded: LoadedModel, examples: list[Example], settings: RunSettings) -> pl.DataFrame:
    return skip_effects(
        loaded,
        _prompts(examples),
        n_positions=settings.skip_positions,
        parts=settings.skip_parts.split(","),
        seed=settings.seed,
        method=settings.method,
        progress=settings.progress,
    )


def _erasure(loaded: LoadedModel, examples: list[Example], settings: RunSettings) -> pl.DataFrame:
    return erasure_map(loaded, examples, method=settings.method, progress=settings.progress)


def _igrad(loaded: LoadedModel, examples: list[Example], settings: RunSettings) -> pl.DataFrame:
    return integrated_gradients(
        loaded,
        examples,
        steps=settings.igrad_steps,
        quadrature=settings.igrad_quadrature,
        baseline=settings.igrad_baseline,
        method=settings.method,
        progress=settings.progress,
    )


@dataclass(frozen=True)
class Probe:
    """How the orchestrator runs one probe: its per-example frame, and the frame that is saved as
    ``<probe>.parquet`` (curves for the correlational probes; the full frame for the others)."""

    compute: Callable[[LoadedModel, list[Example], RunSettings], pl.DataFrame]
    aggregate: Callable[[pl.DataFrame], pl.DataFrame] | None = None  # None: per-example frame is the result


PROBES: dict[str, Probe] = {
    "cosine": Probe(_cosine, token_weighted_mean),
    "logit_lens": Probe(_lens, token_weighted_mean),
    "skip": Probe(_skip, skip_summary),
    "erasure": Probe(_erasure),
    "igrad": Probe(_igrad),
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
    max_tokens: int | None = None  # drop longer prompts (aime24 defaults to 400, as in the paper)
    top_k: int = 5
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = 4
    kl_fraction: float = KL_FRACTION
    overlap_threshold: float = OVERLAP_THRESHOLD
    skip_positions: int = 4
    skip_parts: str = "layer,attn,mlp"
    igrad_steps: int = 128  # the budget of gradient evaluations for the adaptive rule
    igrad_quadrature: str = "adaptive"
    igrad_baseline: str = "position-mean"
    method: str = "fast"  # "slow": the one-forward-per-intervention oracle (same numbers)
    progress: bool = True

    def key(self) -> str:
        """Hash of the settings that change numbers (not device, batch size, or display)."""
        fields = asdict(self)
        for ignored in ("device", "batch_size", "progress", "kl_fraction", "overlap_threshold", "method"):
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


def _group_label(example: Example) -> str:
    """Difficulty group of an example for the depth score: MATH level, operand digits, or task."""
    meta = example.meta
    if "level" in meta:
        return f"level {meta['level']}"
    if "digits" in meta:
        return f"{meta['digits']} digits"
    return str(meta.get("task", "all"))


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
                max_tokens=settings.max_tokens,
            )
        out.mkdir(parents=True, exist_ok=True)  # only now: a run that cannot load leaves nothing behind
        atomic_write_bytes(out / "examples.jsonl", "".join(json.dumps(e.to_json()) + "\n" for e in examples).encode())
        metadata.update(
            model_name=loaded.name,
            model_type=loaded.model_type,
            n_layers=loaded.n_layers,
            d_model=loaded.d_model,
            n_params=sum(p.numel() for p in loaded.model.parameters()),
            dtype=str(loaded.dtype).removeprefix("torch."),
            n_examples=len(examples),
        )
        for name in missing:
            started = time.perf_counter()
            probe = PROBES[name]
            per_example = probe.compute(loaded, examples, settings)
            result = per_example if probe.aggregate is None else probe.aggregate(per_example)
            atomic_write_parquet(out / f"{name}.parquet", result)
            atomic_write_parquet(out / f"{name}_by_example.parquet", per_example)  # last: marks the probe done
            if name == "skip":
                groups = {i: _group_label(e) for i, e in enumerate(examples)}
                atomic_write_parquet(out / "depth_score.parquet", depth_scores(per_example, groups))
            metadata["probes"][name] = {"seconds": round(time.perf_counter() - started, 2)}
            atomic_write_json(meta_path, metadata)
    atomic_write_json(meta_path, metadata)

    present = [p for p in PROBES if (out / f"{p}_by_example.parquet").is_file()]  # earlier calls' too
    per_example = {p: pl.read_parquet(out / f"{p}_by_example.parquet") for p in present}
    curves = {p: pl.read_parquet(out / f"{p}.parquet") for p in present}  # the saved result of each probe
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
    if (out / "depth_score.parquet").is_file():
        scores = pl.read_parquet(out / "depth_score.parquet").filter(pl.col("example").is_null())
        summary["depth_score"] = {
            row["group"]: row["value"] for row in scores.filter(metric="depth_score").iter_rows(named=True)
        }
    atomic_write_json(out / "effective_depth.json", summary)
    return RunResult(out, curves, per_example, depth, summary)
