"""The model-first Python API: ``measure(model, prompts)`` — a model already in memory (a
transformers model and its tokenizer, or a ``LoadedModel``) or a name ``load_model`` knows, and a
list of prompts or a task — returns the run's result (curves, per-example frames, EDs with
intervals, ``.plot()``, a table in a notebook). A model in memory is measured directly
(``results.run_in_memory``); a kept result (``cache=True``, ``out=``, or a model named by a string)
is cached under effdepth's cache or ``out``, keyed by what was measured: the weights, configuration
and tokenizer of a model in memory, the text of the prompts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .cache import atomic_write_bytes, make_dirs, remove_dead_temporaries
from .display import RunResult
from .errors import EffdepthError, nearest_name
from .measurement import registry
from .measurement.trace import show_progress
from .models import LoadedModel, as_the_caller_had, check_tokenizer, resolve_dtype, with_tokenizer, wrap_model
from .paths import exists, names_path, user_path
from .results import run, run_in_memory
from .settings import RunSettings
from .task_loading import _encodable, looks_like_task_file, missing_task_file, task_pool
from .tasks import TASKS, Example
from .zoo import cache_dir


def _prompts_task(prompts: Any, with_answer: bool = True) -> tuple[str, int | None, str]:
    """A task name or file as it is; prompts (text or ``Example``s) written once to a task file in
    effdepth's cache named by their content, so that the run is keyed by their text. With
    ``with_answer=False`` a task file's lines and ``Example``s give their prompt (question) alone.
    Also returns what text is measured (``TEXT_*``), for the result to say."""
    if isinstance(prompts, str) and (
        prompts in TASKS or (names_path(prompts) is not None and exists(user_path(prompts), "file"))
    ):
        if with_answer:
            return prompts, None, TEXT_WITH_ANSWER
        if prompts in TASKS:
            raise EffdepthError(
                f"with_answer=False takes a task file or a list of prompts, not the data set {prompts!r} (its "
                "examples are drawn by n and seed): pass [e.question for e in load_task(...)]"
            )
        prompts = [Example(e.question) for e in task_pool(prompts)]
    if isinstance(prompts, str) and looks_like_task_file(prompts):  # a task path with a typo is no prompt
        raise missing_task_file(prompts)
    if isinstance(prompts, Mapping) or hasattr(prompts, "columns") or isinstance(prompts, Set | bytes):
        kind = "a data frame" if hasattr(prompts, "columns") else type(prompts).__name__
        raise EffdepthError(
            f"measure takes a task name, one prompt or a list of prompts, got {kind} (iterating it would give its "
            "keys or column names, not its texts); pass list(frame['prompt']) or a list of texts"
        )
    try:
        items = [prompts] if isinstance(prompts, str | Example) else list(prompts)
    except TypeError:
        raise EffdepthError(
            f"measure takes a task name, one prompt or a list of prompts, got {type(prompts).__name__}"
        ) from None
    if not items:
        raise EffdepthError("no prompts to measure: give a list of texts, Examples or a task name")
    rows = []
    for index, item in enumerate(items):
        if isinstance(item, str) and not item.strip():
            raise EffdepthError(f"prompt {index} is empty: measure needs text to run the model on")
        text_of = item.question if isinstance(item, Example) else item
        if isinstance(text_of, str) and not _encodable(text_of):
            raise EffdepthError(f"prompt {index} holds a lone surrogate (an unpaired \\ud800-\\udfff), no text a "
                                "tokenizer can read; fix the string")  # fmt: skip
        if isinstance(item, Example):
            answer = item.answer if with_answer else None
            rows.append({"prompt": item.question, **({"answer": answer} if answer else {})})
        elif isinstance(item, str) and item:
            rows.append({"prompt": item})
        else:
            raise EffdepthError(
                f"measure takes text or Examples (it keeps results by their text), got {type(item).__name__}; "
                "for token ids call the probe functions directly (residual_cosine(model, ids))"
            )
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows).encode()
    path = cache_dir() / "prompts" / f"{hashlib.sha256(text).hexdigest()[:32]}.jsonl"
    if exists(path.parent, "dir"):  # what a killed write of a prompt file left here
        remove_dead_temporaries(path.parent, lambda name: name.endswith(".jsonl"))
    if not _holds(path, text):  # named by its content: checked against it on every use, rewritten if not
        make_dirs(path.parent, 0o700)
        atomic_write_bytes(path, text)
    answered = any("answer" in row for row in rows)
    return (
        str(path),
        len(rows),
        TEXT_WITH_ANSWER if answered else TEXT_PROMPT_ONLY if not with_answer else TEXT_AS_GIVEN,
    )


# What a result says it measured (its repr, ``Measurement.text``): one text, one measurement — a task
# file's line and ``Example(question, answer)`` are measured as question + answer, as `effdepth run`
# measures them; a text as given; ``with_answer=False`` the question alone.
TEXT_WITH_ANSWER = "each example's prompt + answer (with_answer=True)"
TEXT_AS_GIVEN = "each text as given"
TEXT_PROMPT_ONLY = "each example's prompt alone (with_answer=False)"


def _holds(path: Path, text: bytes) -> bool:
    """Whether ``path`` is a regular file holding exactly ``text``."""
    from .cache import NotARegularFile, read_regular

    try:
        return read_regular(path, len(text) + 1, "prompts file") == text
    except (OSError, NotARegularFile, EffdepthError):
        return False


def measure(
    model: Any,
    prompts: Any,
    probes: str | Sequence[str] = registry.DEFAULT,
    tokenizer: Any = None,
    out: str | Path | None = None,
    progress: bool | None = None,
    name: str | None = None,
    cache: bool | None = None,
    with_answer: bool = True,
    **settings: Any,
) -> Measurement:
    """Run ``probes`` on ``model`` over ``prompts`` and return the result.

    ``model``: a name ``load_model`` takes (an offline alias, a folder, a GGUF, a hub id), a
    ``LoadedModel``, or a transformers causal LM (with ``tokenizer``; its train/eval mode and
    ``requires_grad`` flags are restored afterwards). ``prompts``: a task name or task file, one
    prompt, or a list of prompts (text or ``Example``s; the answer probes need Examples with an
    answer). ``name``: the model's label in the result (default: the alias or folder it was loaded
    from). ``settings``: any ``RunSettings`` field or probe option (``n``, ``seed``, ``top_k``…).
    ``cache``: whether to keep the result and read it back when the same model (by its weights,
    configuration and tokenizer) and prompts are measured again. A model named by ``model`` is kept
    by default; a model in memory is measured directly, with no run directory written (``out_dir``
    None; the prompts are kept as a task file named by their content),
    unless ``cache=True`` or ``out`` is given. Results are kept in ``out`` or under effdepth's cache
    (``$EFFDEPTH_CACHE/runs``), never the working directory.

    One text, one measurement: a text is measured as given; a task file's line and an
    ``Example(question, answer)`` as question + answer, as ``effdepth run --task FILE`` measures them
    (so ``measure(model, ["The capital of France is Paris"])`` and a line ``{"prompt": "The capital
    of France is", "answer": " Paris"}`` give the same numbers). ``with_answer=False`` measures a
    task file's or Examples' prompts alone. The result says which (``Measurement.text``).

    Args:
        model, prompts, name, cache: as above.
        probes: probe names (``effdepth probes`` lists them).
        with_answer: measure a task file's lines and Examples as prompt + answer (True, as the
            command line does) or their prompts alone (False; the answer probes then have no answer).
        tokenizer: the tokenizer of a transformers model.
        out: the run directory to keep the result in.
        progress: show progress bars (None: when attached to a terminal or notebook).
        **settings: as above.

    Returns:
        A ``Measurement``: its frames, effective depths, ``curve()``, ``table()`` and ``plot()``.

    Raises:
        EffdepthError: a bad setting, prompt, model or probe, in one line naming the fix.
    """
    _check_settings(settings)
    if cache is not None and not isinstance(cache, bool):
        raise EffdepthError(f"cache= takes True or False, got {cache!r}")
    if cache is False and out is not None:
        raise EffdepthError("out= keeps the result in a folder and cache=False keeps none; drop one")
    by_name = isinstance(model, str)
    keep = out is not None or (cache is not False if by_name else bool(cache))  # a name: kept unless told not
    if isinstance(tokenizer, str | Path):  # before the prompts; any other non-tokenizer after the model's check
        check_tokenizer(tokenizer)
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise EffdepthError(f"name= labels the model in the result: give a non-empty text, got {name!r}")
    if not isinstance(with_answer, bool):
        raise EffdepthError(f"with_answer= takes True or False, got {with_answer!r}")
    task, n, text = _prompts_task(prompts, with_answer)
    if n is not None:
        settings.setdefault("n", n)
    task_label = task if n is None else f"{n} prompt{'s' if n != 1 else ''}"
    if n is not None and not with_answer and isinstance(prompts, str):
        task_label = f"{prompts}, prompts alone"
    progress = show_progress(progress)
    if isinstance(model, str):
        run_settings = RunSettings(model, task, progress=progress, **settings)
        result = run(run_settings, probes, out) if keep else run_in_memory(run_settings, probes)
        return _measurement(result, name or model, task_label, text)
    if isinstance(model, LoadedModel):
        if tokenizer is not None:
            model = with_tokenizer(model, tokenizer, "measure")
        _as_the_model_is(model, settings)
        result = _run(RunSettings(model.name, task, progress=progress, **settings), probes, out, model, keep)
        return _measurement(result, name or model.name, task_label, text)
    if not hasattr(model, "config"):
        raise EffdepthError(f"model must be a name, a LoadedModel or a transformers model, got {type(model).__name__}")
    with as_the_caller_had(model):
        loaded = wrap_model(model, tokenizer, name=name)
        if loaded.tokenizer is None:
            raise EffdepthError("measuring text needs the model's tokenizer: pass tokenizer=")
        _as_the_model_is(loaded, settings)
        result = _run(RunSettings(loaded.name, task, progress=progress, **settings), probes, out, loaded, keep)
        return _measurement(result, loaded.name, task_label, text)


def _run(settings: RunSettings, probes, out, loaded: LoadedModel, keep: bool) -> RunResult:
    """A kept run (the cache, or ``out``) or the shortest road: the probes on the model, in memory."""
    return run(settings, probes, out, loaded=loaded) if keep else run_in_memory(settings, probes, loaded=loaded)


def _check_settings(settings: dict[str, Any]) -> None:
    """One line for a setting ``measure`` does not know, with the nearest valid name."""

    from .settings import CORE_DEFAULTS

    known = [name for name in (*CORE_DEFAULTS, *registry.options()) if name not in ("model", "task", "progress")]
    # measure's own arguments, which a misspelling may mean
    arguments = ("probes", "tokenizer", "out", "progress", "cache", "name", "with_answer")
    for name in settings:
        if name not in known:
            close = nearest_name(name, [*known, *arguments])
            hint = f" (did you mean {close}?)" if close else ""
            raise EffdepthError(
                f"measure() got an unknown setting {name!r}{hint}; it takes {', '.join(sorted(known))} "
                "(the flags `effdepth run --help` lists, spelt top_k for --top-k, method='slow' for --slow)"
            )


def _as_the_model_is(loaded: LoadedModel, settings: dict[str, Any]) -> None:
    """Settings that record the model's own device and dtype, unless the caller named them (a
    bfloat16 model measured on the CPU is a bfloat16 run, keyed and labelled so)."""
    device = loaded.input_device.type
    settings.setdefault("device", device)
    if "dtype" not in settings and loaded.dtype != resolve_dtype("auto", device):
        settings["dtype"] = str(loaded.dtype).removeprefix("torch.")


def plot(result: RunResult, chart: str | None = None):
    """The charts of a result (every chart of every probe that ran, one under another; or the one
    named) as notebook output that draws offline: the Vega-Lite spec, and SVG/PNG for viewers without
    JavaScript. Needs the ``[book]`` extra (Altair, vl-convert).

    Args:
        result: a ``Measurement`` (``measure``'s result, or ``effdepth_core.results.open_run``'s).
        chart: a chart name (None: all of them).

    Returns:
        An object that displays the charts in a notebook.
    """
    import importlib.util

    if importlib.util.find_spec("altair") is None or importlib.util.find_spec("vl_convert") is None:
        raise EffdepthError("charts need the book extra (altair, vl-convert): pip install 'effdepth[book]'")
    from effdepth_book import plots

    charts = [c for name in result.per_example for c in registry.get(name).charts]
    chosen = [c for c in charts if chart is None or c.name == chart]
    if not charts:
        raise EffdepthError(
            f"none of this result's probes ({', '.join(result.per_example)}) draws a chart; their frames are in "
            "result.curves and result.per_example"
        )
    if not chosen:
        raise EffdepthError(
            f"no chart {chart!r} for this result's probes (its charts: {', '.join(c.name for c in charts)})"
        )
    frames = {**result.curves, **{f"{k}_by_example": v for k, v in result.per_example.items()}}
    drawn = []
    for found in chosen:
        if found.frame not in frames:
            if chart is not None:
                raise EffdepthError(f"this result has no {found.frame} frame to draw")
            continue
        frame = frames[found.frame]
        builder = found.builder if callable(found.builder) else getattr(plots, found.builder)
        options = found.options(frame) if found.options else {}
        model, task = result._labels()  # as the caller named them (a Measurement), not a cache path
        drawn.append(builder(frame, model=model, task=task, **options))
    shown = [d for d in drawn if not isinstance(d, plots.Note)]
    if len(shown) <= 1:
        return plots.show(shown[0] if shown else drawn[0] if drawn else plots.Note("this result has nothing to draw"))
    return plots.show(plots.alt.vconcat(*shown).resolve_scale(color="independent"))


@dataclass(repr=False)
class Measurement(RunResult):
    """What ``measure`` returns: a run's result (``curves``, ``per_example``, ``depth``, ``eds``,
    ``summary``; a table in a notebook) that also draws itself (``plot``), labelled by what was
    passed (``model_label``: the name given, or the alias or folder the model came from;
    ``task_label``: the task, or "5 prompts")."""

    model_label: str = ""
    task_label: str = ""
    text: str = ""  # what was measured: ``TEXT_WITH_ANSWER``, ``TEXT_AS_GIVEN`` or ``TEXT_PROMPT_ONLY``

    def plot(self, chart: str | None = None):
        """Every chart of the probes that ran (or the one named), drawn offline as a cell's output."""
        return plot(self, chart)


def _measurement(result: RunResult, model_label: str = "", task_label: str = "", text: str = "") -> Measurement:
    values = {f.name: getattr(result, f.name) for f in fields(result)}
    return Measurement(**values, model_label=model_label, task_label=task_label, text=text)
