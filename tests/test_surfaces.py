"""The newer surfaces held to the old rules (issue 24), one test per class of defect: every write is
exclusive and never through a link, nothing deleted that effdepth cannot prove it wrote, every read
a bounded regular file and every trusted record anchored (the GGUF's own metadata, private folders,
the summary's sha256), plugins contained, params/ checked against a schema, executors that fail
fast, a full disk that leaves a resumable folder, and output with its control characters escaped.
Each failed on main before this change (99e4ddf)."""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import json
import os
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from effdepth_core import acquire, cache, zoo
from effdepth_core.cli import main
from effdepth_core.errors import EffdepthError
from effdepth_core.measurement import registry


def _cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's refusal of an option's value: its one line, exit 2
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@contextlib.contextmanager
def _deadline(seconds: int):
    """Fail instead of hanging (a FIFO opened for reading blocks until a writer comes)."""

    def expired(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _run(tiny_dir: Path, out: Path, *extra) -> list[str]:
    return ["run", "--model", tiny_dir, "--task", "addition", "--n", "2", "--out", out, "--no-progress", *extra]


# --- 1. writes: exclusive, unpredictable, never through a link; deletes only what effdepth wrote


def test_a_link_planted_at_the_temporary_name_is_never_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    target = tmp_path / "metadata.json"
    host = cache._HOST
    for guess in (f".metadata.json.effdepth-tmp-{host}-{os.getpid()}", f".metadata.json.effdepth-tmp-{os.getpid()}"):
        (tmp_path / guess).symlink_to(victim)  # the names main's writes used
    cache.atomic_write_json(target, {"a": 1})
    assert victim.read_text() == "mine\n" and json.loads(target.read_text()) == {"a": 1}
    assert cache.temporary_path(target) != cache.temporary_path(target)  # unpredictable
    # and the temporaries of this format are still recognised (a killed write's leftovers are cleaned)
    assert cache.temporary_of(cache.temporary_path(target).name) == "metadata.json"


def test_an_existing_temporary_name_is_an_error_never_a_truncation(tmp_path):
    existing = tmp_path / "x"
    existing.write_text("keep")
    with pytest.raises(FileExistsError):
        cache.create_exclusive(existing)
    assert existing.read_text() == "keep"


def test_refetch_deletes_only_the_files_effdepth_recorded(tmp_path, monkeypatch):
    import torch
    from conftest import char_tokenizer, make_tiny

    from effdepth_core.acquire import save_dequantized

    alias_dir = tmp_path / "models" / "smollm2-135m"
    alias_dir.mkdir(parents=True)
    gguf = alias_dir / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(acquire, "ensure_model", lambda alias, progress=True, refetch=False: gguf)
    foreign = alias_dir / "dequantized-float16"
    foreign.mkdir()
    (foreign / "weights.bin").write_text("a user's own folder")
    ours = alias_dir / "dequantized-float32"
    save_dequantized(make_tiny("llama").model, char_tokenizer(), ours, torch.float32, "ab" * 32)
    (ours / "notes.txt").write_text("a user's file inside effdepth's folder")
    with pytest.warns(UserWarning):
        acquire.refetch("smollm2-135m", progress=False)
    assert (foreign / "weights.bin").read_text() == "a user's own folder"  # main: rmtree'd
    assert sorted(p.name for p in ours.iterdir()) == ["notes.txt"]  # effdepth's files went, the user's stayed


# --- 2. reads: regular files of bounded size; records anchored outside a stray edit


@pytest.mark.parametrize("reader", ["marker", "verified", "lens", "metadata", "read_regular"])
def test_a_fifo_where_a_record_belongs_never_blocks(tmp_path, monkeypatch, reader):
    from effdepth_core.measurement.probes import tuned_lens
    from effdepth_core.rundir import read_metadata

    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))
    fifo = {
        "marker": tmp_path / acquire.DEQUANTIZED_MARKER,
        "verified": zoo._fingerprint_path("smollm2-135m"),
        "lens": tmp_path / "lens.safetensors.json",
        "metadata": tmp_path / "metadata.json",
        "read_regular": tmp_path / "any",
    }[reader]
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    with _deadline(10):
        if reader == "marker":
            assert acquire.dequantized_marker(tmp_path) is None
        elif reader == "verified":
            zoo.model_path("smollm2-135m").write_bytes(b"GGUF")
            assert zoo.cache_state("smollm2-135m") == "unverified"
        elif reader == "lens":
            (tmp_path / "lens.safetensors").write_bytes(b"x")
            with pytest.raises(EffdepthError, match="no effdepth record"):
                tuned_lens.verify_lens_file(tmp_path / "lens.safetensors")
        elif reader == "metadata":
            assert read_metadata(tmp_path) is None
        else:
            with pytest.raises(cache.NotARegularFile):
                cache.read_regular(fifo)


def test_a_huge_record_is_refused_unread(tmp_path):
    big = tmp_path / "big.json"
    with big.open("wb") as handle:
        handle.truncate(cache.RECORD_LIMIT + 1)  # sparse: no disk used
    with pytest.raises(cache.NotARegularFile, match="more than"):
        cache.read_json(big)


def _write_gguf(path: Path, layers: int, eps: float, tokens: list[str], rope_theta: float = 10000.0) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_rope_freq_base(rope_theta)
    writer.add_token_list(tokens)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def test_the_dequantized_folder_is_checked_against_the_gguf_not_its_own_marker(tmp_path):
    import torch
    from conftest import char_tokenizer, make_tiny

    from effdepth_core.acquire import save_dequantized

    tiny = make_tiny("llama")
    folder = tmp_path / "dequantized-float32"
    tokenizer = char_tokenizer()
    save_dequantized(tiny.model, tokenizer, folder, torch.float32, "ab" * 32)
    config = json.loads((folder / "config.json").read_text())
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    gguf = tmp_path / "model.gguf"
    # transformers 5 writes rope_theta inside rope_parameters (earlier versions: at the top level)
    rope_theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
    assert rope_theta is not None
    _write_gguf(gguf, config["num_hidden_layers"], config["rms_norm_eps"], tokens, rope_theta)
    assert acquire.gguf_mismatch(folder, gguf) is None  # every mapped value found, nested or not
    _write_gguf(gguf, config["num_hidden_layers"], config["rms_norm_eps"], tokens, rope_theta * 2)
    acquire._REFERENCES.clear()
    assert "rope_theta" in acquire.gguf_mismatch(folder, gguf)
    _write_gguf(gguf, config["num_hidden_layers"], config["rms_norm_eps"], tokens, rope_theta)
    acquire._REFERENCES.clear()
    assert acquire.dequantized_state(folder, "torch.float32", "ab" * 32, gguf=gguf) == "ready"
    # the attack of the issue: a changed config and the new sha256 in the marker; the marker agrees
    (folder / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 0.5}))
    marker = json.loads((folder / acquire.DEQUANTIZED_MARKER).read_text())
    marker["files"]["config.json"] = cache.file_record(folder / "config.json")
    (folder / acquire.DEQUANTIZED_MARKER).write_text(json.dumps(marker))
    assert acquire.dequantized_state(folder, "torch.float32", "ab" * 32) == "ready"  # the marker alone is fooled
    assert acquire.dequantized_state(folder, "torch.float32", "ab" * 32, gguf=gguf) == "damaged"
    assert "rms_norm_eps" in acquire.gguf_mismatch(folder, gguf)
    # the same for the vocabulary: one token swapped
    (folder / "config.json").write_text(json.dumps(config))
    _write_gguf(gguf, config["num_hidden_layers"], config["rms_norm_eps"], [*tokens[:-1], "other"], rope_theta)
    acquire._REFERENCES.clear()
    assert "token(s) differ" in acquire.gguf_mismatch(folder, gguf)


def test_a_cache_folder_others_can_write_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir()
    monkeypatch.setenv("EFFDEPTH_CACHE", str(root))
    os.chmod(root, 0o777)
    with pytest.raises(EffdepthError, match="writable by other users"):
        zoo.check_cache_dir()
    os.chmod(root, 0o1777)  # sticky (like /tmp): others cannot replace what is in it
    assert zoo.check_cache_dir() == root
    os.chmod(root, 0o755)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_dir):
    out = tmp_path_factory.mktemp("surfaces") / "run"
    assert main([str(a) for a in _run(tiny_dir, out)]) == 0
    return out


def test_table_checks_a_summary_against_its_recorded_sha256(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    summary = json.loads((run / "effective_depth.json").read_text())
    last = summary["n_layers"] - 1
    summary["cosine"] = {**summary["cosine"], "ed": last, "ratio": 1.0, "ci_low": last, "ci_high": last}  # consistent
    (run / "effective_depth.json").write_text(json.dumps(summary))
    code, _, err = _cli(capsys, "table", run)
    assert code == 2 and "sha256 its run recorded" in err


# --- 3. plugins are contained


@pytest.fixture
def fake_plugins(monkeypatch):
    """``install(name=value, …)``: entry points of the ``effdepth.probes`` group."""
    real = importlib.metadata.entry_points

    def install(**points: str) -> None:
        found = importlib.metadata.EntryPoints(
            [
                importlib.metadata.EntryPoint(name=n, value=v, group=registry.ENTRY_POINT_GROUP)
                for n, v in points.items()
            ]
        )
        monkeypatch.setattr(
            importlib.metadata,
            "entry_points",
            lambda **s: found if s.get("group") == registry.ENTRY_POINT_GROUP else real(**s),
        )
        registry.reload()

    yield install
    monkeypatch.undo()
    registry.reload()


def _plugin_module(tmp_path: Path, monkeypatch, body: str) -> str:
    """A plugin module of its own name (modules are imported once per process)."""
    name = f"hostile_plugin_{abs(hash(body))}"
    (tmp_path / f"{name}.py").write_text(
        "from dataclasses import replace\nimport plugin_probe\n"
        "from effdepth_core.measurement.probes.spec import Option\n" + body
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.mark.parametrize(
    "body, why",
    [
        ("SPEC = replace(plugin_probe.SPEC, name='../escaped')", "plain lower-case identifier"),
        ("SPEC = replace(plugin_probe.SPEC, name='resmax', extra_frames=('../../v1',))", "plain lower-case"),
        ("SPEC = replace(plugin_probe.SPEC, options=(Option('out', 1, 'x'),))", "clashes"),
        ("SPEC = replace(plugin_probe.SPEC, options=(Option('overwrite', 1, 'x'),))", "clashes"),
        ("SPEC = replace(plugin_probe.SPEC, options=(Option('x', 1, 'x', flag='--seed'),))", "clashes"),
        ("import sys\nsys.exit(0)", "SystemExit"),
        ("SPEC = 42", "ProbeSpec"),
    ],
)
def test_a_hostile_plugin_is_left_out_in_one_line_and_every_command_works(
    fake_plugins, tmp_path, monkeypatch, capsys, body, why
):
    module = _plugin_module(tmp_path, monkeypatch, body)
    name = "../escaped" if "../escaped" in body else "resmax"
    fake_plugins(**{name: f"{module}:SPEC"})
    with pytest.raises(SystemExit) as exited:
        main(["run", "--help"])
    assert exited.value.code == 0
    err = capsys.readouterr().err
    assert err.count("effdepth: warning:") == 1 and why in err and "Traceback" not in err
    assert "registry.py" not in err  # one line, not Python's two-line warning
    assert name not in registry.specs()
    if name == "resmax":
        with pytest.raises(EffdepthError, match="was left out"):
            registry.get(name)


def test_a_plugin_named_like_a_built_in_is_named(fake_plugins):
    fake_plugins(cosine="plugin_probe:SPEC")
    with pytest.warns(UserWarning, match="'cosine' was left out: its name is a built-in"):
        registry.names()


@pytest.mark.parametrize(
    "summarize, compute, message",
    [
        (lambda saved: {"model": "gpt-5", "n_layers": 96}, None, "fields effdepth owns"),
        (lambda saved: {"cosine": {"ed": 90}}, None, "fields effdepth owns"),
        (lambda saved: {"extra": float("nan")}, None, "finitely"),
        (None, lambda loaded, examples, context: 42, "not a polars DataFrame"),
        (None, lambda loaded, examples, context: pl.DataFrame(), "'example' column"),
    ],
)
def test_what_a_plugin_returns_is_held_to_its_spec(tiny_dir, tmp_path, capsys, summarize, compute, message):
    import plugin_probe

    changes = {"summarize": summarize} if summarize else {"compute": compute}
    registry.register(replace(plugin_probe.SPEC, **changes))
    try:
        code, _, err = _cli(capsys, *_run(tiny_dir, tmp_path / "r", "--probes", "cosine,resmax"))
    finally:
        registry.unregister("resmax")
    assert code == 2 and message in err and "internal error" not in err


# --- 4. params/ has a schema


def _checkout(tmp_path: Path, scale: str, common: str | None = None) -> Path:
    root = tmp_path / "checkout"
    shutil.copytree(Path(__file__).resolve().parents[1] / "params", root / "params")
    if common is not None:
        (root / "params" / "common.yml").write_text(common)
    (root / "params" / "scale.yml").write_bytes(scale.encode() if isinstance(scale, str) else scale)
    return root


SCALE = "title: t\nprofiles:\n  quick:\n    sets:\n      - name: one\n        models: [smollm2-135m]\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        (SCALE.replace("[smollm2-135m]", "smollm2-135m"), "profiles.quick.sets[0].models must be a list"),
        (SCALE.replace("models:", "modles:"), "sets[0].modles is not a known key"),
        (SCALE + "    defaults: {seed: 2001-12-14}\n", "defaults.seed must be a whole number"),
        (SCALE + "    defaults: {tasks: {task: gsm8k}}\n", "defaults.tasks must be a list"),
        (SCALE + "    defaults: {tasks: [{task: gsm8k, n: 1000001}]}\n", "tasks[0].n must be a whole number"),
        (SCALE + "    defaults: {dtype: float8}\n", "defaults.dtype must be one of"),
        (SCALE.replace("title: t", "title: t\nsets: [1]"), "sets is not a known key"),
        (SCALE.replace("name: one", "name: ../../x"), "must be a file name"),
        ("title: t\x00", "not valid YAML"),
        (b"title: \xff\xfe\n", "not UTF-8"),
        (
            "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
            "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n",
            "expands to more than",
        ),
    ],
)
@pytest.mark.parametrize("command", ["grid", "print-params"])
def test_params_that_break_the_schema_are_one_line_naming_file_and_key(tmp_path, capsys, text, expected, command):
    pytest.importorskip("papermill", reason="the grid reads the book's params")
    root = _checkout(tmp_path, text)
    argv = (
        ["grid", "quick", "--root", root, "--section", "scale", "--dry-run"]
        if command == "grid"
        else ["book", "--root", root, "--profile", "quick", "--print-params", "scale/one"]
    )
    started = time.monotonic()
    code, _, err = _cli(capsys, *argv)
    assert code == 2 and "params/scale.yml" in err and expected in err, err
    assert err.count("\n") == 1 and "internal error" not in err
    assert time.monotonic() - started < 30  # the alias bomb: refused before it expands


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_params_file_that_is_not_a_regular_file_is_named_so(tmp_path, capsys, kind):
    pytest.importorskip("papermill", reason="the grid reads the book's params")
    root = _checkout(tmp_path, SCALE)
    (root / "params" / "scale.yml").unlink()
    (os.mkfifo if kind == "fifo" else os.mkdir)(root / "params" / "scale.yml")
    with _deadline(20):
        code, _, err = _cli(capsys, "grid", "quick", "--root", root, "--section", "scale", "--dry-run")
    assert code == 2 and "params/scale.yml" in err and "missing" not in err


def test_the_params_schema_knows_every_template_parameter():
    from effdepth_book import params_schema

    templates = Path(__file__).resolve().parents[1] / "book" / "templates"
    from effdepth_book.sections import names

    for section in names():
        assert params_schema.section_keys(section) == params_schema.template_keys(templates / f"{section}.ipynb")


def test_every_injected_parameter_reaches_the_page_and_its_studies_are_the_grids():
    """papermill injects a set's parameters after the template's parameters cell; the page must see
    each of them (level_models once did not, and the difficulty page ran MATH cells the grid never
    planned) and then run exactly the studies ``effdepth grid`` plans for that set."""
    import json

    from effdepth_book import pages, runner, sections
    from effdepth_book.sections import plans

    root = Path(__file__).resolve().parents[1]
    for section in sections.names():
        notebook = json.loads((root / "book" / "templates" / f"{section}.ipynb").read_text())
        cell = next(c for c in notebook["cells"] if "parameters" in c["metadata"].get("tags", []))
        for profile in runner.PROFILES:
            for item in runner.parameter_sets(root, section, profile):
                namespace: dict = {}
                exec("".join(cell["source"]), namespace)
                namespace.update(item.parameters, bootstrap_seed=7)  # as papermill does, --bootstrap-seed too
                seen = pages.parameters(section, namespace)
                for key, value in {**item.parameters, "bootstrap_seed": 7}.items():
                    assert seen.get(key) == value, (section, item.name, key)
                page = pages.open_page(section, seen, cached_only=True, root=root)
                assert page.plans == {p.name: p for p in plans(section, item.parameters)}, (section, item.name)


def test_a_grid_whose_cells_are_all_unavailable_exits_non_zero(tmp_path, capsys, monkeypatch):
    pytest.importorskip("papermill", reason="the grid reads the book's params")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    common = "profiles:\n  quick:\n    tasks: [{task: addition, digits: 2, n: 1}]\n    results_dir: res\n"
    root = _checkout(tmp_path, SCALE.replace("smollm2-135m", "nobody/no-such-model-xyz"), common)
    code, out, _ = _cli(capsys, "grid", "quick", "--root", root, "--section", "scale", "--no-progress")
    assert code == 1 and "1 unavailable" in out


def test_an_empty_shard_is_an_error_not_the_whole_plan(tmp_path, capsys):
    pytest.importorskip("papermill", reason="the grid reads the book's params")
    root = _checkout(tmp_path, SCALE)
    code, _, err = _cli(capsys, "grid", "quick", "--root", root, "--shard", "", "--dry-run")
    assert code == 2 and "--shard" in err


# --- 5. executors fail fast


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1", "host:port", "ray://", "a b:1", "h:99999"])
def test_a_bad_or_unreachable_ray_address_is_one_line_in_bounded_time(address):
    from effdepth_book.executors import CONNECT_SECONDS, check_address

    started = time.monotonic()
    with pytest.raises(EffdepthError, match=r"--address|Ray cluster"):
        check_address(address)
    assert time.monotonic() - started < CONNECT_SECONDS + 5


def test_the_memory_check_compares_gib_with_gib():
    from effdepth_book.executors import _check_schedulable

    with pytest.raises(EffdepthError, match=r"1000.0 GiB of memory but the Ray cluster has 14.5 GiB"):
        _check_schedulable(
            [{"num_cpus": 1, "num_gpus": 0, "memory": 1000 << 30}], {"CPU": 2, "memory": 14.5 * (1 << 30)}
        )


# --- 6. a full disk: one line, nothing left behind, and the advice works


def test_a_library_wrapped_disk_error_is_the_disk_full_line(tmp_path):
    exc = pl.exceptions.ComputeError("failed to write: No space left on device (os error 28)")
    assert cache.is_disk_error(exc).errno == errno.ENOSPC


@pytest.mark.parametrize("fail_at", [1, 3, 5])
def test_a_full_disk_during_a_new_run_leaves_a_folder_that_resumes(tiny_dir, tmp_path, capsys, monkeypatch, fail_at):
    real = cache.create_exclusive
    calls = {"n": 0}

    def full_disk(path, mode=0o644):
        calls["n"] += 1
        if calls["n"] == fail_at:
            handle = real(path, mode)

            class Full:
                def __enter__(self):
                    return self

                def __exit__(self, *exc):
                    handle.close()

                def write(self, data):
                    raise OSError(errno.ENOSPC, "No space left on device")

            return Full()
        return real(path, mode)

    monkeypatch.setattr(cache, "create_exclusive", full_disk)
    out = tmp_path / "run"
    code, _, err = _cli(capsys, *_run(tiny_dir, out))
    assert code == 2 and "the disk is full" in err and err.count("\n") == 1
    assert not [p for p in (out.iterdir() if out.exists() else []) if "effdepth-tmp" in p.name]
    monkeypatch.setattr(cache, "create_exclusive", real)
    code, _, err = _cli(capsys, *_run(tiny_dir, out))  # the advice: free space and rerun
    assert code == 0, err


# --- 7. output: control characters from files are escaped


def test_nothing_printed_carries_a_control_character(tmp_path, capsys):
    hostile = tmp_path / "evil\x1b[31m\x07name"
    hostile.mkdir()
    code, _, err = _cli(capsys, "table", hostile)
    assert code == 2 and "\x1b" not in err and "\x07" not in err and "\\x1b" in err


def test_printable_escapes_newlines_in_values():
    from effdepth_core.terminal import printable

    assert printable("a\nb\x1b[0m\u2028") == "a\\x0ab\\x1b[0m\\u2028"
    assert printable("a\nb", keep="\n") == "a\nb"


# --- the hostile pass of this issue's own work (its closing note lists every case)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("title: t\nx: " + "[" * 20000 + "]" * 20000 + "\n", "nests too deeply"),
        ("title: t\ntitle: u\n", "names the key 'title' twice"),
        (SCALE + "      - name: one\n        models: [m]\n", "names a page another set"),
        ('title: "' + "a\\x07" * 100000 + '"\n', "…"),  # a 500 KB value is not echoed whole
    ],
)
def test_hostile_params_found_by_the_second_pass(tmp_path, capsys, text, expected):
    pytest.importorskip("papermill", reason="the grid reads the book's params")
    root = _checkout(tmp_path, text)
    code, _, err = _cli(capsys, "grid", "quick", "--root", root, "--section", "scale", "--dry-run")
    assert code == 2 and expected in err and len(err) < 1000 and "internal error" not in err


def test_a_deeply_nested_summary_is_skipped_not_a_crash(tmp_path, capsys):
    run = tmp_path / "lone"
    run.mkdir()
    (run / "effective_depth.json").write_text("[" * 100000 + "]" * 100000)
    code, _, err = _cli(capsys, "table", run)
    assert code == 2 and "internal error" not in err and "skipping" in err


def test_a_huge_task_file_is_refused_unread(tmp_path, capsys, tiny_dir):
    from effdepth_core import task_loading as tasks

    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as handle:
        handle.truncate(tasks.TASK_FILE_LIMIT + 1)  # sparse
    code, _, err = _cli(capsys, "run", "--model", tiny_dir, "--task", huge, "--out", tmp_path / "r", "--no-progress")
    assert code == 2 and "more than a task file can be" in err


def test_model_folders_others_can_write_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))
    path = zoo.model_path("smollm2-135m")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF")
    os.chmod(path.parent, 0o777)
    with pytest.raises(EffdepthError, match="writable by other users"):
        zoo.cache_state("smollm2-135m")
    os.chmod(path.parent, 0o755)


def test_book_check_names_each_stale_generated_file_and_findings_need_no_model(tmp_path, capsys, monkeypatch):
    pytest.importorskip("papermill", reason="the book's params")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = _checkout(tmp_path, (Path(__file__).resolve().parents[1] / "params" / "scale.yml").read_text())
    (root / "book").mkdir()
    code, out, _ = _cli(capsys, "book", "--check", "--profile", "quick", "--root", root)
    assert code == 1 and "_toc.yml is missing" in out and "book/_findings.md is missing" in out
    assert "book/using/api.md is missing" in out
    assert _cli(capsys, "book", "--toc-only", "--root", root)[0] == 0
    assert _cli(capsys, "book", "--findings-only", "--profile", "quick", "--root", root)[0] == 0
    code, out, _ = _cli(capsys, "book", "--check", "--profile", "quick", "--root", root)
    assert code == 1 and "_findings.md" not in out and "_toc.yml" not in out and "api.md" not in out
    import nbformat

    from effdepth_book.runner import page_inputs, parameter_sets
    from effdepth_book.sections import names

    pages = [item for section in names() for item in parameter_sets(root, section, "quick")]
    missing = [line for line in out.splitlines() if "is missing: execute it with" in line]
    assert len(missing) == len(pages) and "effdepth book --section scale --only " + pages[0].name in missing[0]
    for item in pages:  # as `effdepth book` stamps a page it executed
        page = nbformat.v4.new_notebook(metadata={"effdepth": {"inputs": page_inputs(root, item)}})
        (root / "book" / f"{item.page}.ipynb").parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(page, root / "book" / f"{item.page}.ipynb")
    code, out, _ = _cli(capsys, "book", "--check", "--profile", "quick", "--root", root)
    assert code == 0 and "match the code" in out
    template = root / "book" / "templates" / "scale.ipynb"
    template.parent.mkdir(parents=True, exist_ok=True)
    template.write_text(template.read_text() + " " if template.is_file() else "{}")  # the page's template changed
    code, out, _ = _cli(capsys, "book", "--check", "--profile", "quick", "--root", root)
    assert code == 1 and f"{pages[0].page}.ipynb is stale: re-execute it" in out
    code, out, _ = _cli(capsys, "book", "--check", "--no-pages", "--profile", "quick", "--root", root)
    assert code == 0 and "ipynb" not in out
    for item in pages:
        nbformat.write(
            nbformat.v4.new_notebook(metadata={"effdepth": {"inputs": page_inputs(root, item)}}),
            root / "book" / f"{item.page}.ipynb",
        )
    (root / "book" / "_findings.md").write_text((root / "book" / "_findings.md").read_text() + "edited\n")
    code, out, _ = _cli(capsys, "book", "--check", "--profile", "quick", "--root", root)
    assert code == 1 and "book/_findings.md is stale" in out and "_toc.yml" not in out
    api = root / "book" / "using" / "api.md"
    api.write_text(api.read_text().replace("def measure(", "def measured("))  # the reference edited by hand
    code, out, _ = _cli(capsys, "book", "--check", "--profile", "quick", "--root", root)
    assert code == 1 and "book/using/api.md is stale: regenerate it with `effdepth book --toc-only`" in out
    code, out, _ = _cli(capsys, "book", "--findings", "--profile", "quick", "--root", root, "--bootstrap-seed", "7")
    assert code == 0 and out.startswith("<!-- Generated by `effdepth book`") and "| question |" in out
    code, _, err = _cli(capsys, "book", "--bootstrap-seed", "7", "--root", root)
    assert code == 2 and "add --findings" in err


def test_a_gemma3_style_folder_matches_its_gguf_and_is_not_rebuilt_every_load():
    """Gemma 3's config keeps one rope_theta per attention type (rope_parameters.full_attention /
    .sliding_attention) and its tokenizer.json spells runs of spaces with "▁" where the GGUF has " ":
    neither is a mismatch (every load of gemma3-270m rebuilt its 1 GB folder), while another value
    or another token still is."""
    config = {"rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}}
    assert acquire._config_value(config, "rope_theta", 1e6) == 1e6
    assert acquire._config_value(config, "rope_theta", 1e4) == 1e4
    assert not acquire._same(acquire._config_value(config, "rope_theta", 5e5), 5e5)  # neither: a mismatch
    assert acquire._spaced("▁▁") == acquire._spaced("  ") and acquire._spaced("▁a") != acquire._spaced(" b")


def test_a_finished_bar_is_written_once_to_a_file():
    """Written to a log rather than a terminal, a bar whose steps each take longer than tqdm's
    default redraw interval (0.1 s) ends with one 100 % line, not a redraw at its last step and
    another at its close; a terminal still redraws at tqdm's default pace."""
    import io

    from effdepth_core.terminal import LOG_INTERVAL, progress_bar

    log = io.StringIO()
    bar = progress_bar(total=3, desc="probe", file=log)
    for _ in range(3):
        time.sleep(0.12)
        bar.update()
    bar.close()
    assert log.getvalue().count("100%") == 1 and "3/3" in log.getvalue()
    log = io.StringIO()  # steps longer than any interval: every step drawn, the end still once
    with progress_bar(total=2, file=log, mininterval=0) as bar:
        bar.update()
        bar.update()
    assert log.getvalue().count("100%") == 1 and log.getvalue().count("50%") == 1

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert progress_bar(total=1, file=Terminal()).mininterval < LOG_INTERVAL
