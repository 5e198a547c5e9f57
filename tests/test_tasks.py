"""Task formats exactly as the paper's (docs/method.md), deterministic sampling, and clear errors."""

from __future__ import annotations

import json

import pytest

from effdepth_core.errors import TaskError
from effdepth_core.task_loading import load_task
from effdepth_core.tasks import first_solution, gsm8k_example, hellaswag_example


def test_gsm8k_format_is_the_papers():
    example = gsm8k_example("What is 2+3?", "2+3=<<2+3=5>>5\n#### 5", index=0)
    assert example.prompt == (
        "Given the following problem, reason and give a final answer to the problem.\nProblem: What is 2+3?\n"
        'Your response should end with "The final answer is [answer]" where [answer] is the response to the '
        "problem.\n\n2+3=<<2+3=5>>5\nThe final answer is 5"
    )
    assert example.question.endswith("problem.\n") and example.answer.startswith("\n2+3")


def test_hellaswag_no_space_before_a_comma():
    assert hellaswag_example("A man walks", ", then sits.", 0).prompt == "A man walks, then sits."
    assert hellaswag_example("A man walks", "away.", 0).prompt == "A man walks away."


def test_aime_uses_boxed_ending_and_first_solution():
    (example,) = load_task("aime24", n=1, seed=0)
    assert '"\\boxed{[answer]}"' in example.question
    assert example.answer.startswith("\n")
    joined = "First idea $x$.\n~angie.\nSecond solution here."
    assert first_solution(joined) == "First idea $x$.\n"
    assert first_solution("no signature at all") == "no signature at all"


def test_aime_token_filter_uses_the_tokenizer():
    examples = load_task("aime24", n=30, count_tokens=lambda text: len(text) // 4)
    assert examples and all(len(e.prompt) // 4 <= 400 for e in examples)
    with pytest.raises(TaskError, match="no example within"):
        load_task("aime24", n=3, count_tokens=lambda text: 10**6)


def test_sampling_is_deterministic_and_seed_dependent():
    first = [e.prompt for e in load_task("gsm8k", n=5, seed=7)]
    assert first == [e.prompt for e in load_task("gsm8k", n=5, seed=7)]
    assert first != [e.prompt for e in load_task("gsm8k", n=5, seed=8)]
    assert len({e.meta["index"] for e in load_task("hellaswag", n=20, seed=1)}) == 20


def test_math_level_filter():
    examples = load_task("math", n=6, level=5)
    assert len(examples) == 6 and {e.meta["level"] for e in examples} == {5}
    with pytest.raises(TaskError, match="level"):
        load_task("math", n=2, level=9)


@pytest.mark.parametrize(("name", "op"), [("addition", "+"), ("multiplication", "*")])
def test_arithmetic_operands_have_n_digits(name, op):
    examples = load_task(name, n=20, digits=6, seed=2)
    for e in examples:
        a, b = e.meta["a"], e.meta["b"]
        assert len(str(a)) == 6 and len(str(b)) == 6
        result = a + b if op == "+" else a * b
        assert e.question == f"Give the answer directly: {a} {op} {b} = " and e.answer == f"{result}"  # as published
        assert e.prompt == f"Give the answer directly: {a} {op} {b} = {result}"


def test_user_jsonl(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"prompt": "Q1?", "answer": " A1", "tag": "x"}, {"prompt": "Q2?"}, {"prompt": "Q3?"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    examples = load_task(str(path), n=2)
    assert [e.prompt for e in examples] == ["Q1? A1", "Q2?"]  # file order, first n
    assert examples[0].answer == " A1" and examples[1].answer is None and examples[0].meta["tag"] == "x"


def test_no_n_means_ten_of_a_data_set_and_every_line_of_a_file_in_python_as_on_the_command_line(tmp_path):
    """One default wherever a task is read: ``load_task``, ``RunSettings`` (``measure``) and ``--n``
    left out all take every line of a user's file (here 3, fewer than 10) and 10 of a data set; asking
    for more than a file holds names both spellings."""
    from effdepth_core.cli_args import build_parser
    from effdepth_core.settings import RunSettings

    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Q{i}?"}) + "\n" for i in range(3)))
    assert [e.prompt for e in load_task(str(path))] == ["Q0?", "Q1?", "Q2?"]
    assert len(load_task("gsm8k")) == 10 and len(load_task("addition", digits=2)) == 10
    assert RunSettings("m", str(path)).n == 3 and RunSettings("m", "gsm8k").n == 10
    assert RunSettings("m", str(path), n=2).n == 2
    from effdepth_core.cli import _settings

    assert _settings(build_parser().parse_args(["run", "--model", "m", "--task", str(path)])).n == 3
    with pytest.raises(TaskError, match=r"^n=4 \(--n 4\) asks for more examples than .* \(3\); use n=3 \(--n 3\)"):
        load_task(str(path), n=4)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no examples"),
        ('{"answer": "x"}\n', "'prompt'"),
        ("not json\n", "not valid JSON"),
        ('{"prompt": "a", "answer": 3}\n', "'answer' must be a string"),
    ],
)
def test_bad_task_files(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TaskError, match=message):
        load_task(str(path), n=1)


def test_bad_task_arguments(tmp_path):
    with pytest.raises(TaskError, match="unknown task 'gsm9k'"):
        load_task("gsm9k")
    with pytest.raises(TaskError, match="at least 1"):
        load_task("gsm8k", n=0)
    with pytest.raises(TaskError, match="does not exist"):
        load_task(str(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize(
    "line, said",
    [
        ('{"prompt": "a", "x": NaN}', "NaN is not a JSON number"),
        ('{"prompt": "a", "x": -Infinity}', "-Infinity is not a JSON number"),
        ('{"prompt": "a", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"prompt": "a", "x": ' + "9" * 5000 + "}", "Exceeds the limit"),
        ('{"prompt": "a\\ud800b"}', "'prompt' holds a lone surrogate"),
        ('{"prompt": "a", "answer": "\\udfff"}', "'answer' holds a lone surrogate"),
    ],
)
def test_a_task_line_effdepth_cannot_keep_is_one_line_naming_its_place(tmp_path, line, said):
    """Every way a JSON line can break what follows (a record that is no JSON, a RecursionError, a
    ValueError of int(), a TypeError from the tokenizer) is refused where the file is read."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(TaskError, match=f"^{path}:2: ") as caught:
        load_task(str(path), n=2)
    assert said in str(caught.value) and "\n" not in str(caught.value)
