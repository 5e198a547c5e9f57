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
import math
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl
import torch

from . import __version__
from .depth import KL_FRACTION, OVERLAP_THRESHOLD, DepthResult, effective_depth
from .errors import EffdepthError, EffdepthWarning, NonFiniteActivationError
from .labels import CELL_LEGEND, DEFAULT_PROBES, LENSES, PROBE_NAMES, RULE_LABELS, TUNED_RULE_LABELS, format_rule
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
from .probes.early_exit import early_exit, early_exit_summary
from .probes.pruning import layer_pruning, prune_summary
from .probes.tuned_lens import LensTraining, cached_tuned_lens, fit_frame
from .rundir import OutputDirectoryError, RunDirectory
from .tasks import AIME_MAX_TOKENS, Example, check_task, load_task


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
        parts=names_of(settings.skip_parts),
        variants=names_of(settings.skip_variants),
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
        tolerance=settings.igrad_tol,
        max_steps=settings.igrad_max_steps,
    )


PRUNE_CALIBRATION_TEXTS = 32  # lens-corpus texts (~2,500 tokens) that block influence and angles are measured on


def _lens_training(settings: RunSettings) -> LensTraining:
    heldout = min(1024, max(128, settings.lens_tokens // 8))  # 1024 at the default 8192 training tokens
    return LensTraining(train_tokens=settings.lens_tokens, heldout_tokens=heldout, steps=settings.lens_steps)


def _tuned(loaded: LoadedModel, examples: list[Example], settings: RunSettings):
    lens = cached_tuned_lens(settings.model, loaded, _lens_training(settings), progress=settings.progress)
    frame = logit_lens(
        loaded,
        _prompts(examples),
        top_k=settings.top_k,
        batch_size=settings.batch_size,
        progress=settings.progress,
        lens=lens,
    )
    return frame, {"tuned_lens_fit": fit_frame(lens)}


def _prune(loaded: LoadedModel, examples: list[Example], settings: RunSettings) -> pl.DataFrame:
    from .tasks import lens_corpus

    sizes = [int(k) for k in names_of(settings.prune_sizes)] or None
    # the rules choose layers on calibration text (never probed), so the scored prompts stay held out
    calibration = lens_corpus()[:PRUNE_CALIBRATION_TEXTS]
    return layer_pruning(loaded, examples, block_sizes=sizes, calibration=calibration, progress=settings.progress)


def _early_exit(loaded: LoadedModel, examples: list[Example], settings: RunSettings) -> pl.DataFrame:
    frames = []
    for lens_name in ("logit", "tuned"):
        if settings.lens in (lens_name, "both"):
            lens = None
            if lens_name == "tuned":
                lens = cached_tuned_lens(settings.model, loaded, _lens_training(settings), progress=settings.progress)
            frame = early_exit(loaded, examples, lens=lens, progress=settings.progress)
            frames.append(frame.with_columns(lens=pl.lit(lens_name)))
    return pl.concat(frames)


def _depth_score(skip: pl.DataFrame, examples: list[Example]) -> pl.DataFrame | None:
    """The depth score needs the future-token, whole-layer skips (None when they were not run)."""
    if skip.filter(variant="future", part="layer", metric="output_effect").is_empty():
        return None
    return depth_scores(skip, {i: _group_label(e) for i, e in enumerate(examples)})


@dataclass(frozen=True)
class Probe:
    """How the orchestrator runs one probe: its per-example frame, the frame saved as
    ``<probe>.parquet`` (curves for the correlational probes; the full frame for the others), and
    the frames derived from it (saved as ``<name>.parquet``)."""

    compute: Callable[[LoadedModel, list[Example], RunSettings], pl.DataFrame | tuple[pl.DataFrame, dict]]
    aggregate: Callable[[pl.DataFrame], pl.DataFrame] | None = None  # None: per-example frame is the result
    derives: dict[str, Callable[[pl.DataFrame, list[Example]], pl.DataFrame | None]] = field(default_factory=dict)


PROBES: dict[str, Probe] = {
    "cosine": Probe(_cosine, token_weighted_mean),
    "logit_lens": Probe(_lens, token_weighted_mean),
    "skip": Probe(_skip, skip_summary, {"depth_score": _depth_score}),
    "erasure": Probe(_erasure),
    "igrad": Probe(_igrad),
    "tuned_lens": Probe(_tuned, token_weighted_mean),  # derives tuned_lens_fit (held-out KL per layer)
    "prune": Probe(_prune, prune_summary),
    "early_exit": Probe(_early_exit, early_exit_summary),
}
assert tuple(PROBES) == PROBE_NAMES  # labels.py names them for the import-light command line


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
    igrad_tol: float = 0.01  # completeness tolerance, a share of |target change|, the adaptive rule stops at
    igrad_max_steps: int | None = None  # the adaptive rule's cap on gradient evaluations (None: 8 × igrad_steps)
    method: str = "fast"  # "slow": the one-forward-per-intervention oracle (same numbers)
    device_map: str | None = None
    lens: str = "logit"  # logit | tuned | both: the lens probe's and early exit's lens(es)
    lens_steps: int = 200  # tuned-lens training (method.md §7a); cached per model and setting
    lens_tokens: int = 8192
    prune_sizes: str = ""  # block sizes k for pruning (default 1, 2, 4, ceil(L/4))
    progress: bool = True

    def __post_init__(self) -> None:
        sizes = names_of(self.prune_sizes)
        if all(k.isdigit() for k in sizes):  # one spelling per set of sizes ("2,1", "1,,2" → "1,2")
            self.prune_sizes = ",".join(str(k) for k in sorted({int(k) for k in sizes}))

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
        from .models import resolve_device, resolve_dtype

        try:
            device = resolve_device(self.device)
        except EffdepthError:
            device = "cpu"  # an unusable device is refused before the run starts
        if self.dtype == "auto":  # the dtype it resolves to changes the numbers (bf16 on a GPU)
            resolved = str(resolve_dtype("auto", device)).removeprefix("torch.")
            if resolved != "float32":  # float32 keeps the key results cached before this was added
                fields["dtype"] = f"auto:{resolved}"
        device_type = "cuda" if self.device_map and torch.cuda.is_available() else torch.device(device).type
        if device_type != "cpu":  # GPU kernels round otherwise: a GPU run never resumes a CPU run's results
            fields["device_type"] = device_type
        fields["version"] = __version__
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    def numbers(self) -> dict:
        """The settings as stored in ``metadata.json`` (display-only fields left out)."""
        return {k: v for k, v in asdict(self).items() if k != "progress"}


_KEY_OPTIONAL = {
    "skip_variants": "future,current",
    "lens": "logit",
    "lens_steps": 200,
    "lens_tokens": 8192,
    "prune_sizes": "",
    "igrad_tol": 0.01,
    "igrad_max_steps": None,
}


@dataclass(repr=False)
class RunResult:
    """What ``run`` produced: where, the curves, the per-example frames and the ED per rule."""

    out_dir: Path
    curves: dict[str, pl.DataFrame]
    per_example: dict[str, pl.DataFrame]
    depth: dict[str, DepthResult]
    summary: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)

    def _cells(self) -> list[tuple[str, str]]:
        labels = {**RULE_LABELS, **{r: label for r, label in TUNED_RULE_LABELS.items() if r in self.summary}}
        return [(label, format_rule(self.summary.get(rule))) for rule, label in labels.items()]

    def __repr__(self) -> str:
        s = self.summary
        eds = ", ".join(f"{label} {cell}" for label, cell in self._cells())
        return (
            f"RunResult({s.get('model')!r} on {s.get('task')!r}, L={s.get('n_layers')}, n={s.get('n_examples')}; "
            f"ED {eds}; probes {', '.join(self.per_example)}; in {str(self.out_dir)!r})"
        )

    def _repr_html_(self) -> str:
        import html

        s = self.summary
        head = "".join(f"<th>{html.escape(label)}</th>" for label, _ in self._cells())
        cells = "".join(f"<td>{html.escape(cell)}</td>" for _, cell in self._cells())
        return (
            f"<p><b>{html.escape(str(s.get('model')))}</b> on <b>{html.escape(str(s.get('task')))}</b>: "
            f"L = {s.get('n_layers')}, n = {s.get('n_examples')} prompts; probes {', '.join(self.per_example)}; "
            f"results in <code>{html.escape(str(self.out_dir))}</code></p>"
            f"<table><tr>{head}</tr><tr>{cells}</tr></table><p><small>{html.escape(CELL_LEGEND)}</small></p>"
        )


def _group_label(example: Example) -> str:
    """Difficulty group of an example for the depth score: MATH level, operand digits, or task."""
    meta = example.meta
    if "level" in meta:
        return f"level {meta['level']}"
    if "digits" in meta:
        return f"{meta['digits']} digits"
    return str(meta.get("task", "all"))


def slug(text: str) -> str:
    """A file-name-safe form of a model or task spec (never hidden: no leading dot)."""
    name = Path(text).stem if text.endswith((".jsonl", ".gguf")) else text
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_.") or "model"


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


def names_of(text: str) -> list[str]:
    """The names in a comma list (spaces around them ignored)."""
    return [name.strip() for name in text.split(",") if name.strip()]


def parse_probes(probes: str | Sequence[str], lens: str = "logit") -> list[str]:
    """The probe names; ``lens`` tuned or both turns ``logit_lens`` into ``tuned_lens`` or both."""
    names = [p.strip() for p in probes.split(",")] if isinstance(probes, str) else list(probes)
    names = [p for p in names if p]
    unknown = [p for p in names if p not in PROBES]
    if unknown or not names:
        raise EffdepthError(f"unknown probe(s) {', '.join(unknown) or '(none given)'}; available: {', '.join(PROBES)}")
    if lens not in LENSES:
        raise EffdepthError(f"--lens must be one of {', '.join(LENSES)}, got {lens!r}")
    lenses = {"logit": ["logit_lens"], "tuned": ["tuned_lens"], "both": ["logit_lens", "tuned_lens"]}[lens]
    expanded = [x for p in names for x in (lenses if p == "logit_lens" else [p])]
    return list(dict.fromkeys(expanded))


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


def check_settings(
    settings: RunSettings, probes: Sequence[str], vocab_size: int | None = None, n_layers: int | None = None
) -> None:
    """One-line errors for option values that cannot work, found before any model loads."""
    from .probes.igrad import _PANEL_ORDER, BASELINES, QUADRATURES
    from .probes.skip import check_skip_options

    for name in ("n", "batch_size", "skip_positions", "igrad_steps", "top_k", "digits", "lens_steps", "lens_tokens"):
        if getattr(settings, name) < 1:
            raise EffdepthError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(settings, name)}")
    if settings.max_tokens is not None and settings.max_tokens < 1:
        raise EffdepthError(f"--max-tokens must be at least 1, got {settings.max_tokens}")
    from .models import resolve_device

    resolve_device(settings.device)  # a device torch cannot name or does not have
    if settings.max_tokens is not None and settings.task in ("addition", "multiplication"):
        raise EffdepthError(f"--max-tokens applies to data-set tasks, not {settings.task} (its prompts are short)")
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
        raise EffdepthError(f"--top-k {settings.top_k} exceeds the vocabulary of {settings.model} ({vocab_size})")
    if settings.lens not in LENSES:
        raise EffdepthError(f"--lens must be one of {', '.join(LENSES)}, got {settings.lens!r}")
    if "prune" in probes:
        sizes = names_of(settings.prune_sizes)
        if not all(k.isdigit() and int(k) >= 1 for k in sizes):
            raise EffdepthError(f"--prune-sizes must be whole numbers of at least 1, got {settings.prune_sizes!r}")
        if n_layers is not None and any(int(k) >= n_layers for k in sizes):
            raise EffdepthError(
                f"--prune-sizes {settings.prune_sizes} must stay below the model's {n_layers} layers "
                "(removing every layer leaves no model)"
            )
    if "skip" in probes:
        check_skip_options(names_of(settings.skip_parts), names_of(settings.skip_variants))
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
        tol = settings.igrad_tol
        if not (isinstance(tol, int | float) and math.isfinite(tol) and 0 < tol < 1):
            raise EffdepthError(f"--igrad-tol must be a fraction of the target change in (0, 1), got {tol!r}")
        if settings.igrad_max_steps is not None and settings.igrad_max_steps < settings.igrad_steps:
            raise EffdepthError(
                f"--igrad-max-steps {settings.igrad_max_steps} is below --igrad-steps {settings.igrad_steps}; "
                "the cap must be at least the budget"
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


@dataclass
class _Plan:
    """What a run needs, settled before any model loads."""

    names: list[str]
    out: Path
    key: str
    examples: list[Example] | None  # final unless a token-length filter needs the tokenizer


def _plan(settings: RunSettings, probes, out_dir, loaded: LoadedModel | None, examples) -> _Plan:
    """Check the probes, task, model spec and options, and (where no tokenizer is needed) load the
    examples: every user error that can be found without the model is found here."""
    names = parse_probes(probes, settings.lens)
    check_task(settings.task)
    facts = (
        preflight_model(settings.model)
        if loaded is None
        else {"vocab_size": loaded.vocab_size, "n_layers": loaded.n_layers}
    )
    check_settings(settings, names, facts.get("vocab_size"), facts.get("n_layers"))
    if examples is None:
        preview = _load_examples(settings, loaded)  # checks the task and n
        examples = None if loaded is None and _needs_tokenizer(settings) else preview
    out = Path(out_dir).expanduser() if out_dir is not None else default_out_dir(settings)
    return _Plan(names, out, settings.key(), examples)


def _load(settings: RunSettings, names: list[str], loaded: LoadedModel | None, examples) -> tuple:
    """The model (unless given) and the final examples; warns when a token filter kept fewer than asked."""
    if loaded is None:
        loaded = load_model(
            settings.model,
            device=settings.device,
            dtype=settings.dtype,
            device_map=settings.device_map,
            progress=settings.progress,
        )
    check_settings(settings, names, loaded.vocab_size, loaded.n_layers)
    if examples is None or _needs_tokenizer(settings):
        examples = _load_examples(settings, loaded)
    if len(examples) < settings.n:
        warnings.warn(
            f"{settings.task}: kept {len(examples)} of the {settings.n} examples asked for; the others are "
            f"longer than {settings.max_tokens or AIME_MAX_TOKENS} tokens for this tokenizer",
            EffdepthWarning,
            stacklevel=3,
        )
    return loaded, examples


def _compute(name: str, loaded: LoadedModel, examples: list[Example], settings: RunSettings) -> dict[str, pl.DataFrame]:
    """Run one probe and derive what it derives; every number checked finite. Returns the frames to
    save: ``<name>_by_example`` (per example), ``<name>`` and the derived ones."""
    probe = PROBES[name]
    computed = probe.compute(loaded, examples, settings)
    per_example, extra = computed if isinstance(computed, tuple) else (computed, {})
    frames = {name: per_example if probe.aggregate is None else probe.aggregate(per_example), **extra}
    for derived, derive in probe.derives.items():
        frame = derive(per_example, examples)
        if frame is not None:
            frames[derived] = frame
    for label, frame in [(name, per_example), *frames.items()]:
        _require_finite_frame(frame, label.replace("_", " "))
    return {f"{name}_by_example": per_example, **frames}


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
    model has loaded). Steps: plan (all checks), lock the directory, load what is missing, compute
    each missing probe, summarize.
    """
    plan = _plan(settings, probes, out_dir, loaded, examples)
    directory = RunDirectory.open(plan.out, plan.key, settings.numbers(), PROBE_NAMES, overwrite)
    try:
        missing = [p for p in plan.names if not directory.has_probe(p)]
        _warn_outdated(directory, [p for p in plan.names if p not in missing], settings)
        foreign = directory.foreign_files_for(missing)
        if foreign:
            raise OutputDirectoryError(
                f"--out {directory.path} holds {', '.join(foreign)}, which no effdepth run there wrote; effdepth "
                "does not overwrite them: move them away or choose another --out"
            )
        if missing or not directory.has_examples():
            loaded, examples = _load(settings, plan.names, loaded, plan.examples)
            metadata = None
            for name in missing or [None]:
                started = time.perf_counter()
                frames = _compute(name, loaded, examples, settings) if name else {}
                if metadata is None:  # only once the first probe succeeded: --overwrite replaces a run here
                    metadata = directory.start(_new_metadata(settings, plan.key, loaded, examples), examples)
                if name:
                    directory.save_probe(name, frames)
                    metadata["probes"][name] = {"seconds": round(time.perf_counter() - started, 2)}
                    if name == "igrad":
                        metadata["probes"][name]["revision"] = IGRAD_REVISION
                    directory.write_metadata(metadata)
                    directory.metadata = metadata
        return _summarize(settings, directory, n_bootstrap)
    except BaseException:
        directory.discard_if_empty()  # a new run that produced nothing leaves nothing
        raise
    finally:
        directory.release()


# 2: the adaptive rule stops on a completeness tolerance (grad_evals, tolerance_met); the fixed
# rules' numbers did not change
IGRAD_REVISION = 2


def _warn_outdated(directory: RunDirectory, cached: list[str], settings: RunSettings) -> None:
    """One warning for a cached adaptive igrad result of the earlier fixed-budget rule: it is kept
    (effdepth never recomputes finished results unasked), and the warning says how to renew it."""
    entry = (directory.metadata or {}).get("probes", {}).get("igrad") or {}
    if "igrad" in cached and settings.igrad_quadrature == "adaptive" and entry.get("revision", 1) < IGRAD_REVISION:
        warnings.warn(
            f"the igrad results cached in {directory.path} come from the earlier adaptive rule (a fixed budget "
            f"of --igrad-steps, no completeness tolerance); rerun into a new --out to apply the tolerance",
            EffdepthWarning,
            stacklevel=3,
        )


def _new_metadata(settings: RunSettings, key: str, loaded: LoadedModel, examples: list[Example]) -> dict:
    from .provenance import environment, model_provenance

    return {
        "key": key,
        "settings": settings.numbers(),
        "effdepth_version": __version__,
        "environment": environment(),
        "model_name": loaded.name,
        "model_type": loaded.model_type,
        "model": model_provenance(settings.model, loaded),
        "n_layers": loaded.n_layers,
        "d_model": loaded.d_model,
        "n_params": sum(p.numel() for p in loaded.model.parameters()),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "device": str(loaded.input_device),
        "n_examples": len(examples),
        "n_asked": settings.n,
        "probes": {},
    }


def _summarize(settings: RunSettings, directory: RunDirectory, n_bootstrap: int) -> RunResult:
    """Read every finished probe of the run directory and compute ED per rule."""
    metadata = directory.read_metadata_or_fail()
    per_example, curves = directory.read_probes(metadata)  # earlier calls' too
    n_layers = int(metadata["n_layers"])
    try:
        depth = effective_depth(
            per_example.get("cosine"),
            per_example.get("logit_lens"),
            n_layers,
            kl_fraction=settings.kl_fraction,
            overlap_threshold=settings.overlap_threshold,
            n_bootstrap=n_bootstrap,
            seed=settings.seed,
            tuned_lens=per_example.get("tuned_lens"),
        )
    except (pl.exceptions.PolarsError, KeyError, ValueError) as exc:
        raise EffdepthError(
            f"the cached probe files in {directory.path} do not match its metadata ({type(exc).__name__}); "
            "delete the directory's effdepth files, or rerun with --overwrite into a new --out"
        ) from exc
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
    if "depth_score" in curves:
        scores = curves["depth_score"].filter(pl.col("example").is_null(), metric="depth_score")
        summary["depth_score"] = {row["group"]: row["value"] for row in scores.iter_rows(named=True)}
    directory.write_json("effective_depth.json", summary)
    return RunResult(directory.path, curves, per_example, depth, summary, metadata)


@dataclass
class MapSettings:
    """A cross-model linear map (method.md §7): two models sharing a tokenizer, one task's prompts
    (the first half fits the maps, the rest tests them)."""

    small: str
    big: str
    task: str = "gsm8k"
    n: int = 10
    seed: int = 0
    digits: int | None = None
    max_tokens: int | None = None
    ridge: float = 0.0
    device: str = "auto"
    dtype: str = "auto"
    progress: bool = True

    def _task_options(self) -> dict:
        return dict(n=self.n, seed=self.seed, digits=self.digits or 6, max_tokens=self.max_tokens)

    def check(self) -> None:
        """One-line errors for everything that can be checked before a model loads."""
        from .models import preflight_model

        if self.n < 2:
            raise EffdepthError("--n must be at least 2: half the prompts fit the maps, the other half test them")
        if not (math.isfinite(self.ridge) and self.ridge >= 0):
            raise EffdepthError(f"--ridge must be a finite number of at least 0, got {self.ridge}")
        check_task(self.task)
        if self.digits is not None and self.task not in ("addition", "multiplication"):
            raise EffdepthError(f"--digits applies to addition and multiplication only, not {self.task!r}")
        for spec in (self.small, self.big):
            preflight_model(spec)
        load_task(self.task, **self._task_options())  # the task and n

    def file_name(self) -> str:
        """A cache file name that spells every setting that changes the numbers."""
        name = f"{slug(self.small)}--{slug(self.big)}-{slug(self.task)}-n{self.n}-seed{self.seed}"
        if self.task in ("addition", "multiplication"):
            name += f"-digits{self.digits or 6}"
        if self.max_tokens:
            name += f"-max{self.max_tokens}"
        return name + (f"-ridge{self.ridge:g}" if self.ridge else "") + ".parquet"


def run_map(settings: MapSettings, cache_dir: Path | str | None = None) -> pl.DataFrame:
    """The map's long frame (``cross_model_map``, plus ``n_train_prompts`` / ``n_test_prompts``
    rows); with ``cache_dir``, read from ``<cache_dir>/<settings.file_name()>`` when there, else
    computed and written there (atomically)."""
    from .probes import cross_model_map
    from .rundir import atomic_write_parquet, read_cached_frame

    cached = Path(cache_dir) / settings.file_name() if cache_dir is not None else None
    if cached is not None and cached.is_file():
        return read_cached_frame(cached)
    settings.check()
    small = load_model(settings.small, device=settings.device, dtype=settings.dtype, progress=settings.progress)
    big = load_model(settings.big, device=settings.device, dtype=settings.dtype, progress=settings.progress)
    options = settings._task_options()
    examples = load_task(settings.task, count_tokens=lambda text: int(small.encode(text).numel()), **options)
    prompts = [e.prompt for e in examples]
    half = len(prompts) // 2
    train, test = prompts[:half], prompts[half:]
    frame = cross_model_map(small, big, train, test, ridge=settings.ridge, progress=settings.progress)
    counts = pl.DataFrame(
        {"metric": ["n_train_prompts", "n_test_prompts"], "value": [float(half), float(len(prompts) - half)]}
    )
    frame = pl.concat([frame, counts], how="diagonal_relaxed")
    _require_finite_frame(frame, "linear map")
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_parquet(cached, frame)
    return frame
