"""The exact length control (``positions``): each text cut to its first N tokens, which a causal
model reads exactly as it reads those positions of the whole text."""

from __future__ import annotations

import json

import polars as pl
import pytest

from effdepth_core.errors import EffdepthError, EffdepthWarning
from effdepth_core.results import run
from effdepth_core.settings import RunSettings, check_settings, default_out_dir
from effdepth_core.task_loading import first_tokens, load_task
from effdepth_core.tasks import Example


def _chars(text: str) -> list[int]:
    """A hand tokenizer: a BOS id, then one id per character."""
    return [0, *map(ord, text)]


def _merging(text: str) -> list[int]:
    """A hand tokenizer that merges "ab" into one token wherever it occurs."""
    ids, i = [0], 0
    while i < len(text):
        if text.startswith("ab", i):
            ids.append(-1)
            i += 2
        else:
            ids.append(ord(text[i]))
            i += 1
    return ids


def test_first_tokens_by_hand():
    example = Example("Q: 12", " A: 3", {"id": 7})
    cut = first_tokens(example, 4, _chars)  # BOS + 3 characters
    assert (cut.question, cut.answer, cut.meta) == ("Q: ", "", {"id": 7, "positions": 4, "tokens": 11})
    cut = first_tokens(example, 8, _chars)  # into the answer
    assert (cut.question, cut.answer) == ("Q: 12", " A")
    assert first_tokens(example, 11, _chars).prompt == "Q: 12 A: 3"
    assert first_tokens(example, 12, _chars) is None  # one token more than it has
    assert first_tokens(Example("xyz"), 2, _chars) == Example("x", None, {"positions": 2, "tokens": 4})
    # "ab" is one token: the first 3 tokens of "xabc" are BOS, x, ab
    assert first_tokens(Example("xabc"), 3, _merging).question == "xab"


def test_a_cut_that_no_prefix_gives_leaves_the_text_out():
    def contextual(text: str) -> list[int]:  # the last character's id depends on what follows it
        return [0, *(ord(c) + (100 if i + 1 < len(text) else 0) for i, c in enumerate(text))]

    assert first_tokens(Example("abcd"), 3, contextual) is None


def test_real_tokenizer_cuts_re_encode_to_the_first_tokens(smollm2):
    """On the embedded default's subword tokenizer, every cut text of two data sets tokenizes to
    exactly the whole text's first N ids."""

    def encode(text):
        return smollm2.encode(text).tolist()

    for task in ("hellaswag", "gsm8k"):
        for example in load_task(task, n=15, seed=3):
            full = encode(example.prompt)
            for count in (2, 17, 32, 64):
                cut = first_tokens(example, count, encode)
                if count > len(full):
                    assert cut is None
                    continue
                assert cut is not None and encode(cut.prompt) == full[:count], (task, count)


def test_positions_is_keyed_only_when_set_and_refused_on_generated_tasks():
    plain = RunSettings("smollm2-135m", "gsm8k", n=5)
    windowed = plain.replace(positions=32)
    assert "positions" not in plain.key_fields()  # every run before the option keeps its key
    assert windowed.key() != plain.key()
    assert default_out_dir(windowed, hashed=False).name == "gsm8k-n5-seed0-pos32"
    with pytest.raises(EffdepthError, match="applies to data-set tasks"):
        check_settings(RunSettings("smollm2-135m", "addition", n=2, positions=4), ["cosine"])
    with pytest.raises(EffdepthError, match="positions"):
        check_settings(plain.replace(positions=0), ["cosine"])


def test_a_windowed_run_measures_the_whole_texts_first_positions(tiny_dir, tmp_path):
    """A run with positions=N equals, per prompt and layer, the lens of the whole text read at every
    position (``lens_by_token``: one forward over all of it) and averaged over positions < N."""
    from effdepth_core.measurement.probes.lens_tokens import lens_by_token
    from effdepth_core.models import load_model

    task = tmp_path / "texts.jsonl"
    texts = ["the cat sat on the mat and then it slept", "a dog ran", "one two three four five six seven eight"]
    task.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    count = 12
    # the float32 head product: the reference below is float32 (bfloat16 is tested in test_head_dtype)
    settings = RunSettings(
        str(tiny_dir), str(task), n=3, positions=count, device="cpu", progress=False, head_dtype="float32"
    )
    with pytest.warns(EffdepthWarning, match=r"kept 2 of the 3 .* shorter than 12 tokens \(positions\)"):
        result = run(settings, ["logit_lens"], tmp_path / "out")
    frame = result.per_example["logit_lens"]
    assert frame["example"].unique().sort().to_list() == [0, 1]  # "a dog ran" has fewer than 12 tokens
    assert set(frame["n_tokens"].to_list()) == {count}
    loaded = load_model(str(tiny_dir), device="cpu")
    for example, text in enumerate([texts[0], texts[2]]):
        by_token = lens_by_token(loaded, text).filter(pl.col("position") < count)
        expected = by_token.group_by("layer").agg(pl.col("kl").mean(), pl.col("overlap").mean())
        for metric in ("kl", "overlap"):
            got = frame.filter(example=example, metric=metric).select("layer", "value")
            joined = got.join(expected.select("layer", pl.col(metric).alias("expected")), on="layer")
            assert joined.height == got.height > 0
            # float32 forwards of different lengths: the same sums in another order (~1e-6 of values ~1-10)
            scale = max(1.0, float(joined["expected"].abs().max()))
            assert (joined["value"] - joined["expected"]).abs().max() <= 1e-4 * scale, (example, metric)


def test_the_command_line_says_what_text_it_measured(tiny_dir, tmp_path, capsys):
    from effdepth_core.cli import main

    task = tmp_path / "texts.jsonl"
    rows = [{"prompt": "the cat sat on the mat", "answer": " and slept"}, {"prompt": "a dog", "answer": " ran off to"}]
    task.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["run", "--model", str(tiny_dir), "--task", str(task), "--n", "2", "--positions", "10"]
    assert main([*argv, "--probes", "cosine", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    # char tokens: BOS + 9 characters; "a dog ran off to" reaches its answer at the 6th character
    assert "cut to its first 10 tokens (--positions): 1 of 2 cuts reach the answer" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main([*argv[:-2], "--positions=-3", "--probes", "cosine"])
    assert refused.value.code == 2 and "--positions: must be at least 1" in capsys.readouterr().err


def test_the_math_levels_length_control_cuts_every_level_of_the_same_texts():
    pytest.importorskip("papermill", reason="the book's sections")
    from pathlib import Path

    from effdepth_book import params_schema
    from effdepth_book.sections.difficulty import LEVEL_LENGTH_GROUP, DifficultyPage, level_length_specs, plans
    from effdepth_book.study import task_label, task_settings

    math = {"levels": [1, 5], "n": 7, "max_tokens": 192}
    specs = level_length_specs(math, {"positions": 80, "n": 100})
    # by hand: the level runs' data set, level and token cap, their own n, cut, a fixed n
    assert specs == tuple(
        {"max_tokens": 192, "task": "math", "level": level, "probes": ["cosine", "logit_lens"], "positions": 80,
         "precision": None, "n": 100}
        for level in (1, 5)
    )  # fmt: skip
    assert level_length_specs(math, None) == ()
    assert [s["n"] for s in level_length_specs(math, {"positions": 80})] == [7, 7]  # the levels' own n
    with pytest.raises(EffdepthError, match="sets no math levels"):
        level_length_specs(None, {"positions": 80})
    with pytest.raises(EffdepthError, match=r"past math\.max_tokens 192"):
        level_length_specs(math, {"positions": 193})
    # the cut run is the level run's settings plus positions (its own folder), never the level run's key
    cut = task_settings("smollm2-135m", specs[0])
    whole = task_settings("smollm2-135m", {"task": "math", "level": 1, "max_tokens": 192, "n": 100})
    assert cut == whole.replace(positions=80) and cut.key() != whole.key()
    check_settings(cut, ["cosine", "logit_lens"])
    assert task_label(specs[1]) == "MATH level 5, first 80 tokens"
    assert task_label({"task": "math", "level": 5}) == "MATH level 5"  # committed labels unchanged

    parameters = {"models": ["smollm2-135m"], "math": math, "level_length": {"positions": 80, "n": 100}}
    assert [p.name for p in plans(parameters)] == ["tasks", "levels", "level_length"]
    page = DifficultyPage(parameters, cached_only=True)
    page.section = "difficulty"
    assert page.groups[LEVEL_LENGTH_GROUP] == ["MATH level 1, first 80 tokens", "MATH level 5, first 80 tokens"]
    assert page.groups["MATH level"] == ["MATH level 1", "MATH level 5"]

    where = Path("params/difficulty.yml")
    keys = params_schema.section_keys("difficulty")

    def check(control):
        data = {"title": "t", "profiles": {"full": {"defaults": {"math": math, "level_length": control}}}}
        params_schema.check_section(data, where, keys)

    check({"positions": 80, "n": 100})
    check(None)
    for control, message in [
        ({"n": 100}, "needs positions"),
        ({"positions": 0}, "positions must be"),
        ({"positions": 80, "level": 2}, "level is not a known key"),
        ({"positions": 80.5}, "positions must be a whole number"),
    ]:
        with pytest.raises(params_schema.ParamsError, match=message):
            check(control)
