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
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl

from . import __version__
from .depth import KL_FRACTION, OVERLAP_THRESHOLD, DepthResult, effective_depth
from .errors import EffdepthError, NonFiniteActivationError
from .models import LoadedModel, load_model, preflight_model
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
from .rundir import METADATA, RunDirectory
from .tasks import AIME_MAX_TOKENS, Example, check_task, load_task

DEFAULT_PROBES = ("cosine", "logit_lens")


class EffdepthWarning(UserWarning):
    """Something the user should know about a run that still went ahead (the CLI prints one line)."""


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
        variants=settings.skip_variants.split(","),
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
    skip_variants: str = "future,current"
    igrad_steps: int = 128  # the budget of gradient evaluations for the adaptive rule
    igrad_quadrature: str = "adaptive"
    igrad_baseline: str = "position-mean"
    method: str = "fast"  # "slow": the one-forward-per-intervention oracle (same numbers)
    device_map: str | None = None
    progress: bool = True

    def key(self) -> str:
        """Hash of the settings that change numbers (not device, batch size, or display).

        Settings added after a release enter the hash only when they differ from their default,
        so results cached by earlier versions keep their key."""
        fields = asdict(self)
        for ignored in ("device", "batch_size", "progress", "kl_fraction", "overlap_threshold", "method", "device_map"):
            fields.pop(ignored)
        for name, default in _KEY_OPTIONAL.items():
            if fields[name] == default:
                fields.pop(name)
        task_path = Path(self.task).expanduser()
        if task_path.is_file():
            fields["task_sha256"] = hashlib.sha256(task_path.read_bytes()).hexdigest()
        model_path = Path(self.model).expanduser()
        if model_path.exists():  # a path: the same spelling elsewhere is another model
            fields["model_path"] = str(model_path.resolve())
        fields["version"] = __version__
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    def numbers(self) -> dict:
        """The settings as stored in ``metadata.json`` (display-only fields left out)."""
        return {k: v for k, v in asdict(self).items() if k != "progress"}


_KEY_OPTIONAL = {"skip_variants": "future,current"}


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


def default_out_dir(settings: RunSettings, root: Path | str = "results", hashed: bool = True) -> Path:
    """``results/<model>/<task>-n<N>-seed<S>[-level<l>][-digits<d>]-<key>``: the short key hash makes
    the name differ whenever anything that changes the numbers differs (a task file's content, a
    model path, ``--top-k``, ``--dtype``, ``--max-tokens``, …). ``hashed=False`` leaves it out (the
    book's results tree, whose parameters live in params/)."""
    name = f"{slug(settings.task)}-n{settings.n}-seed{settings.seed}"
    if settings.level is not None:
        name += f"-level{settings.level}"
    if settings.task in ("addition", "multiplication"):
        name += f"-digits{settings.digits}"
    return Path(root) / slug(settings.model) / (f"{name}-{settings.key()[:8]}" if hashed else name)


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


def parse_probes(probes: str | Sequence[str]) -> list[str]:
    names = [p.strip() for p in probes.split(",")] if isinstance(probes, str) else list(probes)
    names = [p for p in names if p]
    unknown = [p for p in names if p not in PROBES]
    if unknown or not names:
        raise EffdepthError(f"unknown probe(s) {', '.join(unknown) or '(none given)'}; available: {', '.join(PROBES)}")
    return names


def _require_finite_frame(frame: pl.DataFrame, probe: str) -> None:
    """Nothing non-finite is cached or reported (nulls mean "not defined" and are allowed)."""
    floats = [c for c, t in frame.schema.items() if t.is_float()]
    if not floats or frame.is_empty():
        return
    bad = sum(int((~frame[c].is_finite()).fill_null(False).sum()) for c in floats)
    if bad:
        raise NonFiniteActivationError(
            f"the {probe} probe produced {bad} NaN or inf value(s); nothing was cached — try --dtype float32 or "
            "check the weights"
        )


def check_settings(settings: RunSettings, probes: Sequence[str], vocab_size: int | None = None) -> None:
    """One-line errors for option values that cannot work, found before any model loads."""
    from .probes.igrad import _PANEL_ORDER, BASELINES, QUADRATURES
    from .probes.skip import check_skip_options

    for name in ("n", "batch_size", "skip_positions", "igrad_steps", "top_k", "digits"):
        if getattr(settings, name) < 1:
            raise EffdepthError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(settings, name)}")
    if settings.max_tokens is not None and settings.max_tokens < 1:
        raise EffdepthError(f"--max-tokens must be at least 1, got {settings.max_tokens}")
    if settings.level is not None:
        if settings.task != "math":
            raise EffdepthError(f"--level applies to the math task only, not {settings.task!r}")
        if settings.level not in range(1, 6):
            raise EffdepthError(f"--level must be 1..5 (MATH difficulty levels), got {settings.level}")
    if settings.source not in ("local", "hub"):
        raise EffdepthError(f"--source must be local or hub, got {settings.source!r}")
    if settings.method not in ("fast", "slow"):
        raise EffdepthError(f"method must be 'fast' or 'slow', got {settings.method!r}")
    if vocab_size is not None and settings.top_k > vocab_size:
        raise EffdepthError(
            f"--top-k {settings.top_k} exceeds the vocabulary of {settings.model} ({vocab_size})"
        )
    if "skip" in probes:
        check_skip_options(settings.skip_parts.split(","), settings.skip_variants.split(","))
    if "igrad" in probes:
        if settings.igrad_quadrature not in QUADRATURES:
            raise EffdepthError(f"--igrad-quadrature must be one of {', '.join(QUADRATURES)}")
        if settings.igrad_baseline not in BASELINES:
            raise EffdepthError(f"--igrad-baseline must be one of {', '.join(BASELINES)}")
        if settings.igrad_quadrature == "adaptive":
            if settings.igrad_steps < _PANEL_ORDER:
                raise EffdepthError(
                    f"--igrad-steps {settings.igrad_steps} is too few for the adaptive quadrature "
                    f"(its panels have {_PANEL_ORDER} Gauss nodes; give at least {_PANEL_ORDER}, 128 by default)"
                )
            if settings.method == "slow":
                raise EffdepthError(
                    "--slow has no adaptive quadrature; add --igrad-quadrature riemann (the paper's, 256 steps)"
                )


def _load_examples(settings: RunSettings, loaded: LoadedModel | None) -> list[Example]:
    """The run's examples; with ``loaded`` None, the token-length filter is not applied (a check
    of the task and ``n`` before the model loads)."""
    return load_task(
        settings.task,
        n=settings.n,
        seed=settings.seed,
        source=settings.source,
        level=settings.level,
        digits=settings.digits,
        count_tokens=None if loaded is None else (lambda text: int(loaded.encode(text).numel())),
        max_tokens=settings.max_tokens,
    )


def _needs_tokenizer(settings: RunSettings) -> bool:
    return settings.max_tokens is not None or settings.task == "aime24"


def _write_probe(out: Path, name: str, per_example: pl.DataFrame, examples: list[Example]) -> None:
    probe = PROBES[name]
    result = per_example if probe.aggregate is None else probe.aggregate(per_example)
    _require_finite_frame(per_example, name)
    _require_finite_frame(result, name)
    derived = {}
    if name == "skip":
        groups = {i: _group_label(e) for i, e in enumerate(examples)}
        derived["depth_score"] = depth_scores(per_example, groups)
        _require_finite_frame(derived["depth_score"], "depth score")
    atomic_write_parquet(out / f"{name}.parquet", result)
    for derived_name, frame in derived.items():
        atomic_write_parquet(out / f"{derived_name}.parquet", frame)
    atomic_write_parquet(out / f"{name}_by_example.parquet", per_example)  # last: marks the probe done


def run(
    settings: RunSettings,
    probes: str | Sequence[str] = DEFAULT_PROBES,
    out_dir: Path | str | None = None,
    loaded: LoadedModel | None = None,
    examples: list[Example] | None = None,
    n_bootstrap: int = 1000,
    overwrite: bool = False,
) -> RunResult:
    """Run ``probes`` for the settings' model and task, reusing any finished results in ``out_dir``.

    ``loaded`` / ``examples`` may be passed to skip loading (tests, notebooks, benchmarks).
    ``out_dir`` must be new, empty, or a run directory of the same settings; ``overwrite`` lets a
    run with other settings be replaced (only effdepth's own files are deleted, and only once the
    model has loaded).
    """
    names = parse_probes(probes)
    check_task(settings.task)
    facts = preflight_model(settings.model) if loaded is None else {"vocab_size": loaded.vocab_size}
    check_settings(settings, names, facts.get("vocab_size"))
    if examples is None and not (loaded is None and _needs_tokenizer(settings)):
        examples = _load_examples(settings, loaded)  # checks the task and n before the model loads
    elif examples is None:
        _load_examples(settings, None)
    out = Path(out_dir) if out_dir is not None else default_out_dir(settings)
    key = settings.key()
    directory = RunDirectory.open(out, key, settings.numbers(), tuple(PROBES), overwrite)
    finished = 0  # probes this call completed
    try:
        metadata = directory.metadata if directory.metadata and not directory.stale else _new_metadata(settings, key)
        done = {p for p in PROBES if not directory.stale and (out / f"{p}_by_example.parquet").is_file()}
        missing = [p for p in names if p not in done]
        if missing or directory.stale or not (out / "examples.jsonl").is_file():
            if loaded is None:
                loaded = load_model(
                    settings.model, device=settings.device, dtype=settings.dtype, device_map=settings.device_map
                )
            check_settings(settings, names, loaded.vocab_size)
            if examples is None or _needs_tokenizer(settings):
                examples = _load_examples(settings, loaded)
            if len(examples) < settings.n:
                warnings.warn(
                    f"{settings.task}: kept {len(examples)} of the {settings.n} examples asked for; the others are "
                    f"longer than {settings.max_tokens or AIME_MAX_TOKENS} tokens for this tokenizer",
                    EffdepthWarning,
                    stacklevel=2,
                )
            directory.clear_stale()
            metadata.update(
                model_name=loaded.name,
                model_type=loaded.model_type,
                n_layers=loaded.n_layers,
                d_model=loaded.d_model,
                n_params=sum(p.numel() for p in loaded.model.parameters()),
                dtype=str(loaded.dtype).removeprefix("torch."),
                n_examples=len(examples),
                n_asked=settings.n,
            )
            atomic_write_json(out / METADATA, metadata)  # first: marks the directory as effdepth's
            atomic_write_bytes(
                out / "examples.jsonl", "".join(json.dumps(e.to_json()) + "\n" for e in examples).encode()
            )
            for name in missing:
                started = time.perf_counter()
                _write_probe(out, name, PROBES[name].compute(loaded, examples, settings), examples)
                finished += 1
                metadata["probes"][name] = {"seconds": round(time.perf_counter() - started, 2)}
                atomic_write_json(out / METADATA, metadata)
        return _summarize(settings, out, metadata, n_bootstrap)
    except BaseException:
        if directory.metadata is None and not finished:  # a new run that produced nothing leaves nothing
            for name in (METADATA, "examples.jsonl"):
                (out / name).unlink(missing_ok=True)
            directory.abandon()
        raise
    finally:
        directory.release()


def _new_metadata(settings: RunSettings, key: str) -> dict:
    return {"key": key, "settings": settings.numbers(), "effdepth_version": __version__, "probes": {}}


def _summarize(settings: RunSettings, out: Path, metadata: dict, n_bootstrap: int) -> RunResult:
    """Read every finished probe of the run directory and compute ED per rule."""
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
        "n_asked": int(metadata.get("n_asked", metadata["n_examples"])),
        **{rule: result.to_json() for rule, result in depth.items()},
    }
    if settings.level is not None:
        summary["level"] = settings.level
    if settings.task in ("addition", "multiplication"):
        summary["digits"] = settings.digits
    if (out / "depth_score.parquet").is_file():
        scores = pl.read_parquet(out / "depth_score.parquet").filter(pl.col("example").is_null())
        summary["depth_score"] = {
            row["group"]: row["value"] for row in scores.filter(metric="depth_score").iter_rows(named=True)
        }
    atomic_write_json(out / "effective_depth.json", summary)
    return RunResult(out, curves, per_example, depth, summary)
