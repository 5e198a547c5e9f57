"""What a page's code is, for its freshness: the definitions its template's cells reach, name by name.

A page is stale when what it shows could change. Its numbers and text come from the functions its
cells call, so its code digest (``page_code``) holds the source of exactly those: starting from the
template's cells and its section's spec module (the page class and everything it defines), every
top-level definition of ``effdepth_core`` or ``effdepth_book`` a reached definition names — a
function, a class (whole: its methods are reached through instances), a module-level assignment —
is followed through imports, relative or absolute, a package's lazy exports (``_EXPORTS``) and
attribute chains on modules (``depth.primary_statistic``). A module used as a value (``getattr(charts,
name)``) counts whole, and so do a reached module's statements that run at import (an ``if`` block,
a call). A definition no page reaches — a new function in ``errors.py``, the command line's — is in
no page's digest, so editing it leaves every page fresh; editing a function a page calls (the depth
statistics its tables read) stales that page.

Left out, by design: the two registries (probes and sections are listed by name; a page counts its
own section's spec module), and a probe's own module, which counts by its name and ``revision`` (a
change that gives other numbers bumps the revision; a page reads the cached numbers).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path

import effdepth_core

from . import sections

# the packages whose definitions a page's code is followed through: the core and this book package
PACKAGES = {
    "effdepth_core": Path(effdepth_core.__file__).resolve().parent,
    "effdepth_book": Path(__file__).resolve().parent,
}
# the registries: name → module maps that list every probe and every section (names only)
REGISTRIES = (("effdepth_core", "measurement/registry.py"), ("effdepth_book", "sections/registry.py"))


@dataclass
class _Module:
    """One module's top-level definitions, what its imports bind, and what runs at import."""

    name: str  # dotted
    path: Path | None  # None: a template's cells
    text: str
    lines: list[str] = field(default_factory=list)
    defs: dict[str, list[ast.stmt]] = field(default_factory=dict)
    bindings: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # name → (module, attribute)
    at_import: list[ast.stmt] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)  # a package's lazy exports: name → submodule


def _file_of(module: str) -> Path | None:
    """The file of a dotted module name in one of ``PACKAGES``, or None."""
    package, *parts = module.split(".")
    root = PACKAGES.get(package)
    if root is None:
        return None
    candidates = [root.joinpath(*parts, "__init__.py")]
    if parts:
        candidates.append(root.joinpath(*parts[:-1], f"{parts[-1]}.py"))
    return next((candidate for candidate in candidates if candidate.is_file()), None)


def _dotted(path: Path) -> str:
    """``effdepth_core.measurement.depth`` for its file."""
    package, root = next((n, r) for n, r in PACKAGES.items() if r == path.parent or r in path.parents)
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join((package, *parts)).removesuffix(".__init__")


def module_name(path: Path) -> str:
    """``effdepth_core/measurement/probes/cosine.py``: a module file named by its package, the same on every machine."""
    package, root = next((n, r) for n, r in PACKAGES.items() if r in path.parents)
    return f"{package}/{path.relative_to(root).as_posix()}"


def _names_bound(node: ast.stmt) -> list[str]:
    """The names an assignment at module level binds."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _parse(name: str, path: Path | None, text: str) -> _Module:
    module = _Module(name, path, text, text.splitlines(keepends=True))
    try:
        tree = ast.parse(text)
    except SyntaxError:  # a notebook cell with a magic, say: nothing to follow there
        return module
    package = name if path is None or path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):  # imports anywhere (a function's own imports bind for its body)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    module.bindings[alias.asname] = (alias.name, None)
                else:
                    module.bindings.setdefault(alias.name.split(".")[0], (alias.name.split(".")[0], None))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            for alias in node.names:
                module.bindings[alias.asname or alias.name] = (base, alias.name)
    body = tree.body[1:] if tree.body and _is_docstring(tree.body[0]) else tree.body
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            module.defs.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for bound in _names_bound(node):
                module.defs.setdefault(bound, []).append(node)
            if isinstance(node, ast.Assign) and [_names_bound(node)] == [["_EXPORTS"]]:
                module.exports = _literal_exports(node.value)
        elif not isinstance(node, ast.Import | ast.ImportFrom):
            module.at_import.append(node)  # runs at import: an if block, a call, an assert
    return module


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _literal_exports(value: ast.expr) -> dict[str, str]:
    """A package's ``_EXPORTS = {"name": "submodule", ...}`` (its ``__getattr__`` loads them lazily)."""
    if not isinstance(value, ast.Dict):
        return {}
    pairs = zip(value.keys, value.values, strict=True)
    return {k.value: v.value for k, v in pairs if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}


def _references(node: ast.AST) -> list[tuple[tuple[str, ...], str]]:
    """The names ``node`` reads: (attribute chain, head name) pairs — ``depth.primary_statistic`` is
    (("primary_statistic",), "depth"), a bare name has no chain — in one pass over its tree."""
    found = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Attribute):
            chain = []
            inner = current
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name):
                found.append((tuple(reversed(chain)), inner.id))
            else:
                stack.append(inner)
            continue
        if isinstance(current, ast.Name):
            if isinstance(current.ctx, ast.Load):
                found.append(((), current.id))
            continue
        stack.extend(ast.iter_child_nodes(current))
    return found


@functools.cache
def _load(path: Path, text: str) -> _Module:
    """A module parsed once per text in a process: every page of a ``--check`` reads the same ones."""
    return _parse(_dotted(path), path, text)


class _Reach:
    """The walk: (module, name) pairs reached from the roots, and each reached definition's source."""

    def __init__(self) -> None:
        self.modules: dict[str, _Module | None] = {}
        self.done: set[tuple[str, str]] = set()
        self.whole: set[str] = set()
        self.resolving: set[tuple[str, str]] = set()
        self.code: dict[str, bytes] = {}
        self.probes: dict[str, str] = {}
        self.registries = {PACKAGES[package] / path for package, path in REGISTRIES}

    def module(self, name: str) -> _Module | None:
        """A module of the packages by dotted name (None: outside them, a registry or a probe)."""
        if name not in self.modules:
            self.modules[name] = None
            path = _file_of(name)
            if path is None or path in self.registries:
                return None
            content = path.read_bytes()
            spec = _probe_revision(path, content)
            if spec is not None:
                self.probes[spec[0]] = spec[1]
                return None
            module = _load(path, content.decode("utf-8"))
            self.modules[name] = module
            for index, node in enumerate(module.at_import):  # what runs when it is imported
                self.statement(module, f"<import {index}>", node)
        return self.modules[name]

    def statement(self, module: _Module, name: str, node: ast.stmt) -> None:
        """Record ``node``'s source under ``module::name`` and follow every name it uses."""
        key = f"{module_name(module.path) if module.path else module.name}::{name}"
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])  # decorators too
        source = "".join(module.lines[start - 1 : node.end_lineno])
        self.code[key] = self.code.get(key, b"") + source.encode() + b"\0"
        for chain, head in _references(node):
            target = self.name(module, head)
            if chain:
                for attribute in chain:
                    if target is None:
                        break
                    target = self.attribute(target, attribute)
            elif target is not None:
                self.everything(target)  # a module used as a value: any of its names may be read

    def name(self, module: _Module, name: str) -> _Module | None:
        """Reach ``name`` as ``module`` binds it; the module it is, if it is one."""
        if (module.name, name) in self.resolving:  # an import that names itself (a package and its submodule)
            return None
        self.resolving.add((module.name, name))
        try:
            return self._name(module, name)
        finally:
            self.resolving.discard((module.name, name))

    def _name(self, module: _Module, name: str) -> _Module | None:
        if name in module.defs:
            self.define(module, name)
            return None
        if name in module.bindings:
            target, attribute = module.bindings[name]
            if attribute is None:
                return self.module(target)
            if attribute == "*":
                found = self.module(target)
                if found is not None:
                    self.everything(found)
                return None
            owner = self.module(target)
            if owner is None:
                return self.module(f"{target}.{attribute}")
            return self.attribute(owner, attribute)
        return None

    def attribute(self, module: _Module, attribute: str) -> _Module | None:
        """``module.attribute``: a definition there, what it imports under that name, a lazy export or
        a submodule (returned, to follow the chain on)."""
        if attribute in module.defs or attribute in module.bindings:
            found = self.name(module, attribute)
            if found is not None or attribute in module.defs:
                return found
        if attribute in module.exports:
            owner = self.module(f"{module.name}.{module.exports[attribute]}")
            return self.attribute(owner, attribute) if owner is not None else None
        return self.module(f"{module.name}.{attribute}")

    def define(self, module: _Module, name: str) -> None:
        if (module.name, name) in self.done:
            return
        self.done.add((module.name, name))
        for node in module.defs[name]:
            self.statement(module, name, node)

    def everything(self, module: _Module) -> None:
        if module.name in self.whole:
            return
        self.whole.add(module.name)
        for name in list(module.defs):
            self.define(module, name)


def page_code(template: Path) -> list[tuple[str, bytes]]:
    """The code a page runs, as (name, content) pairs in a stable order: the source of every
    definition its template's cells and its section's spec module (whole: the page class the cells
    call) reach (``module::name``), and each probe the walk meets as ``probe:<name>`` and its revision."""
    import json

    from effdepth_core.cache import read_regular
    from effdepth_core.errors import EffdepthError

    sources = []
    try:
        notebook = json.loads(read_regular(template).decode("utf-8"))
        sources = ["".join(c.get("source", "")) for c in notebook.get("cells", []) if c.get("cell_type") == "code"]
    except (OSError, EffdepthError, ValueError):
        pass
    walk = _Reach()
    cells = [_parse(f"<template {template.stem}>", None, text) for text in sources]
    bindings = {name: target for cell in cells for name, target in cell.bindings.items()}
    defs: dict[str, list[ast.stmt]] = {}
    for cell in cells:  # one namespace: a name a cell imports or defines is the next cells' too
        for name, nodes in cell.defs.items():
            defs.setdefault(name, []).extend(nodes)
    for cell in cells:  # every statement of a cell runs: each is a root
        roots = [*cell.at_import, *(node for nodes in cell.defs.values() for node in nodes)]
        cell.bindings, cell.defs = bindings, {name: [] for name in defs}  # its own: walked as roots
        for node in roots:
            walk.statement(cell, "<cell>", node)
    section = template.stem
    spec_module = sections.BUILTIN.get(section) or (
        sections.get(section).page.__module__ if section in sections.names() else None
    )
    if spec_module is not None:  # the page class and what it calls: reached through the registry's text
        module = walk.module(spec_module)
        if module is not None:
            walk.everything(module)
    code = [(key, walk.code[key]) for key in sorted(walk.code) if not key.startswith("<template")]
    return code + [(f"probe:{name}", revision.encode()) for name, revision in sorted(walk.probes.items())]


def _probe_revision(path: Path, content: bytes) -> tuple[str, str] | None:
    """(name, revision) of a probe's own module (one that declares ``SPEC = ProbeSpec(``), else None."""
    if path.parent.name != "probes" or b"\nSPEC = ProbeSpec(" not in content:
        return None
    from effdepth_core.measurement import registry

    for name, spec in registry.specs().items():
        if spec.compute.__module__ == f"effdepth_core.measurement.probes.{path.stem}" or name == path.stem:
            return name, str(spec.revision)
    return path.stem, "unregistered"
