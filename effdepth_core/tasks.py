"""Task formats: ``Example`` (a prompt's question and answer parts), the paper's prompt formats, the
vendored data files and the tuned lens's training text (``task_loading`` loads a task's examples)."""

from __future__ import annotations

import functools
import gzip
import json
import re
from dataclasses import dataclass, field
from importlib import resources

ARITHMETIC = ("addition", "multiplication")  # generated tasks, sized by --digits
# How examples split into question and answer (the answer probes measure the answer's tokens):
# 2 — arithmetic answers are the result's digits; the space before them belongs to the question, as
# in the published code (method.md §8). Recorded with every result of a probe that needs answers.
ANSWER_FORMAT = 2
TASKS = ("gsm8k", "hellaswag", "aime24", "math", *ARITHMETIC)
DEFAULT_N = 10  # examples of a data set when none is asked for (a user's file: all its lines)
AIME_MAX_TOKENS = 400

_REASON_HEADER = (
    "Given the following problem, reason and give a final answer to the problem.\nProblem: {problem}\n"
    "Your response should end with {ending} where [answer] is the response to the problem.\n"
)
_GSM8K_ENDING = '"The final answer is [answer]"'
_BOXED_ENDING = '"\\boxed{[answer]}"'
# A line that is only an author signature ("~angie.", "-Failure.net") ends one AoPS solution.
_SIGNATURE = re.compile(r"^\s*[~\-—–]\s*[^\s$\\].{0,60}$", re.MULTILINE)


@dataclass(frozen=True)
class Example:
    """One prompt: the question part, the answer part the model reads after it (None when the
    task has no answers), and where it came from. The probed text is ``prompt``."""

    question: str
    answer: str | None = None
    meta: dict = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        return self.question + (self.answer or "")

    def to_json(self) -> dict:
        return {"prompt": self.prompt, "question": self.question, "answer": self.answer, "meta": self.meta}


@functools.cache
def _vendored(relative: str) -> tuple[dict, ...]:
    """A vendored data file's rows (read once per process; they never change)."""
    path = resources.files("effdepth_core") / "data" / relative
    with path.open("rb") as raw:
        data = gzip.decompress(raw.read()) if relative.endswith(".gz") else raw.read()
    text = data.decode("utf-8")
    if relative.endswith((".json", ".json.gz")):
        return tuple(json.loads(text))
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


# --- formats (docs/method.md) -------------------------------------------------------------------


def gsm8k_example(question: str, worked_answer: str, index: int) -> Example:
    solution, _, final = worked_answer.partition("####")
    header = _REASON_HEADER.format(problem=question, ending=_GSM8K_ENDING)
    answer = "\n" + solution + f"The final answer is {final.strip()}"
    return Example(header, answer, {"task": "gsm8k", "index": index, "final_answer": final.strip()})


def hellaswag_example(context: str, ending: str, index: int) -> Example:
    separator = "" if ending.startswith(",") else " "
    return Example(context, separator + ending, {"task": "hellaswag", "index": index})


def first_solution(solution: str) -> str:
    """The first of several AoPS community solutions joined in one string (up to its signature)."""
    match = _SIGNATURE.search(solution)
    return solution[: match.start()].rstrip() + "\n" if match else solution


def boxed_example(task: str, problem: str, solution: str, meta: dict) -> Example:
    header = _REASON_HEADER.format(problem=problem, ending=_BOXED_ENDING)
    return Example(header, "\n" + solution, {"task": task, **meta})


def arithmetic_example(op: str, a: int, b: int) -> Example:
    """``Give the answer directly: a op b = `` and the result's digits: the space belongs to the
    question, as in the published code, so the answer tokens are the digits alone (method.md §8)."""
    result = a + b if op == "+" else a * b
    return Example(f"Give the answer directly: {a} {op} {b} = ", f"{result}", {"a": a, "b": b, "op": op})


def lens_corpus() -> list[str]:
    """Training text for the tuned lens, disjoint from every probed prompt by construction: the
    true facts of MQuAKE-hard (vendored, never a task), one short paragraph per case — its single-hop
    cloze statements completed with their answers, then the multi-hop question and its answer."""
    texts = []
    for case in _vendored("mquake/MQuAKE-hard.json.gz"):
        facts = " ".join(f"{hop['cloze']} {hop['answer']}." for hop in case["single_hops"])
        texts.append(f"{facts} {case['questions'][0]} {case['answer']}.")
    return texts
