"""Loading a task's examples: the data sets in the paper's formats from vendored files (default) or the
Hugging Face hub, generated arithmetic, and a user's task file (checked line by line)."""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from .errors import EffdepthError, TaskError
from .paths import exists, user_path
from .tasks import (
    AIME_MAX_TOKENS,
    ARITHMETIC,
    DEFAULT_N,
    TASKS,
    Example,
    _vendored,
    arithmetic_example,
    boxed_example,
    first_solution,
    gsm8k_example,
    hellaswag_example,
)


def _hub(path: str, split: str, name: str | None = None) -> list[dict]:
    try:
        from datasets import load_dataset
    except ImportError as exc:
        raise TaskError("--source hub needs the datasets package: pip install 'effdepth[hub]'") from exc
    import os

    from .network import hub_reachable

    cache_only = any(
        os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )
    if not cache_only and not hub_reachable():  # in seconds, not after a minute of retries
        raise TaskError(
            f"cannot load {path}: the Hugging Face hub cannot be reached from this machine; drop --source hub "
            "(source='hub') to use the vendored copy, or set HF_DATASETS_OFFLINE=1 to read the datasets cache"
        )
    try:
        return [dict(row) for row in load_dataset(path, name, split=split)]
    except Exception as exc:  # datasets raises many types for "offline"
        raise TaskError(
            f"cannot load {path} from the Hugging Face hub ({type(exc).__name__}: {str(exc)[:200]}); "
            "drop --source hub (source='hub') to use the vendored copy"
        ) from exc


# --- loaders -------------------------------------------------------------------------------


def _gsm8k(source: str) -> list[Example]:
    rows = _hub("openai/gsm8k", "test", "main") if source == "hub" else _vendored("gsm8k/test.jsonl.gz")
    return [gsm8k_example(r["question"], r["answer"], i) for i, r in enumerate(rows)]


def _hellaswag(source: str) -> list[Example]:
    if source == "hub":
        rows = [
            {"ctx": r["ctx"], "endings": r["endings"], "label": int(r["label"])}
            for r in _hub("Rowan/hellaswag", "validation")
        ]
    else:
        rows = _vendored("hellaswag/validation_preprocessed.jsonl.gz")
    return [hellaswag_example(r["ctx"], r["endings"][int(r["label"])], i) for i, r in enumerate(rows)]


def _aime24(source: str, solution_mode: str) -> list[Example]:
    if source == "hub":
        rows = [
            {"id": r["ID"], "problem": r["Problem"], "solution": r["Solution"], "answer": str(r["Answer"])}
            for r in _hub("Maxwell-Jia/AIME_2024", "train")
        ]
    else:
        rows = _vendored("aime24/test.jsonl")
    if solution_mode not in ("first", "all"):
        raise TaskError(f"aime_solution must be 'first' or 'all', got {solution_mode!r}")
    examples = []
    for r in rows:
        solution = first_solution(r["solution"]) if solution_mode == "first" else r["solution"]
        meta = {"index": len(examples), "id": r["id"], "final_answer": r["answer"], "solution": solution_mode}
        examples.append(boxed_example("aime24", r["problem"], solution, meta))
    return examples


def _math(source: str, level: int | None) -> list[Example]:
    if source == "hub":
        subjects = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra")
        subjects += ("number_theory", "prealgebra", "precalculus")
        rows = [r for s in subjects for r in _hub("EleutherAI/hendrycks_math", "test", s)]
    else:
        rows = _vendored("math/test.jsonl.gz")
    examples = []
    for i, r in enumerate(rows):
        row_level = int(re.sub(r"\D", "", str(r["level"])) or 0)  # "Level 3" (files) or 3
        if level is not None and row_level != level:
            continue
        meta = {"index": i, "level": row_level, "type": r["type"]}
        examples.append(boxed_example("math", r["problem"], r["solution"], meta))
    return examples


def _arithmetic(op: str, n: int, digits: int, rng: random.Random) -> list[Example]:
    if digits < 1:
        raise TaskError(f"digits must be at least 1, got {digits}")
    low, high = 10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1
    examples = []
    for i in range(n):
        example = arithmetic_example(op, rng.randint(low, high), rng.randint(low, high))
        examples.append(
            Example(
                example.question,
                example.answer,
                {**example.meta, "task": "addition" if op == "+" else "multiplication", "index": i, "digits": digits},
            )
        )
    return examples


TASK_FILE_LIMIT = 1 << 30  # a task file of prompts past 1 GiB is not one a run can use


def _read_lines(path: Path) -> tuple[list[str], str]:
    """The lines of a user's task file and the sha256 of the bytes they were read from; one-line
    errors for unreadable or non-UTF-8 files."""
    from .cache import read_regular

    try:
        data = read_regular(path, TASK_FILE_LIMIT, "task file")
    except IsADirectoryError as exc:
        raise TaskError(f"task {str(path)!r} is a directory; pass a .jsonl file") from exc
    except EffdepthError as exc:
        raise TaskError(f"cannot read task file {path}: {exc}") from exc
    except OSError as exc:
        raise TaskError(f"cannot read task file {path} ({exc.strerror or exc})") from exc
    digest = hashlib.sha256(data).hexdigest()
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark (some editors write one)
    try:
        return data.decode("utf-8").split("\n"), digest
    except UnicodeDecodeError as exc:
        number = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise TaskError(
            f"{path}:{number}: not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column}); save the file as UTF-8"
        ) from exc


def _no_constant(name: str) -> None:
    """json's hook for NaN and ±Infinity, which are no JSON: refused, never copied into a record."""
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    """json's hook for a number with a fraction or exponent: one that overflows (1e400) is refused
    like the literal Infinity, never copied into a record as one."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is beyond a float's range")
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _jsonl(path: Path) -> list[Example]:
    """A task file's examples, each with the sha256 of the bytes read (``meta["task_sha256"]``: what
    a run's key must match, so a file rewritten between the key and the read is caught)."""
    examples = []
    lines, digest = _read_lines(path)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line, parse_constant=_no_constant, parse_float=_finite_float)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
        except (RecursionError, ValueError) as exc:  # nesting deeper than Python's stack, NaN, a 5000-digit int
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0].split(":")[0]
            raise TaskError(f"{path}:{number}: a JSON value effdepth cannot keep ({why}); remove it") from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise TaskError(f"{path}:{number}: each line needs a non-empty string field 'prompt'")
        for name in ("prompt", "answer"):
            if isinstance(row.get(name), str) and not _encodable(row[name]):
                raise TaskError(f"{path}:{number}: '{name}' holds a lone surrogate (an unpaired \\ud800-\\udfff "
                                "escape), which is no text a tokenizer can read; fix the escape")  # fmt: skip
        answer = row.get("answer")
        if answer is not None and not isinstance(answer, str):
            raise TaskError(f"{path}:{number}: 'answer' must be a string when given")
        meta = {k: v for k, v in row.items() if k not in ("prompt", "answer", "task_sha256")}
        meta = {"task": path.stem, "index": len(examples), **meta, "task_sha256": digest}
        examples.append(Example(row["prompt"], answer, meta))
    if not examples:
        raise TaskError(f"task file {path} has no examples; each line needs a JSON object with 'prompt'")
    return examples


def count_examples(path: str | Path) -> int:
    """The number of examples in a user's ``.jsonl`` task file (the default ``n`` for it)."""
    return len(_jsonl(user_path(path)))


def looks_like_task_file(text: str) -> bool:
    """Whether ``text`` reads as the path of a task file (one word ending in .jsonl or .json), not a prompt."""
    return isinstance(text, str) and text.lower().endswith((".jsonl", ".json")) and not any(c.isspace() for c in text)


def missing_task_file(name: str) -> TaskError:
    """The one line for a task file that does not exist, naming the nearest file that does."""
    import difflib

    path = user_path(name)
    folder = path.parent
    try:
        near = sorted(str(p.name) for p in folder.iterdir() if p.suffix.lower() in (".jsonl", ".json"))
    except OSError:
        near = []
    close = difflib.get_close_matches(path.name, near, n=1, cutoff=0.5)
    if close:
        hint = f"did you mean {str(folder / close[0]) if str(folder) != '.' else close[0]!r}?"
    elif not exists(folder, "dir"):
        hint = f"nor does its folder {str(folder)!r}"
    else:
        hint = f"no .jsonl or .json file in {str(folder)!r} has a name like it"
    return TaskError(f"task file {name!r} does not exist ({hint}); give an existing .jsonl path or a task: "
                     f"{', '.join(TASKS)}")  # fmt: skip


def check_task(name: str) -> None:
    """Fail fast (before a model is loaded) on a task that is neither known nor an existing file."""
    if name in TASKS:
        return
    path = user_path(name)
    if exists(path, "dir"):
        raise TaskError(f"task {name!r} is a directory; pass a .jsonl file or one of {', '.join(TASKS)}")
    if looks_like_task_file(name) or exists(path):
        if not exists(path):
            raise missing_task_file(name)
        if not path.is_file():  # a FIFO or a device would hang or read nothing
            raise TaskError(f"task file {name!r} is not a regular file; pass a .jsonl file")
        return
    raise TaskError(f"unknown task {name!r}; use one of {', '.join(TASKS)} or a path to a .jsonl file")


def task_pool(
    name: str, source: str = "local", level: int | None = None, aime_solution: str = "first"
) -> list[Example]:
    """Every example of a data-set task or task file, in file order (not the generated tasks)."""
    check_task(name)
    if name not in TASKS:
        return _jsonl(user_path(name))
    if source == "local":  # the vendored files never change: built once per process (frozen examples)
        return list(_vendored_pool(name, level, aime_solution))
    return _data_set(name, source, level, aime_solution)


@functools.cache
def _vendored_pool(name: str, level: int | None, aime_solution: str) -> tuple[Example, ...]:
    return tuple(_data_set(name, "local", level, aime_solution))


def _data_set(name: str, source: str, level: int | None, aime_solution: str) -> list[Example]:
    if name in ARITHMETIC:
        raise TaskError(f"{name} is generated: it has no fixed pool of examples")
    if name == "gsm8k":
        return _gsm8k(source)
    if name == "hellaswag":
        return _hellaswag(source)
    if name == "aime24":
        return _aime24(source, aime_solution)
    if level is not None and level not in range(1, 6):
        raise TaskError(f"MATH level must be 1..5, got {level}")
    return _math(source, level)


def load_task(
    name: str,
    n: int | None = None,
    seed: int = 0,
    source: str = "local",
    level: int | None = None,
    digits: int = 6,
    count_tokens: Callable[[str], int] | None = None,
    max_tokens: int | None = None,
    aime_solution: str = "first",
    positions: int | None = None,
    encode: Callable[[str], Sequence[int]] | None = None,
) -> list[Example]:
    """``n`` examples of a task, sampled deterministically for ``seed``.

    ``name`` is a task in TASKS or a path to a ``.jsonl`` file (``prompt`` required, ``answer``
    optional; the probed text is prompt + answer). ``source``: "local" (vendored files) or "hub".
    ``level`` filters MATH (1–5); ``digits`` sets the arithmetic operand length. With
    ``count_tokens`` (the model's tokenizer), prompts longer than ``max_tokens`` are dropped
    (AIME24 defaults to 400, as in the paper). With ``positions`` and ``encode`` (the model's token
    ids of a text), each example is cut to its first ``positions`` tokens (``first_tokens``); one with
    fewer is left out and the next is sampled.

    Args:
        name: a task name or a ``.jsonl`` path.
        n: the number of examples (None: 10 of a data set, every line of a ``.jsonl`` file).
        seed: the sampling seed.
        source, level, digits, count_tokens, max_tokens: as above.
        aime_solution: which AIME24 solution text is the answer (``"first"``).
        positions, encode: as above.

    Returns:
        The ``Example``s, in sampled order.

    Raises:
        EffdepthError: an unknown task, a malformed file, or too few examples left.
    """
    if n is not None and n < 1:
        raise TaskError(f"n must be at least 1, got {n}")
    if source not in ("local", "hub"):
        raise TaskError(f"source must be 'local' or 'hub', got {source!r}")
    rng = random.Random(seed)
    is_file = name not in TASKS
    if name in ARITHMETIC:
        return _arithmetic("+" if name == "addition" else "*", n or DEFAULT_N, digits, rng)
    pool = task_pool(name, source, level, aime_solution)
    if n is None:
        n = len(pool) if is_file else DEFAULT_N
    if name == "aime24":
        max_tokens = AIME_MAX_TOKENS if max_tokens is None else max_tokens
    if n > len(pool):
        what = f"{name} (level {level})" if level is not None else name
        raise TaskError(
            f"n={n} (--n {n}) asks for more examples than {what} has ({len(pool)}); use n={len(pool)} "
            f"(--n {len(pool)}) or fewer"
        )
    order = list(range(len(pool)))
    if not is_file:  # a user's file keeps its order; data sets are sampled
        rng.shuffle(order)
    chosen: list[Example] = []
    for index in order:
        example = pool[index]
        if count_tokens is not None and max_tokens is not None and count_tokens(example.prompt) > max_tokens:
            continue
        if positions is not None and encode is not None:
            example = first_tokens(example, positions, encode)
            if example is None:
                continue
        chosen.append(example)
        if len(chosen) == n:
            break
    if not chosen:
        if positions is not None and encode is not None:
            raise TaskError(f"task {name!r} has no example of at least {positions} tokens for this tokenizer")
        raise TaskError(f"task {name!r} has no example within {max_tokens} tokens for this tokenizer")
    return chosen


CUT_SEARCH = 256  # characters past the shortest prefix of N tokens where its last token may end


def first_tokens(example: Example, count: int, encode: Callable[[str], Sequence[int]]) -> Example | None:
    """``example`` cut to the shortest prefix of its text whose tokens are exactly its first ``count``
    (the question first, then the answer; ``meta["positions"]`` records the cut), or None when it has
    fewer tokens or no prefix tokenizes to them (a merge across the cut). A causal model's states at
    those positions are the same with or without the rest, so a run on the cut texts measures the
    full texts' first ``count`` positions exactly."""
    text = example.prompt
    ids = list(encode(text))
    if len(ids) < count:
        return None
    target = ids[:count]
    low, high = 0, len(text)  # the shortest prefix with at least ``count`` tokens (their count grows with it)
    while low < high:
        middle = (low + high) // 2
        if len(encode(text[:middle])) >= count:
            high = middle
        else:
            low = middle + 1
    for end in range(low, len(text) + 1):  # that prefix ends inside the last token: on to where it ends
        tokens = list(encode(text[:end]))
        if tokens == target:
            break
        if len(tokens) > count + 2 or end - low > CUT_SEARCH:  # past it (counts wobble by a merge or two)
            return None
    else:
        return None
    question = example.question[:end]
    answer = None if example.answer is None else example.answer[: max(0, end - len(example.question))]
    return Example(question, answer, {**example.meta, "positions": count, "tokens": len(ids)})
