"""The orchestrator: run probes for (model, task), cache results in a run directory, resume, reuse
what earlier runs measured, compute ED. One function, ``run``, serves the command line, the book
and the benchmarks; ``run_map`` does the same for the cross-model linear map.

Steps of ``run``: plan (every check that needs no model), lock the run directory, load the model
and examples if anything is missing, compute each missing probe — or, where an earlier run of the
same probe key measured the same first examples (``reuse_from``), only the examples it lacks — and
summarize (ED per rule, each probe's summary and end-of-run cell).
"""

from __future__ import annotations

import hashlib
import json
import math
import resource
import socket
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import torch

from . import __version__
from .cache import read_regular
from .display import RunResult
from .errors import EffdepthError, EffdepthWarning, NonFiniteActivationError, TaskError
from .measurement import registry
from .measurement.depth import N_BOOTSTRAP_RUN, effective_depths
from .measurement.identity import canary_comparable, canary_digest, canary_where
from .measurement.probes.spec import Context, ProbeSpec
from .models import (
    LoadedModel,
    load_model,
    preflight_model,
    resolve_device,
    resolve_dtype,
    run_weights,
    takes_plain_models,
    user_hooks,
)
from .paths import exists, names_path, user_path
from .rundir import (
    EXAMPLES,
    FORMAT,
    METADATA,
    OutputDirectoryError,
    RunDirectory,
    read_cached_frame,
    read_metadata,
    verified_files,
)
from .settings import (
    MapSettings,
    RunSettings,
    check_settings,
    default_out_dir,
    names_of,
    parse_probes,
    slug,
)
from .task_loading import load_task
from .tasks import AIME_MAX_TOKENS, ANSWER_FORMAT, ARITHMETIC, TASKS, Example
from .zoo import cache_dir

__all__ = [
    "EffdepthWarning",
    "MapSettings",
    "RunResult",
    "RunSettings",
    "check_settings",
    "default_out_dir",
    "names_of",
    "parse_probes",
    "run",
    "slug",
]


def require_finite_frame(frame: pl.DataFrame, probe: str) -> None:
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
        positions=settings.positions,
        encode=None if loaded is None else (lambda text: loaded.encode(text).tolist()),
    )


def _needs_tokenizer(settings: RunSettings) -> bool:
    return settings.max_tokens is not None or settings.positions is not None or settings.task == "aime24"


def check_examples(examples: Sequence[Example], specs: Sequence[ProbeSpec], count_tokens=None) -> None:
    """One-line errors for examples a probe cannot measure: no answer where it needs one, or fewer
    tokens than its definition needs (``count_tokens``: the model's tokenizer, when loaded)."""
    for spec in specs:
        if spec.needs_answers:
            missing = [i for i, e in enumerate(examples) if not e.answer]
            if missing:
                raise EffdepthError(
                    f"the {spec.name} probe needs examples with an answer (the tokens it measures); example "
                    f"{missing[0]} has none: use a task with answers (gsm8k, math, addition, …) or a .jsonl with an "
                    "'answer' field"
                )
        if count_tokens is None:
            continue
        for index, example in enumerate(examples):
            n = count_tokens(example.prompt)
            if n < spec.min_tokens:
                raise EffdepthError(
                    f"prompt {index} has {n} token(s); the {spec.name} probe needs at least {spec.min_tokens} (its "
                    "values at a single position only see that position): use longer prompts"
                )


@dataclass
class _Plan:
    """What a run needs, settled before any model loads."""

    names: list[str]
    out: Path
    key: str
    examples: list[Example] | None  # final unless a token-length filter needs the tokenizer
    weights: str | None = None  # ``model_fingerprint`` of a model given in memory (``_run_key``)
    derived: bool = False  # ``out`` is effdepth's own folder under a results root (no --out given)
    base: dict | None = None  # ``settings.base_fields``, read once: every key of the run is of these bytes
    fields: dict | None = None  # the run key's fields (``settings.key_fields`` on ``base``)
    given_examples: bool = False  # the caller passed the examples (keyed by their text, not a file read)


def _plan(
    settings: RunSettings,
    probes,
    out_dir,
    loaded: LoadedModel | None,
    examples,
    results_root: Path | str | None,
    canary: str | None = None,
) -> _Plan:
    """Check the probes, task, model spec and options, and (where no tokenizer is needed) load the
    examples: every user error that can be found without the model is found here."""
    names = parse_probes(probes, settings)
    given_examples = examples
    if loaded is None:
        facts = preflight_model(settings.model)
    else:
        facts = {"vocab_size": loaded.vocab_size, "n_layers": loaded.n_layers}
    check_settings(settings, names, facts)
    if examples is None:
        preview = _load_examples(settings, loaded)  # checks the task and n
        examples = None if loaded is None and _needs_tokenizer(settings) else preview
    if examples is not None:
        check_examples(examples, [registry.get(n) for n in names])
    weights = None
    if loaded is not None:
        asked = resolve_dtype(settings.dtype, resolve_device(settings.device))
        if loaded.dtype != asked:
            raise EffdepthError(
                f"the model given is {str(loaded.dtype).removeprefix('torch.')} but the settings ask for "
                f"{str(asked).removeprefix('torch.')}; pass dtype={str(loaded.dtype).removeprefix('torch.')!r} "
                "(measure() does), or load the model in that dtype"
            )
        hooked = user_hooks(loaded.model)
        if hooked is not None:
            raise EffdepthError(
                f"the model has a hook on {hooked}: it would change what the probes read and no cache key can "
                "name it; remove it (handle.remove()) before measuring, or measure the hooked computation "
                "with your own code"
            )
        weights = run_weights(loaded, settings.model, asked, canary)  # None: keyed by its name (identity)
    base = settings.base_fields(by_name=weights is None)
    key, fields = _run_key(settings, weights, given_examples, base)
    if out_dir is None and results_root is None:
        results_root = cache_dir() / "runs"
    out = Path(out_dir).expanduser() if out_dir is not None else default_out_dir(settings, results_root, key=key)
    return _Plan(
        names,
        out,
        key,
        examples,
        weights,
        derived=out_dir is None,
        base=base,
        fields=fields,
        given_examples=given_examples is not None,
    )


def _run_key(
    settings: RunSettings, weights: str | None, examples: list[Example] | None, base: dict
) -> tuple[str, dict]:
    """The run's key: its settings' — and what the settings cannot name: the weights, configuration
    and tokenizer of a model given in memory (not loaded from ``settings.model``), the text of
    examples given in place of the task's. Two models wrapped under one name, or one's own prompts
    run under a task's name, never share a cache entry with each other or with the task."""
    extra = {}
    if weights is not None:  # keyed by content, not by its label (name=)
        extra["weights_sha256"] = weights
    if examples is not None:
        text = json.dumps([e.to_json() for e in examples], sort_keys=True)
        extra["examples_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    fields = settings.key_fields(weights is None, base)
    own = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]  # = settings.key()
    if not extra:
        return own, fields
    return hashlib.sha256(json.dumps({"settings": own, **extra}, sort_keys=True).encode()).hexdigest()[:16], fields


def _check_read_once(settings: RunSettings, plan: _Plan, examples: list[Example]) -> None:
    """A task file's examples come from the bytes the run's key was computed from, or nothing runs
    (a file rewritten between the two reads would be measured under the old text's key)."""
    keyed = (plan.base or {}).get("task_sha256")
    if keyed is None or plan.given_examples or settings.task in TASKS:  # examples passed in, or a built-in task
        return
    used = {e.meta.get("task_sha256") for e in examples}
    if used != {keyed}:
        raise TaskError(
            f"task file {settings.task} changed while effdepth read it (its examples are not the text the "
            "run's key was computed from); run again once the file is written"
        )


def _check_model_read_once(settings: RunSettings, plan: _Plan) -> None:
    """A local model (a folder or GGUF file) is measured under the key of the bytes it was loaded
    from: its files are hashed again once it is in memory (their fingerprints — size, inode, mtime,
    ctime — first, a full sha256 where any changed) and must still be what the key was computed from,
    or nothing runs (weights replaced during the load would be measured under the old files' key)."""
    keyed = (plan.base or {}).get("model_files")
    path = names_path(settings.model)
    if keyed is None or path is None:
        return
    from .cache import model_files_digest

    if model_files_digest(path) != keyed:
        raise EffdepthError(
            f"model {settings.model} changed while effdepth loaded it (its files are not the bytes the run's key "
            "was computed from); run again once its files are written"
        )


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
    check_settings(settings, names, {"vocab_size": loaded.vocab_size, "n_layers": loaded.n_layers})
    if examples is None or _needs_tokenizer(settings):
        examples = _load_examples(settings, loaded)
    check_examples(examples, [registry.get(n) for n in names], lambda text: int(loaded.encode(text).numel()))
    if len(examples) < settings.n:
        why = []
        if settings.positions is not None:
            why.append(f"shorter than {settings.positions} tokens (positions)")
        if settings.max_tokens is not None or settings.task == "aime24":
            why.append(f"longer than {settings.max_tokens or AIME_MAX_TOKENS} tokens")
        warnings.warn(
            f"{settings.task}: kept {len(examples)} of the {settings.n} examples asked for; the others are "
            f"{' or '.join(why)} for this tokenizer",
            EffdepthWarning,
            stacklevel=3,
        )
    return loaded, examples


# --- reusing an earlier run's examples ---------------------------------------------------------


@dataclass
class _Donor:
    """An earlier run whose first ``count`` examples are this run's first ones, measured with the
    same probe key: its rows for them are taken as they are."""

    path: Path
    count: int
    per_example: pl.DataFrame
    extra: dict[str, pl.DataFrame]


def _example_text(example: dict | Example, with_answer: bool) -> str:
    data = example.to_json() if isinstance(example, Example) else example
    if with_answer:
        return json.dumps([data.get("question"), data.get("answer")])
    return str(data.get("prompt"))


def _candidates(
    out: Path, settings: RunSettings, roots: Sequence[Path], derived: bool, in_memory: bool = False
) -> list[Path]:
    """Runs that may donate: those the user named (``--reuse-from``: a run, a folder of runs, or a
    results root of models' folders), and beside ``out`` only when effdepth chose ``out`` under its
    results root (a user's --out folder's neighbours are the user's, never read unasked) — for a
    model given in memory, keyed by its content, the runs under every label there."""
    beside = [out.parent] if derived else []
    if derived and in_memory and exists(out.parent.parent, "dir"):
        beside += sorted(p for p in out.parent.parent.iterdir() if p.is_dir() and not p.is_symlink())
    # a folder the user named is read where it leads, a link included (as ``effdepth table`` reads it);
    # links found inside folders are not followed
    named = [user_path(root).resolve() if user_path(root).is_symlink() else user_path(root) for root in roots]
    folders = [*beside, *named, *(root / slug(settings.model) for root in named)]
    seen, found = set(), []
    for run_dir in named:  # a named run folder lends itself
        if exists(run_dir / METADATA, "file") and not run_dir.is_symlink() and run_dir.resolve() != out.resolve():
            seen.add(run_dir.resolve())
            found.append(run_dir)
    for folder in folders:
        if not exists(folder, "dir"):
            continue
        for entry in sorted(folder.iterdir()):
            resolved = entry.resolve()
            if entry.is_dir() and not entry.is_symlink() and resolved != out.resolve() and resolved not in seen:
                seen.add(resolved)
                found.append(entry)
    return found


def _find_donor(
    spec: ProbeSpec,
    key: str,
    examples: list[Example],
    out: Path,
    settings: RunSettings,
    roots: Sequence[Path],
    derived: bool = False,
    in_memory: bool = False,
    model_canary: str | None = None,
) -> _Donor | None:
    """The earlier run (beside an ``out`` effdepth chose, or under ``roots``) that measured the most of this run's
    first examples with the same probe key; every file read is checked against its sha256. ``model_canary``: a
    model in memory lends and borrows only between runs whose model computed the same canary (their
    first example is the same, so the canaries compare)."""
    if not spec.reusable:
        return None
    ours = [_example_text(e, spec.needs_answers) for e in examples]
    best: tuple[int, Path, dict] | None = None
    for folder in _candidates(out, settings, roots, derived, in_memory):
        metadata = read_metadata(folder, skip_newer=True)
        if metadata is None or int(metadata.get("format", 1)) < FORMAT or metadata.get("pending"):
            continue
        record = metadata.get("probes", {}).get(spec.name) or {}
        differs = model_canary is not None and _comparable_canary(metadata) and metadata["canary"] != model_canary
        if record.get("key") != key or differs:
            continue
        files = {EXAMPLES: metadata.get("files", {}).get(EXAMPLES), **record.get("files", {})}
        if verified_files(folder, files) is not None:
            continue  # damaged: not a donor
        try:
            text = read_regular(folder / EXAMPLES, 1 << 30, "examples file").decode("utf-8")
            theirs = [json.loads(line) for line in text.splitlines() if line.strip()]
        except (OSError, ValueError, EffdepthError):
            continue
        count = 0
        for mine, other in zip(ours, theirs, strict=False):
            if mine != _example_text(other, spec.needs_answers):
                break
            count += 1
        if count and (best is None or count > best[0]):
            best = (count, folder, record)
    if best is None:
        return None
    count, folder, record = best
    per_example = read_cached_frame(folder / f"{spec.name}_by_example.parquet").filter(pl.col("example") < count)
    extra = {name: read_cached_frame(folder / f"{name}.parquet") for name in spec.extra_frames}
    return _Donor(folder, count, per_example, extra)


# --- computing one probe ------------------------------------------------------------------------


def _compute(
    spec: ProbeSpec,
    loaded: LoadedModel,
    examples: list[Example],
    settings: RunSettings,
    donor: _Donor | None = None,
    computed: pl.DataFrame | None = None,
) -> dict[str, pl.DataFrame]:
    """Run one probe (only on the examples ``donor`` lacks) and derive what it derives; every number
    checked finite. ``computed``: its per-example frame of those examples, from a pass it shared
    (``_shared_pass``). Returns the frames to save: ``<name>_by_example``, ``<name>``, extra and derived."""
    first = donor.count if donor is not None else 0
    if first < len(examples):
        if computed is None:
            computed = spec.compute(loaded, examples[first:], Context(settings, first_example=first))
        per_example, extra = _checked_output(spec, computed)
        if first:
            per_example = per_example.with_columns(pl.col("example") + first)
    else:
        per_example, extra = donor.per_example.head(0), dict(donor.extra)
    if donor is not None:
        per_example = pl.concat([donor.per_example, per_example], how="diagonal_relaxed")
        extra = {**donor.extra, **extra}
    saved = per_example if spec.aggregate is None else spec.aggregate(per_example)
    frames = {spec.name: saved, **extra}
    for derived, derive in spec.derived.items():
        frame = derive(per_example, examples)
        if frame is not None:
            frames[derived] = frame
    for label, frame in [(spec.name, per_example), *frames.items()]:
        require_finite_frame(frame, label.replace("_", " "))
    return {f"{spec.name}_by_example": per_example, **frames}


def _checked_output(spec: ProbeSpec, computed: object) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]:
    """A probe's ``compute`` result, held to its spec (a plugin's like a built-in's): a frame with an
    integer ``example`` column, or that and a dict of exactly its declared extra frames."""
    per_example, extra = computed if isinstance(computed, tuple) and len(computed) == 2 else (computed, {})
    where = f"the {spec.name} probe's compute"
    if not isinstance(per_example, pl.DataFrame):
        raise EffdepthError(f"{where} returned {type(per_example).__name__}, not a polars DataFrame")
    if "example" not in per_example.columns or not per_example.schema["example"].is_integer():
        raise EffdepthError(f"{where} returned a frame without an integer 'example' column ({per_example.columns})")
    if not isinstance(extra, dict) or set(extra) != set(spec.extra_frames):
        names = sorted(extra) if isinstance(extra, dict) else type(extra).__name__
        raise EffdepthError(f"{where} returned extra frames {names}; its spec declares {sorted(spec.extra_frames)}")
    for name, frame in extra.items():
        if not isinstance(frame, pl.DataFrame) or not frame.columns:
            raise EffdepthError(f"{where} returned its {name} frame as {type(frame).__name__} without columns")
    return per_example, extra


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)


def outdated(spec: ProbeSpec, record: dict, settings: RunSettings) -> str | None:
    """Why a cached result of ``spec`` is a revision behind (None when it is current): its own rule
    (``spec.outdated``), an older revision of the probe, or answers split the earlier way."""
    if spec.outdated is not None:
        message = spec.outdated(record, settings)
        if message:
            return message
    elif int(record.get("revision", 1)) < spec.revision:
        return (
            f"come from an earlier revision of the probe ({record.get('revision', 1)}; now {spec.revision}); "
            "rerun into a new --out to renew them"
        )
    if spec.needs_answers and settings.task in ARITHMETIC and int(record.get("answer_format", 1)) < ANSWER_FORMAT:
        return (
            "measured the arithmetic answer with the space before it as an answer token; effdepth now measures "
            "the digits alone, as the published code does (method.md §8): rerun into a new --out to renew them"
        )
    return None


def _outdated_cached(directory: RunDirectory, cached: list[str], settings: RunSettings, warn: bool) -> list[str]:
    """The cached probes a revision behind, each named in one warning (``warn``): they are kept
    (effdepth never recomputes finished results unasked), and the warning says how to renew them."""
    behind = []
    for name in cached:
        message = outdated(registry.get(name), directory.probe_record(name), settings)
        if message:
            behind.append(name)
            if warn:
                warnings.warn(f"the {name} results cached in {directory.path} {message}", EffdepthWarning, stacklevel=3)
    return behind


@takes_plain_models("loaded")
def run(
    settings: RunSettings,
    probes: str | Sequence[str] = registry.DEFAULT,
    out_dir: Path | str | None = None,
    loaded: LoadedModel | None = None,
    examples: list[Example] | None = None,
    n_bootstrap: int = N_BOOTSTRAP_RUN,
    overwrite: bool = False,
    reuse_from: Sequence[Path | str] = (),
    renew_outdated: bool = False,
    results_root: Path | str | None = None,
    _canary: str | None = None,
) -> RunResult:
    """Run ``probes`` for the settings' model and task, reusing any finished results in ``out_dir``.

    ``loaded`` / ``examples`` may be passed to skip loading (tests, notebooks, benchmarks).
    ``out_dir`` must be new, empty, or a run directory of the same settings; ``overwrite`` lets a
    run with other settings be replaced (only effdepth's own files are deleted, and only once the
    model has loaded). A reusable probe takes the rows of the examples an earlier run measured with
    the same probe key — a run directory in a ``reuse_from`` folder (a folder of runs, or a results
    root searched at ``<root>/<model>/``), or beside a run directory effdepth named itself (no
    ``out_dir``; a user's folder's neighbours are never read unasked), whose examples begin as this
    run's do — and computes the rest.
    Cached results a revision behind are kept with a warning, or computed again with ``renew_outdated``.
    Without ``out_dir`` the run directory is named under ``results_root`` by the run's key; without
    ``results_root`` too, under effdepth's cache (``$EFFDEPTH_CACHE/runs``), never silently the
    working directory (the command line passes ``results``, its documented default).

    Args:
        settings: the run's model, task and options.
        probes: probe names.
        out_dir, overwrite, reuse_from, renew_outdated, results_root: where the run is kept, as above.
        loaded, examples: the model and examples, already loaded.
        n_bootstrap: resamples for the ED intervals.
        tokenizer: the tokenizer of a transformers model passed as ``loaded``.
        _canary: set by the run itself only: the canary (``canary``) of a model in memory that computes
            otherwise than its cached run's, which the run is then keyed by.

    Returns:
        The ``RunResult`` (a ``Measurement``): frames, summary and run directory.

    Raises:
        EffdepthError: a bad setting or a folder effdepth may not write, in one line.
    """
    plan = _plan(settings, probes, out_dir, loaded, examples, results_root, _canary)
    given, rekey = loaded, None
    described = {**settings.numbers(), **plan.fields}  # what a refusal compares, named
    directory = RunDirectory.open(plan.out, plan.key, described, registry.frames(), overwrite)
    try:
        missing = _to_compute(directory, plan, settings, overwrite, renew_outdated)
        now = _canary
        if given is not None and _comparable_canary(directory.metadata):  # cached rows of a model in memory
            loaded, examples = _load(settings, plan.names, loaded, plan.examples)
            now = now or canary(loaded, examples)
            if (directory.metadata or {}).get("canary") != now:
                rekey = _changed_model(plan, now, _canary)
        if rekey is None and (missing or not directory.has_examples()):
            loaded, examples = _load(settings, plan.names, loaded, examples if now is not None else plan.examples)
            _check_read_once(settings, plan, examples)
            if given is None:
                _check_model_read_once(settings, plan)
            started = False
            if given is not None and missing and now is None:  # a model in memory borrows rows by its canary
                now = canary(loaded, examples)
            overall = Overall(missing, loaded, examples, settings) if settings.progress else None
            prepared: dict[str, _Pending] = {}  # each probe's key and donor, found at its turn (an identity may
            # train a tuned lens: after the probes before it are saved) or, to share a pass, with the others that can

            def prepare(name: str) -> _Pending:
                if name not in prepared:
                    prepared[name] = _prepare(registry.get(name), loaded, examples, settings, plan, reuse_from, now)
                return prepared[name]

            shared: dict[str, tuple[pl.DataFrame, float, bool]] = {}  # a shared pass's frames, until saved
            for index, name in enumerate(missing):
                item = prepare(name)
                if name not in shared:
                    later = missing[index + 1 :]  # those not yet computed nor in a pass before
                    sharing = [prepare(p) for p in later if p not in shared and _can_share(registry.get(p))]
                    group = _pass_group(item, sharing, len(examples))
                    if overall is not None:
                        overall.starting(index, [p.spec.name for p in group])
                    shared.update(_shared_pass(group, loaded, examples, settings))
                frames, record = _measure(item, loaded, examples, settings, shared.pop(name, None))
                if not started:  # only once the first probe succeeded: --overwrite replaces a run here
                    metadata = _new_metadata(settings, plan.key, loaded, examples, plan.fields)
                    directory.start({**metadata, **_canary_record(now or canary(loaded, examples))}, examples)
                    started = True
                directory.save_probe(name, frames, record)
            if not started:  # every probe cached, the examples not yet written
                metadata = _new_metadata(settings, plan.key, loaded, examples, plan.fields)
                directory.start({**metadata, **_canary_record(now or canary(loaded, examples))}, examples)
        if rekey is None:
            result = _summarize(settings, directory, n_bootstrap)
            result.computed = tuple(missing)
            return result
    except BaseException:
        directory.discard_if_empty()  # a new run that produced nothing leaves nothing
        raise
    finally:
        directory.release()
    kept = examples if plan.given_examples else None  # the run again, keyed by what the model computes now
    return run(settings, probes, out_dir, given, kept, n_bootstrap, overwrite, reuse_from, renew_outdated,
               results_root, _canary=rekey)  # fmt: skip


CANARY_TOKENS = 32  # the first prompt's first tokens the canary runs: every layer, attention over several positions


def canary(loaded: LoadedModel, examples: Sequence[Example]) -> str:
    """What the model computes now on the run's first prompt (its first ``CANARY_TOKENS`` tokens):
    ``identity.canary_digest``, the sha256 of its final residual and logits at every position, bit for bit. A cached run
    of a model in memory is returned only when this equals the canary its run directory recorded,
    so whatever changed the computation — any weight byte, a class or closure patch of a forward, the
    tokenizer's content, a hook, an attention kernel or registry entry — is noticed by construction,
    not by listing it. Bitwise: recomputed at the recorded shape (one prompt, unpadded), on the same
    device type and dtype (both in the key); a canary recorded elsewhere is not compared
    (``identity.canary_comparable``). Cost: one forward pass of ≤ 32 tokens."""
    ids = loaded.encode(getattr(examples[0], "prompt", examples[0]))[:CANARY_TOKENS]
    return canary_digest(loaded.model, ids, loaded.final_norm)


def _canary_record(digest: str) -> dict:
    """The canary as ``metadata.json`` records it: its sha256 and where it was computed."""
    return {"canary": digest, "canary_where": canary_where()}


def _comparable_canary(metadata: dict | None) -> bool:
    """Whether a run's recorded canary can be compared bit for bit here: recorded with its rows, on
    this machine (``identity.canary_comparable``). Runs written before the canary, or elsewhere, are
    read as before (their key and files' sha256 only), as ``COMPATIBILITY`` reads older formats."""
    return bool((metadata or {}).get("probes")) and canary_comparable(metadata)


def _changed_model(plan: _Plan, now: str, keyed_by: str | None) -> str:
    """The canary to key the run by again, when its cached rows were computed by a model that computes
    otherwise now (a changed weight, code, tokenizer, hook or kernel): the run is then keyed by the
    model's content and this canary. Refused in one line where that cannot help: a folder the caller
    named (``out``) holds the other model's run, or the run was keyed by this canary already."""
    if not plan.derived or keyed_by is not None:
        raise OutputDirectoryError(
            f"the model given computes otherwise than the one whose results are kept in {plan.out} (its first "
            "prompt's final residual or logits differ: a weight, its code, tokenizer, a hook or an attention kernel "
            "changed); pass another out= folder, or cache=False"
        )
    return now


@takes_plain_models("loaded")
def run_in_memory(
    settings: RunSettings,
    probes: str | Sequence[str] = registry.DEFAULT,
    loaded: LoadedModel | None = None,
    examples: list[Example] | None = None,
    n_bootstrap: int = N_BOOTSTRAP_RUN,
) -> RunResult:
    """Run ``probes`` on a model in memory and return the result with no run directory, no cache
    key, no weights hashed and no earlier run's rows (a probe's own caches, such as a trained tuned
    lens, are still kept). The same checks, probes and summary as ``run`` (its numbers equal a
    cached run's); ``out_dir`` is None. ``measure()`` takes this road for a model in memory unless
    asked to keep the result.

    Args:
        settings: the run's settings (``settings.model`` labels the result).
        probes: probe names, or a comma-separated string.
        loaded: the model (loaded from ``settings.model`` when None).
        examples: the examples (the task's when None).
        n_bootstrap: resamples of each ED's interval.

    Returns:
        The result: curves, per-example frames, ED per rule and the summary.
    """
    names = parse_probes(probes, settings)
    if loaded is None:  # every mistake found before a model loads (or downloads), as ``run`` does
        check_settings(settings, names, preflight_model(settings.model))
        if examples is None and not _needs_tokenizer(settings):
            examples = _load_examples(settings, None)  # read once: these are the examples measured
    else:
        check_settings(settings, names, {"vocab_size": loaded.vocab_size, "n_layers": loaded.n_layers})
        asked = resolve_dtype(settings.dtype, resolve_device(settings.device))
        if loaded.dtype != asked:
            raise EffdepthError(
                f"the model given is {str(loaded.dtype).removeprefix('torch.')} but the settings ask for "
                f"{str(asked).removeprefix('torch.')}; pass dtype={str(loaded.dtype).removeprefix('torch.')!r}"
            )
        hooked = user_hooks(loaded.model)
        if hooked is not None:  # the probes' own hooks and replays assume the model computes as loaded
            raise EffdepthError(
                f"the model has a hook on {hooked}: it would change what the probes read; remove it "
                "(handle.remove()) before measuring"
            )
    if examples is not None:
        check_examples(examples, [registry.get(n) for n in names])
    loaded, examples = _load(settings, names, loaded, examples)
    metadata = _new_metadata(settings, "", loaded, examples)
    per_example, saved = {}, {}
    ordered = sorted(names, key=registry.names().index)  # the table's order
    pending = [_Pending(registry.get(name), "", {}, None) for name in ordered]
    shared: dict[str, tuple[pl.DataFrame, float, bool]] = {}  # a shared pass's frames, until used
    for index, (name, item) in enumerate(zip(ordered, pending, strict=True)):
        if name not in shared:
            sharing = [p for p in pending[index + 1 :] if p.spec.name not in shared and _can_share(p.spec)]
            shared.update(_shared_pass(_pass_group(item, sharing, len(examples)), loaded, examples, settings))
        frame, seconds, _ = shared.pop(name, None) or (None, 0.0, False)
        started = time.perf_counter()
        frames = _compute(item.spec, loaded, examples, settings, computed=frame)
        per_example[name] = frames.pop(f"{name}_by_example")
        saved.update(frames)
        seconds += time.perf_counter() - started
        metadata["probes"][name] = {"seconds": round(seconds, 4), "revision": item.spec.revision}
    summary, depth = summary_of(settings, metadata, per_example, saved, n_bootstrap)
    return RunResult(None, saved, per_example, depth, summary, metadata, computed=tuple(per_example))


def _operations(
    specs: Sequence[ProbeSpec], loaded: LoadedModel, examples: Sequence[Example], settings: RunSettings
) -> list[float]:
    """Each probe's operations on ``examples`` (``ProbeSpec.work``, the book's cost model's measure; the
    tokens counted as characters ÷ 4, as the cost model does), NaN where a plugin's estimate fails."""
    from .measurement.probes.spec import Shape

    n_params = sum(p.numel() for p in loaded.model.parameters())
    shape = Shape(loaded.n_layers, loaded.d_model, loaded.vocab_size, n_params)
    lengths = [max(1, len(getattr(e, "prompt", "")) // 4) for e in examples]
    work = []
    for spec in specs:
        try:
            work.append(float(spec.work(shape, settings, lengths)))
        except Exception:  # a plugin's work estimate that fails: no estimate, never a failed run
            work.append(math.nan)
    return work


class Overall:
    """The run's overall progress line (stderr), one per probe: which of how many, the time so far
    and a rough estimate of the time left — each probe's operations (``ProbeSpec.work``, the book's
    cost model's measure) at the rate the probes before it ran, so the first probe has no estimate."""

    def __init__(self, names: Sequence[str], loaded: LoadedModel, examples: Sequence[Example], settings: RunSettings):
        self.names = list(names)
        self.work = [max(w, 1e-9) for w in _operations([registry.get(n) for n in names], loaded, examples, settings)]
        self.started = time.perf_counter()
        self.done: set[str] = set()

    def starting(self, index: int, together: Sequence[str] | None = None) -> None:
        """Print the line for probe ``index`` (0-based) as it starts; ``together``: the probes that share
        its forward pass (``_shared_pass``), itself among them."""
        elapsed = time.perf_counter() - self.started
        started = {*self.names[:index], *self.done}  # the probes computed so far (a shared pass's included)
        done = sum(w for name, w in zip(self.names, self.work, strict=True) if name in started)
        left = sum(w for name, w in zip(self.names, self.work, strict=True) if name not in started)
        self.done = {*started, *(together or [self.names[index]])}
        if together:
            title = " + ".join(registry.get(name).title for name in together) + " (one shared forward pass)"
            numbers = ", ".join(str(self.names.index(name) + 1) for name in together)
        else:
            title, numbers = registry.get(self.names[index]).title, str(index + 1)
        line = f"effdepth: probe {numbers}/{len(self.names)}, {title}"
        if index:
            line += f"; {_seconds(elapsed)} so far"
            if done > 0 and math.isfinite(done + left):
                line += f", about {_seconds(elapsed / done * left)} left (estimated from each probe's operations)"
        print(line, file=sys.stderr, flush=True)


def _seconds(value: float) -> str:
    """A duration as people read it: ``42 s``, ``3 min 5 s``."""
    value = round(value)
    return f"{value} s" if value < 60 else f"{value // 60} min {value % 60} s"


def _to_compute(
    directory: RunDirectory, plan: _Plan, settings: RunSettings, overwrite: bool, renew_outdated: bool
) -> list[str]:
    """The probes of the plan that this run directory lacks (damaged ones forgotten, with
    ``overwrite``; outdated ones with ``renew_outdated``); refuses damage it may not repair and
    files no effdepth run wrote."""
    damaged = directory.damaged(registry.names())
    if damaged and not (overwrite and set(damaged) - {"examples"} <= set(plan.names)):
        name, what = next(iter(damaged.items()))
        extra = [p for p in damaged if p != "examples" and p not in plan.names]
        fix = "--overwrite" + (f" --probes {','.join([*plan.names, *extra])}" if extra else "")
        raise OutputDirectoryError(
            f"the cached {'examples are' if name == 'examples' else name + ' results are'} damaged in "
            f"{directory.path} ({what}); rerun with the same options and {fix} to compute them again"
        )
    if damaged:
        directory.forget(p for p in damaged if p != "examples")
    order = registry.names()  # the table's order, whatever order --probes named them in
    missing = sorted((p for p in plan.names if not directory.has_probe(p)), key=order.index)
    behind = _outdated_cached(directory, [p for p in plan.names if p not in missing], settings, not renew_outdated)
    if renew_outdated:
        missing = sorted([*missing, *behind], key=order.index)
    foreign = directory.foreign_files_for(missing)
    if foreign:
        raise OutputDirectoryError(
            f"--out {directory.path} holds {', '.join(foreign)}, which no effdepth run there wrote; effdepth "
            "does not overwrite them: move them away or choose another --out"
        )
    return missing


@dataclass
class _Pending:
    """A probe about to be computed: its key, what else pins its numbers, and the earlier run that lends it rows."""

    spec: ProbeSpec
    key: str
    identity: dict
    donor: _Donor | None

    @property
    def first(self) -> int:
        """The first example it computes (the ones before are the donor's)."""
        return self.donor.count if self.donor is not None else 0


def _prepare(
    spec: ProbeSpec,
    loaded: LoadedModel,
    examples: list[Example],
    settings: RunSettings,
    plan: _Plan,
    reuse_from: Sequence[Path | str],
    model_canary: str | None = None,
) -> _Pending:
    """A probe's key and its donor (an earlier run's rows of the same examples)."""
    identity = spec.identity(loaded, Context(settings)) if spec.identity else {}
    if plan.weights is not None:  # a model in memory: its rows are its weights', whatever its name
        identity = {**identity, "weights_sha256": plan.weights}
    key = settings.probe_key(spec, identity, by_name=plan.weights is None, base=plan.base)
    donor = _find_donor(
        spec, key, examples, plan.out, settings, reuse_from, plan.derived, plan.weights is not None, model_canary
    )
    return _Pending(spec, key, identity, donor)


def _can_share(spec: ProbeSpec) -> bool:
    """Whether a probe can share a forward pass: it names its part (``ProbeSpec.pass_part``) and its
    ``compute`` returns the per-example frame alone (no extra frames)."""
    return spec.pass_part is not None and not spec.extra_frames


def _pass_group(item: _Pending, sharing: Sequence[_Pending], n_examples: int) -> list[_Pending]:
    """The probes of ``sharing`` (those after it) that may share ``item``'s forward pass: those that
    compute the same examples as it (``item`` first); empty where it cannot share or none would."""
    if not _can_share(item.spec) or item.first >= n_examples:
        return []
    group = [item, *(p for p in sharing if p.first == item.first)]
    return group if len(group) > 1 else []


def _shared_pass(
    group: Sequence[_Pending], loaded: LoadedModel, examples: list[Example], settings: RunSettings
) -> dict[str, tuple[pl.DataFrame, float, bool]]:
    """The per-example frames of ``group``'s probes (none when empty), computed by ``shared_passes``:
    those whose batches and attention kernel are the same share one forward pass per batch. Each
    probe gets its frame, its share of the seconds (in proportion to its operations, ``ProbeSpec.work``)
    and whether it shared a pass (its batches or attention kernel may differ from the others')."""
    if not group:
        return {}
    from .measurement.probes.shared.activations import shared_passes
    from .measurement.probes.spec import prompts_of

    if loaded.input_device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(loaded.input_device)
    first = group[0].first
    context = Context(settings, first_example=first)
    started = time.perf_counter()
    parts = [item.spec.pass_part(loaded, context) for item in group]
    frames, passes = shared_passes(loaded, prompts_of(examples[first:]), parts, settings.batch_size, context.progress)
    seconds = time.perf_counter() - started
    work = [max(w, 0.0) for w in _operations([item.spec for item in group], loaded, examples[first:], settings)]
    total = sum(work)  # NaN where an estimate failed: then equal shares
    shares = [w / total if total > 0 and math.isfinite(total) else 1 / len(group) for w in work]
    alone = {group[members[0]].spec.name for members in passes if len(members) == 1}
    return {
        item.spec.name: (frame, seconds * share, item.spec.name not in alone)
        for item, frame, share in zip(group, frames, shares, strict=True)
    }


def _measure(
    item: _Pending,
    loaded: LoadedModel,
    examples: list[Example],
    settings: RunSettings,
    shared: tuple[pl.DataFrame, float, bool] | None = None,
) -> tuple[dict[str, pl.DataFrame], dict]:
    """One probe's frames (an earlier run's rows of the same examples reused; ``shared``: its frame
    and seconds from a pass it shared) and its record in ``metadata.json``: time, memory, where it
    ran, its key and revision."""
    spec, donor = item.spec, item.donor
    cuda = loaded.input_device.type == "cuda"
    if cuda and shared is None:
        torch.cuda.reset_peak_memory_stats(loaded.input_device)
    started = time.perf_counter()
    frames = _compute(spec, loaded, examples, settings, donor, None if shared is None else shared[0])
    seconds = time.perf_counter() - started + (0.0 if shared is None else shared[1])
    record = {
        "seconds": round(seconds, 4),
        "peak_rss_mb": peak_rss_mb(),  # the process's peak so far (it only grows)
        **({"peak_gpu_mb": round(torch.cuda.max_memory_allocated(loaded.input_device) / 2**20, 1)} if cuda else {}),
        "host": socket.gethostname(),  # where the time was measured (the cost model's rates)
        "threads": torch.get_num_threads(),
        "key": item.key,
        "revision": spec.revision,
        **({"resolved": resolved} if (resolved := _resolved(spec, settings)) else {}),
        **({"answer_format": ANSWER_FORMAT} if spec.needs_answers else {}),
        **({"identity": item.identity} if item.identity else {}),
        **({"reused": {"from": str(donor.path), "examples": donor.count}} if donor else {}),
        # seconds: its share of one forward pass with others (the cost model leaves such records out)
        **({"shared_pass": True} if shared is not None and shared[2] else {}),
    }
    return frames, record


def _resolved(spec: ProbeSpec, settings: RunSettings) -> dict:
    """What each of the probe's options that resolve on the machine resolved to (``head_dtype``
    auto → float32 or bfloat16): the run records which it used."""
    return {o.name: o.resolve(getattr(settings, o.name), settings) for o in spec.options if o.resolve is not None}


def _new_metadata(
    settings: RunSettings, key: str, loaded: LoadedModel, examples: list[Example], fields: dict | None = None
) -> dict:
    from .provenance import environment, model_provenance

    return {
        "format": FORMAT,
        "key": key,
        "settings": settings.numbers(),
        "key_fields": fields if fields is not None else settings.key_fields(),
        "effdepth_version": __version__,
        "environment": environment(),
        "model_name": loaded.name,
        "model_type": loaded.model_type,
        "model": model_provenance(settings.model, loaded),
        "n_layers": loaded.n_layers,
        "d_model": loaded.d_model,
        "vocab_size": loaded.vocab_size,
        "n_params": sum(p.numel() for p in loaded.model.parameters()),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "device": str(loaded.input_device),
        "n_examples": len(examples),
        "n_asked": settings.n,
        "probes": {},
    }


def _checked_summary(probe: str, added: object, summary: dict) -> dict:
    """A probe's ``summarize`` result: new JSON keys only (a field effdepth or another probe wrote,
    the model, L or an ED, is never overwritten), values finite."""
    if not isinstance(added, dict):
        raise EffdepthError(f"the {probe} probe's summarize returned {type(added).__name__}, not a dict")
    taken = sorted(k for k in added if k in summary or k in ("cells", "level", "digits"))
    if taken:
        raise EffdepthError(f"the {probe} probe's summarize returns {', '.join(map(str, taken))}, fields effdepth owns")
    try:
        text = json.dumps(added, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EffdepthError(
            f"the {probe} probe's summarize returned a value JSON cannot hold finitely ({exc})"
        ) from exc
    return json.loads(text)


def summary_of(
    settings: RunSettings, metadata: dict, per_example: dict, saved: dict, n_bootstrap: int = N_BOOTSTRAP_RUN
) -> tuple[dict, dict]:
    """``effective_depth.json``'s content and the ED per rule, from a run's frames."""
    n_layers = int(metadata["n_layers"])
    specs = {name: registry.get(name) for name in registry.names() if name in per_example}
    rules = [(name, rule) for name, spec in specs.items() for rule in spec.rules]
    depth = effective_depths(per_example, rules, n_layers, settings, n_bootstrap, settings.seed)
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
    if settings.task in ARITHMETIC:
        summary["digits"] = settings.digits
    cells = {}
    for name, spec in specs.items():
        if spec.summarize is not None:
            summary.update(_checked_summary(name, spec.summarize(saved), summary))
        if spec.cell is not None and not spec.rules:
            cells[name] = spec.cell(summary, saved)
    if cells:
        summary["cells"] = cells
    return summary, depth


def _summarize(settings: RunSettings, directory: RunDirectory, n_bootstrap: int) -> RunResult:
    """Read every finished probe of the run directory and compute ED per rule."""
    metadata = directory.read_metadata_or_fail()
    per_example, saved = directory.read_probes(metadata)  # earlier calls' too
    try:
        summary, depth = summary_of(settings, metadata, per_example, saved, n_bootstrap)
    except (pl.exceptions.PolarsError, KeyError, ValueError) as exc:
        raise EffdepthError(
            f"the cached probe files in {directory.path} do not match its metadata ({type(exc).__name__}); "
            "delete the directory's effdepth files, or rerun with --overwrite into a new --out"
        ) from exc
    directory.write_summary(summary)
    return RunResult(directory.path, saved, per_example, depth, summary, metadata)
