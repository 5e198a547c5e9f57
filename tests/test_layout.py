"""The design, checked: imports run one way (models → trace/replay → probes → results → cli/book),
the core never imports the book package (``effdepth_book``, beside it), and the command line starts without torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "effdepth_core"


def _layer_map(text: str, start: str = "The layers import one way", block: int = 0) -> dict[str, int]:
    """module → layer from a table of docs/design.md (the ``block``-th fenced block after ``start``):
    rows ``N name name …  description``; a row without a number continues the one above."""
    block_text = text.split(start, 1)[1].split("```")[1 + 2 * block]
    layers = {}
    for row in block_text.splitlines():
        match = re.match(r"(\d+) ((?:[a-z_]+ )+) ", row + " ")
        if match:
            layers.update(dict.fromkeys(match.group(2).split(), int(match.group(1))))
    return layers


# lower layers never import higher ones (modules of one layer may import each other): the two maps,
# in docs/design.md, read here so the documented layers are the checked ones — the core's floors, and
# the measurement layer's own floors (effdepth_core/measurement/)
DESIGN = (PACKAGE.parent / "docs" / "design.md").read_text()
LAYERS = _layer_map(DESIGN)
MEASURE_LAYERS = _layer_map(DESIGN, block=1)
MEASURE = LAYERS["measurement"]
FOUNDATION = {name for name, layer in LAYERS.items() if layer < MEASURE}


# The doors from the core to the book layer: `effdepth book` (the papermill runner), `effdepth plot`
# (the charts) and `effdepth grid` import it inside their command functions, after checking the [book] extra.
BOOK_ENTRIES = {
    ("effdepth_core.cli", "effdepth_book.runner"),
    ("effdepth_core.cli", "effdepth_book"),
    ("effdepth_core.cli", "effdepth_book.grid"),  # `effdepth grid`: the book's cells from params/
    ("effdepth_core.cli", "effdepth_book.executors"),  # `effdepth grid --executor ray`
    ("effdepth_core.api", "effdepth_book"),  # measure(...).plot(): a chart in a notebook
}


def _layer(module: str) -> tuple[int, int]:
    """Layer of ``effdepth_core.x.y`` (by its first part below the package; within the measurement
    layer, by its part below ``measure`` too): compared as (floor of the core, floor within measure)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1].startswith("__"):  # the package itself (lazy exports, __version__)
        return (-1, 0)
    if parts[1] == "measurement" and len(parts) > 2 and not parts[2].startswith("__"):
        return (LAYERS["measurement"], MEASURE_LAYERS[parts[2]])  # a KeyError: a new module needs its floor
    return (LAYERS[parts[1]], 0)  # a KeyError: a new module needs its layer in LAYERS


def _imports(path: Path) -> set[str]:
    """effdepth_core modules imported anywhere in ``path`` (function-level imports included)."""
    return _imports_of_tree(ast.parse(path.read_text()), path)


def _modules_of(folder: Path) -> set[str]:
    """A package folder's modules and subpackages, by name."""
    modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("__")}
    return modules | {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}


def test_the_documented_layer_map_names_every_core_module_once():
    modules = _modules_of(PACKAGE)
    assert set(LAYERS) == modules, (
        f"docs/design.md's layer map: missing {modules - set(LAYERS)}, stale {set(LAYERS) - modules}"
    )
    measured = _modules_of(PACKAGE / "measurement")
    assert set(MEASURE_LAYERS) == measured, (
        f"docs/design.md's map of the measurement layer: missing {measured - set(MEASURE_LAYERS)}, "
        f"stale {set(MEASURE_LAYERS) - measured}"
    )
    assert not set(LAYERS) & set(MEASURE_LAYERS), "a module named in both maps"
    assert _layer_map("The layers import one way\n```\n0 a b   x\n    c\n1 d  y\n```") == {"a": 0, "b": 0, "d": 1}


def test_every_module_opens_with_a_line_that_says_its_job():
    # the contributor's map, module by module: every module of either package opens with a
    # docstring whose first line says what it is for
    for root in (PACKAGE, PACKAGE.parent / "effdepth_book"):
        for path in sorted(root.rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            first = doc.strip().splitlines()[0] if doc.strip() else ""
            assert len(first.split()) >= 4, f"{path.relative_to(PACKAGE.parent)} opens with no line saying its job"


def _upward_imports(path: Path) -> list[str]:
    """The imports of ``path`` (a module of the core) that run up the floors."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    if module == "effdepth_core":
        return []
    own = _layer(module)
    found = []
    for target in _imports(path):
        if target == "effdepth_core" or target.startswith("effdepth_book"):  # __version__; the book: below
            continue
        if _layer(target) > own:
            found.append(f"{module} (layer {own}) imports {target} (layer {_layer(target)})")
    return found


def _measurement_leaks(path: Path) -> list[str]:
    """What a module of the measurement layer imports from outside it and the foundation: the run
    store, the command line, acquisition, the book (function-level imports count: they run)."""
    leaks = []
    for target in _imports(path):
        parts = target.split(".")
        if target.startswith("effdepth_book"):
            leaks.append(target)
        elif len(parts) > 1 and parts[1] != "measurement" and parts[1] not in FOUNDATION:
            leaks.append(target)
    return leaks


def test_the_measurement_layer_imports_nothing_above_it():
    for path in sorted((PACKAGE / "measurement").rglob("*.py")):
        leaks = _measurement_leaks(path)
        assert not leaks, f"{path.relative_to(PACKAGE.parent)} imports above the measurement layer: {leaks}"


def test_an_upward_import_from_the_measurement_layer_is_caught(tmp_path):
    # the demonstration: a probe that reaches the run store (or a function-level import of the book)
    # fails both the floors test and the measurement layer's own test
    bad = tmp_path / "effdepth_core" / "measurement" / "probes" / "cosine.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from ...results import run\n\n\ndef f():\n    from effdepth_book import plots\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "effdepth_core"
    try:
        assert sorted(_measurement_leaks(bad)) == ["effdepth_book", "effdepth_core.results"]
        assert any("effdepth_core.results" in line for line in _upward_imports(bad))
        within = tmp_path / "effdepth_core" / "measurement" / "trace.py"
        within.write_text("from .probes import cosine\n")  # floor 5 reaching floor 7 of the same layer
        assert _upward_imports(within)
    finally:
        PACKAGE = saved


def test_every_module_has_a_layer_and_imports_only_downwards():
    for path in sorted(PACKAGE.rglob("*.py")):
        upward = _upward_imports(path)
        assert not upward, upward[0]


def test_the_core_never_imports_the_book_package():
    assert not (PACKAGE / "book").exists()  # the report's code lives in effdepth_book, beside the core
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        book = [t for t in _imports(path) if t.startswith("effdepth_book") and (module, t) not in BOOK_ENTRIES]
        assert not book, f"{module} imports the book package: {book}"
        tree = ast.parse(path.read_text())
        top_level = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        top_level |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in top_level if m.startswith("effdepth_book")}, f"{module}: the door is inside a function"


def test_a_book_import_in_the_core_is_caught(tmp_path):
    bad = tmp_path / "effdepth_core" / "results.py"
    bad.parent.mkdir()
    bad.write_text("def f():\n    from effdepth_book import study\n")
    assert "effdepth_book" in _imports_of(bad, tmp_path)


def test_the_book_package_reaches_the_core_only_through_its_modules():
    # effdepth_book is a client of the core: it imports core modules by their absolute names and is
    # never reached by a relative import that climbs out of it
    book = PACKAGE.parent / "effdepth_book"
    for path in sorted(book.rglob("*.py")):
        depth = len(path.relative_to(book).parts)  # a module of effdepth_book/sections/ may climb one level
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= depth, f"{path.name}: a relative import out of effdepth_book"


def _module_exists(target: str) -> bool:
    """Whether ``target`` is a module, or a name its parent module defines (``from . import x``)."""
    import importlib
    import importlib.util

    try:
        if importlib.util.find_spec(target) is not None:
            return True
    except ModuleNotFoundError:
        return False
    parent, _, name = target.rpartition(".")
    return bool(parent) and hasattr(importlib.import_module(parent), name)


def test_every_import_in_either_package_names_a_module_that_exists():
    # function-level imports run only when called: a moved module's stale relative import would
    # otherwise surface as an internal error in the one command that reaches it
    for root in (PACKAGE, PACKAGE.parent / "effdepth_book"):
        for path in sorted(root.rglob("*.py")):
            for target in _imports_of_tree(ast.parse(path.read_text()), path):
                assert _module_exists(target), f"{path.relative_to(PACKAGE.parent)} imports {target}: no such module"
    assert not _module_exists("effdepth_book.rundir")  # the one a move left behind once


def test_a_higher_import_is_caught(tmp_path):
    bad = tmp_path / "effdepth_core" / "trace.py"
    bad.parent.mkdir()
    bad.write_text("from .results import run\n")
    assert "effdepth_core.results" in _imports_of(bad, tmp_path)


def _imports_of(path: Path, root: Path) -> set[str]:
    global PACKAGE
    saved, PACKAGE = PACKAGE, root / "effdepth_core"
    try:
        return _imports(path)
    finally:
        PACKAGE = saved


def test_the_command_line_starts_without_torch():
    code = (
        "import sys; from effdepth_core.cli import build_parser; build_parser().format_help(); "
        "print(sorted(m for m in ('torch', 'transformers', 'polars', 'altair', 'papermill') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def _strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_outside_probes_and_the_book_no_core_module_names_a_probe():
    # a probe is its spec: the orchestrator, cache, settings, table and command line learn of it from
    # the registry, whose one line per built-in probe is the only place its name stands outside probes/
    from effdepth_core.measurement import registry

    names = set(registry.BUILTIN)
    for spec in registry.specs().values():
        names |= set(spec.frames) | {rule.key for rule in spec.rules}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if parts[:2] == ("measurement", "probes") or path.name in ("registry.py", "__init__.py"):
            continue  # __init__ exports the probe functions of the Python API by name
        for line, text in _strings(path):
            assert not (names & set(text.replace(",", " ").split())), f"{path.name}:{line} names a probe: {text!r}"


def _all_imports(path: Path) -> set[str]:
    return _imports_of_tree(ast.parse(path.read_text()), path)


def _imports_of_tree(tree: ast.AST, path: Path) -> set[str]:
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                names = [f"{target}.{a.name}" for a in node.names] if not node.module else [target]
            else:
                names = [node.module or ""]
            found.update(n for n in names if n.startswith(("effdepth_core", "effdepth_book")))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(("effdepth_core", "effdepth_book")))
    return found


def test_within_a_layer_imports_form_no_cycle():
    # modules of one layer may import each other (the probes share the lens and the answer split),
    # but never in a circle: every module can be read knowing only what it imports (annotation-only
    # imports under `if TYPE_CHECKING:` count too: a circle of types is a circle of knowledge)
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        graph[module] = {t for t in _all_imports(path) if t.startswith("effdepth_core.")} - {module}
    modules = set(graph)
    graph = {m: {t for t in targets if t in modules} for m, targets in graph.items()}

    def visit(module: str, path: tuple[str, ...]) -> None:
        for target in graph[module]:
            assert target not in path, f"import cycle: {' → '.join((*path, module, target))}"
            if target not in done:
                visit(target, (*path, module))
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, ())


def test_the_probes_api_names_stay_functions_after_every_probe_module_loaded():
    # a probe module named like a function the package exports (logit_lens) replaces that name on
    # the package when it is first imported, unless the package imported it before binding the name
    import types

    import effdepth_core.measurement.probes as probes
    from effdepth_core.measurement import registry

    registry.specs()  # imports every probe module
    for name in probes.__all__:
        assert not isinstance(getattr(probes, name), types.ModuleType), (
            f"effdepth_core.measurement.probes.{name} is a module"
        )


def test_the_public_api_is_discoverable_and_typed():
    import pydoc

    import effdepth_core

    assert set(effdepth_core.__all__) <= set(dir(effdepth_core))  # tab completion sees the lazy names
    for name in effdepth_core.__all__:
        assert getattr(effdepth_core, name) is not None
    assert "integrated_gradients" in pydoc.render_doc(effdepth_core)
    assert (PACKAGE / "py.typed").is_file()  # PEP 561: type checkers read the hints


def test_every_public_function_documents_its_arguments_and_its_return():
    """The public API's docstrings give Args (naming every parameter) and Returns, as tuned-lens's do."""
    import inspect

    import effdepth_core

    missing = []
    for name in effdepth_core.__all__:
        function = getattr(effdepth_core, name)
        if inspect.isclass(function):
            continue
        doc = inspect.getdoc(function) or ""
        args = doc.partition("Args:")[2].partition("Returns:")[0]
        for parameter in inspect.signature(function).parameters:
            if not re.search(rf"(^|[\s,*]){re.escape(parameter)}[,:]", args, re.M):
                missing.append(f"{name}: {parameter}")
        if "Returns:" not in doc:
            missing.append(f"{name}: Returns")
    assert not missing, missing


def test_the_measurement_layer_stays_under_8000_lines():
    # issue 48's bound on the measurement floor (every line of its .py files, blank ones included):
    # what does not measure (the run store, the public activation cache, the command line) lives above it
    lines = sum(len(p.read_text().splitlines()) for p in (PACKAGE / "measurement").rglob("*.py"))
    assert lines < 8000, f"effdepth_core/measurement/ has {lines} lines; move what does not measure above it"
