"""Every code block of README and of the book's guide (``book/using/``) runs as written, so the docs
cannot rot: a ``bash`` block in a scratch folder (the checkout's ``params/`` and ``book/`` linked in,
read only), a ``python`` block in a fresh interpreter, both offline on the cached default model. A
block that cannot run here is marked just above it with ``<!-- not-run: why -->`` (it needs the hub
or a GPU, or computes for hours) or with the marker of the CI step that runs it; the reason is
printed as the skip's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the guide's pages, less the generated API reference (its blocks are signatures, checked by test_api.py)
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "book" / "using").glob("*.md") if p.name != "api.md")]
RUN_ELSEWHERE = {  # blocks another step runs, by their marker
    "setup-command": ".ci/run runs README's set-up command",
    "test-command": ".ci/run runs README's test command",
    "slow-command": ".ci/run runs README's slow-test command once",
    "book-command": ".ci/run runs README's book command",
    "papermill-command": "tests/test_book_browser.py runs the papermill command",
}
MARK = re.compile(r"^<!-- (?:not-run: (?P<why>.+?)|(?P<step>[a-z-]+)) -->$")
FENCE = re.compile(r"^```(\S*)\s*$")
OUTPUT_ONLY = ("text",)  # a sample of what a command prints, not a command


def code_blocks(path: Path) -> list[tuple[int, str, str, str | None]]:
    """(line, language, code, why it is not run here or None) of each fenced block of ``path``."""
    blocks, lines = [], path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        start, language = i, opening.group(1)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.match(before)
        why = None
        if mark:
            why = mark.group("why") or RUN_ELSEWHERE.get(mark.group("step") or "")
            assert why, f"{path.name}:{start + 1}: unknown marker {before}"
        blocks.append((start + 1, language, "\n".join(lines[start + 1 : end]), why))
        i = end + 1
    return blocks


BLOCKS = [(path, *block) for path in DOCS for block in code_blocks(path)]


def test_the_docs_have_runnable_blocks_and_every_other_block_says_why():
    assert len(DOCS) >= 10, DOCS  # README and the guide's pages
    runnable = [b for b in BLOCKS if b[2] in ("bash", "python") and b[4] is None]
    assert len(runnable) >= 10
    for path, line, language, _, why in BLOCKS:
        assert language in ("bash", "python", *OUTPUT_ONLY), f"{path.name}:{line}: a ```{language} block"
        if why is not None:
            assert len(why) > 10, f"{path.name}:{line}: say why the block is not run here"


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A folder where commands run as in a checkout: params/, book/ and _toc.yml linked in (effdepth
    reads them there; no block writes into them)."""
    for name in ("params", "book", "_toc.yml", "pyproject.toml"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def _marks(code: str) -> list:
    """A block that loads a model (the default one, by name) takes 10-60 s: slow (run once, in CI's locked run)."""
    return [pytest.mark.real_model, pytest.mark.slow] if "smollm2-135m" in code else []


@pytest.mark.parametrize(
    ("path", "line", "language", "code", "why"),
    [
        pytest.param(*b, id=f"{b[0].relative_to(ROOT)}:{b[1]}", marks=_marks(b[3]))
        for b in BLOCKS
        if b[2] in ("bash", "python")
    ],
)
def test_a_docs_code_block_runs_as_written(path, line, language, code, why, scratch, smollm2):  # fetched once
    if why is not None:
        pytest.skip(f"{path.relative_to(ROOT)}:{line}: {why}")
    bin_dir = str(Path(sys.executable).parent)  # `effdepth` and `python` of this environment
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
    before = {p.name for p in ROOT.iterdir()}
    done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (
        f"{path.relative_to(ROOT)}:{line} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    )
    assert {p.name for p in ROOT.iterdir()} == before  # nothing landed in the checkout


@pytest.mark.real_model
@pytest.mark.slow
def test_readme_shows_what_its_set_up_command_prints(tmp_path, smollm2, capsys):  # ~1 min on 2 cores
    """The sample under README's set-up command is that command's own output, table and legends."""
    import shlex

    from effdepth_core.cli import main

    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    setup = next(
        code for line, language, code, why in code_blocks(ROOT / "README.md") if why == RUN_ELSEWHERE["setup-command"]
    )
    argv = shlex.split(setup.split("&&")[-1].strip())
    assert argv[0].endswith("effdepth") and argv[1] == "run"
    start = next(i for i, text in enumerate(readme) if text.startswith("Its run prints"))
    opening = next(i for i in range(start, len(readme)) if readme[i].startswith("```text"))
    closing = next(i for i in range(opening + 1, len(readme)) if readme[i].startswith("```"))
    shown = [text.rstrip() for text in readme[opening + 1 : closing]]
    capsys.readouterr()
    assert main([*argv[1:], "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    printed = [text.rstrip() for text in capsys.readouterr().out.strip().splitlines()]
    # the last line names the run folder: README's is the default one, this test's is --out
    assert printed[-1] == f"results in {tmp_path / 'run'}/" and shown[-1].startswith("results in results/")
    assert printed[:-1] == shown[:-1], "README's sample output differs from what its set-up command prints now"


@pytest.mark.real_model
@pytest.mark.slow
def test_the_guides_notebook_is_kept_clean_and_runs(tmp_path, smollm2):  # ~30 s
    """book/using/notebook.ipynb is kept without outputs (they belong to executed copies) and runs
    top to bottom as `jupyter nbconvert --execute` runs it: every code cell gives an output, none an
    error, and none prints a machine's path."""
    import nbformat
    from nbclient import NotebookClient

    path = ROOT / "book" / "using" / "notebook.ipynb"
    committed = nbformat.read(path, as_version=4)
    code = [cell for cell in committed.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code), "strip its outputs"
    where = {"metadata": {"path": str(tmp_path)}}
    NotebookClient(committed, timeout=600, kernel_name="python3", resources=where).execute()
    outputs = [cell.outputs for cell in committed.cells if cell.cell_type == "code"]
    assert all(outputs), "a code cell gave no output"
    assert not [o for cell in outputs for o in cell if o.output_type == "error"]
    assert str(Path.home()) not in nbformat.writes(committed)


def test_the_probe_list_a_reader_is_sent_to_is_the_registrys():
    """book/using/cli.md sends the reader to ``effdepth run --help`` for the probes, and that help
    lists every registered probe in the registry's order with its default: no hand-kept list."""
    import contextlib
    import io

    from effdepth_core.cli_args import build_parser
    from effdepth_core.measurement import registry

    page = (ROOT / "book" / "using" / "cli.md").read_text()
    assert "`effdepth run --help` lists them" in page and f"(default: `{','.join(registry.DEFAULT)}`)" in page
    assert not any(f"`{','.join(registry.names()[:3])}" in line for line in page.splitlines())  # no copy
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        build_parser().parse_args(["run", "--help"])
    listed = " ".join(text.getvalue().split("--probes PROBES", 2)[-1].split())
    assert (
        f"comma list of {', '.join(registry.names())} (each described below; `effdepth probes` lists them) " in listed
    )
    assert f"(default: {','.join(registry.DEFAULT)})" in listed
