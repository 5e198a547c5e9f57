"""Every declared option, fed hostile values: the command line answers exit 2 with one line, Python
raises ``OptionError``, before any model work — or the value is one the declaration accepts and the
run goes ahead with exactly that value. The options come from their one declaration
(``effdepth_core.options`` and each probe's spec), so an option added later is fuzzed unedited."""

from __future__ import annotations

import contextlib
import io
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effdepth_core import cli, results
from effdepth_core.cli_args import build_parser
from effdepth_core.errors import EffdepthError, OptionError
from effdepth_core.measurement import registry
from effdepth_core.options import CORE_OPTIONS, MAP_OPTIONS, OTHER_OPTIONS, Option
from effdepth_core.settings import MapSettings, RunSettings, check_settings

HOSTILE_TEXT = ["0", "-1", "1" + "0" * 5000, "1" + "0" * 4000, "nan", "inf", "-inf", "abc", "", "\n", "x" * 300,
                "1e9", "99999999999999999999", "0.5", "1\n2", "é"]  # fmt: skip
HOSTILE_VALUES = [0, -1, 10**5000, 10**40, math.nan, math.inf, -math.inf, "abc", "", "\n", "x" * 300, 0.5, True,
                  None, [], 1.5, "5"]  # fmt: skip
FACTS = {"vocab_size": 49152, "n_layers": 30}  # smollm2-135m's, so no model file is read


class ModelWork(BaseException):
    """Raised where a run would start its work: nothing before it may have refused the value."""


def _run_options() -> dict[str, Option]:
    return {**CORE_OPTIONS, **registry.options()}


def _valid(option: Option, value) -> bool:
    return option.problem(value) is None


@pytest.fixture
def no_model_work(monkeypatch, tmp_path):
    seen: list[RunSettings] = []

    def refuse_to_open(out, key, described, frames, overwrite):
        raise ModelWork

    def plan(settings, *args, **kwargs):
        seen.append(settings)
        return original(settings, *args, **kwargs)

    original = results._plan
    monkeypatch.setattr(results, "_plan", plan)
    monkeypatch.setattr(results, "preflight_model", lambda spec: dict(FACTS))
    monkeypatch.setattr(results.RunDirectory, "open", staticmethod(refuse_to_open))
    monkeypatch.chdir(tmp_path)
    return seen


def _cli(argv: list[str]) -> tuple[object, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
        except ModelWork:
            code = "work"
    return code, err.getvalue()


TEXT_OPTIONS = ("max_tokens", "positions")  # options of a data set's texts: refused on generated tasks


def _check_run_flag(name: str, option: Option, text: str, seen: list[RunSettings]) -> None:
    owners = [p for p, spec in registry.specs().items() if name in (o.name for o in spec.options)]
    probes = ",".join(owners or ["cosine"])
    # the data set's default (gsm8k) where an option applies to data sets only
    task = ["--task", "math"] if name == "level" else ["--task", "addition"] if name not in TEXT_OPTIONS else []
    seen.clear()
    flag = "--" + name.replace("_", "-") if name in CORE_OPTIONS else option.cli_flag
    n = [] if name == "n" else ["--n", "1"]  # --n itself from the fuzz
    argv = ["run", "--model", "smollm2-135m", *task, *n, "--probes", probes, "--no-progress", "--out", "o"]
    if name == "method":
        return  # the command line spells it --slow, a switch: no value to fuzz
    code, err = _cli([*argv, flag, text])
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("effdepth: error:"), (flag, text, err)
        assert "Traceback" not in err and "internal error" not in err
        return
    assert code == "work", (flag, text[:40], code, err)
    # accepted: only a value the declaration accepts, and the run asked for exactly it
    value = option.parse(text) if option.choices is None else text
    assert _valid(option, value), (flag, text)
    assert getattr(seen[-1], name) == (option.normalize(value) if option.normalize else value)


def test_every_run_option_refuses_each_hostile_text_in_one_line(no_model_work):
    tried = 0
    for name, option in _run_options().items():
        for text in HOSTILE_TEXT:
            _check_run_flag(name, option, text, no_model_work)
            tried += 1
    assert tried >= 27 * len(HOSTILE_TEXT)  # 9 core settings and 18 probe options today, 432 runs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from(sorted(_run_options())),
    st.one_of(
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.text(min_size=0, max_size=320),
    ),
)
def test_fuzzed_run_options_are_refused_or_run_as_declared(no_model_work, name, text):
    _check_run_flag(name, _run_options()[name], text, no_model_work)


def test_every_python_setting_refuses_each_hostile_value():
    """The fixed hostile values (10**5000 among them: no Hypothesis version may print it) for every
    setting: 17 values × every core setting and probe option."""
    for name in _run_options():
        for value in HOSTILE_VALUES:
            _check_python_setting(name, value)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(sorted(_run_options())),
    st.one_of(
        st.integers(min_value=-(10**30), max_value=10**30),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=320),
        st.lists(st.text(max_size=5), max_size=3),
    ),
)
def test_python_settings_raise_option_error_or_pass_the_declaration(name, value):
    _check_python_setting(name, value)


def _check_python_setting(name: str, value) -> None:
    """``RunSettings``/``measure``'s keyword: an ``OptionError`` (or the task's one-line error), never
    another exception, and a value passes only when its declaration accepts it."""
    option = _run_options()[name]
    task = "math" if name == "level" else "addition" if name != "max_tokens" else "gsm8k"
    probes = [p for p, spec in registry.specs().items() if name in (o.name for o in spec.options)] or ["cosine"]
    try:
        run_settings = RunSettings("smollm2-135m", task, **{name: value})
        check_settings(run_settings, probes, FACTS)
    except OptionError:
        return
    except EffdepthError as exc:  # a rule across settings (a probe's own check): still one line
        assert "\n" not in str(exc)
        return
    stored = getattr(run_settings, name)
    assert option.problem(stored) is None, (name, value)


def test_python_seed_nan_is_refused_before_the_model(no_model_work):
    """``seed=float('nan')`` once drew other cut positions on every call."""
    for value in (math.nan, 1.5, -1, 10**5000, "0", True):
        with pytest.raises(OptionError, match="seed"):
            results.run(RunSettings("smollm2-135m", "addition", n=1, seed=value), ["cosine"], "o")
    with pytest.raises(ModelWork):  # and a valid one reaches the work
        results.run(RunSettings("smollm2-135m", "addition", n=1, seed=3), ["cosine"], "o")


@pytest.mark.parametrize("table", ["map", "other"])
def test_the_other_commands_numbers_refuse_each_hostile_text(table):
    """``effdepth map``/``grid``/``book``'s numbers: read by argparse from the same declarations."""
    declared = MAP_OPTIONS if table == "map" else OTHER_OPTIONS
    commands = {"map": ["map", "--small", "a", "--big", "b"], "other": None}
    where = {"cpus_per_cell": ["grid"], "memory_per_cell": ["grid"], "bootstrap_seed": ["book"]}
    for name, option in declared.items():
        argv = commands["map"] if table == "map" else where[name]
        parser = build_parser(argv[0])
        for text in HOSTILE_TEXT:
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    parsed = parser.parse_args([*argv, "--" + name.replace("_", "-"), text])
                except SystemExit as exc:
                    assert exc.code == 2 and err.getvalue().count("\n") == 1, (name, text, err.getvalue())
                    continue
            value = getattr(parsed, name)
            assert option.problem(value) is None and value == option.parse(text), (name, text)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(sorted(MAP_OPTIONS)),
    st.one_of(st.sampled_from(HOSTILE_VALUES[4:]), st.integers(min_value=-(10**30), max_value=10**30), st.floats()),
)
def test_map_settings_raise_option_error_or_pass_the_declaration(name, value):
    """``MapSettings.check``'s numbers come from the same declarations (no model is resolved: the
    check stops at the first refused value, before ``preflight_model``)."""
    option = MAP_OPTIONS[name]
    if option.problem(value) is None:
        return  # a valid value goes on to the task and models, which other tests cover
    with pytest.raises(OptionError):
        MapSettings("a", "b", "addition", **{name: value}).check()


@pytest.mark.parametrize("character", ["\t", "\n", "\x1b", "\u202e"])
def test_a_task_file_name_that_no_record_can_show_is_refused_before_the_run(tmp_path, no_model_work, character):
    """A task file whose name held a tab or a direction mark was run, and its record was one
    ``effdepth table`` refused to read: the name is refused first, in one line."""
    task = tmp_path / f"tasks{character}.jsonl"
    task.write_text('{"prompt": "two plus two is", "answer": " four"}\n')
    code, err = _cli(["run", "--model", "smollm2-135m", "--task", str(task), "--probes", "cosine", "--out", "o"])
    assert code == 2 and err.count("\n") == 1 and "no record can show" in err, err
