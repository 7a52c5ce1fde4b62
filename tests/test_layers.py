"""The import contract, file by file: no module of capscore imports itself back through other modules (no
circles between files), and every import between capscore's packages points down a layer, so nothing below
the command line imports it.

Every ``import`` / ``from ... import`` of a capscore module counts, at module level and inside functions
alike (a function-local import is deferred, not absent: it would close a circle the first time it runs);
ones under ``if TYPE_CHECKING:`` do not (they never run). Function-local imports are left only on the
start-up path (``capscore/__init__.py``, ``cli.py``, ``commands/*``) and where the imported module would add
torch, numpy, scipy, open_clip or an optional extra to a module that is free of it at import; ruff's PLC0415
keeps the rest at the top (each exception says ``# noqa: PLC0415  (deferred: ...)``).
A package's ``__init__`` is a file like the others; importing ``capscore.a.b`` is an edge to ``capscore.a.b``
only (not to the package ``capscore.a`` that Python runs first), and ``from capscore.a import b`` is an edge
to the module ``capscore.a.b`` where there is one, else to the submodule named for ``b`` in the package's
``_WHERE`` table (the names its ``__init__`` resolves on first use, PEP 562), else to ``capscore.a``.

Layers, bottom first; a package may import its own layer's helpers only where listed in SAME_LAYER_OK.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import capscore

ROOT = Path(capscore.__file__).parent

LAYERS = [
    {"errors", "_version"},  # one-line errors; the installed version
    {"_log", "_optional", "_table"},  # logging, optional imports, the text table printer
    {"data", "nlp"},  # records, media references and the readers of every input format; the spaCy loader
    {"validate"},  # argument checks of the Python faces
    {"backbones"},  # model specs and adapters
    {"embed"},  # the encoding engine: batching, device/dtype, cache
    {"scores", "perturb", "scenes", "report"},  # metric formulas and registry; perturbations; scenes; rows I/O
    {"pipeline"},  # the one scoring loop
    {"meta", "probes", "train"},  # consumers of scores
    {"engines"},  # where block functions run
    {"api", "integrations"},  # Python faces
    {"commands", "cli", "__init__", "__main__"},  # the command line (and the package's own re-exports; python -m)
]
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}
SAME_LAYER_OK = {("integrations", "api"), ("probes", "meta"), ("train", "probes"), ("scores", "perturb"),
                 ("cli", "commands"), ("__init__", "api"), ("meta", "probes"), ("__main__", "cli")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _lazy_names() -> dict[tuple[str, str], str]:
    """(package, name) -> the submodule that defines it, from each package's ``_WHERE = {name: submodule}``."""
    found = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                    and any(isinstance(t, ast.Name) and t.id == "_WHERE" for t in node.targets)):
                for k, v in zip(node.value.keys, node.value.values):
                    found[(module, k.value)] = f"{module}.{v.value}"
    return found


LAZY = _lazy_names()


def _unit(module: str) -> str:
    """The package (or top-level module) of ``capscore.x.y``: ``x``; the package root itself: ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _existing(name: str) -> str:
    while name not in MODULES:
        name = name.rsplit(".", 1)[0]
    return name


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [_existing(a.name) for a in node.names if a.name.split(".")[0] == "capscore"]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: resolve against the importing module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
    if base.split(".")[0] != "capscore":
        return []
    return [_existing(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else LAZY.get((base, a.name), base))
            for a in node.names]


def file_edges() -> dict[str, set[tuple[str, str]]]:
    """module -> {(imported capscore module, 'file:line')} for every import outside ``if TYPE_CHECKING:``."""
    edges: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
            node.test) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            for target in _targets(node, module, path.name == "__init__.py"):
                if target != module:
                    edges[module].add((target, f"{path.relative_to(ROOT.parent)}:{node.lineno}"))
    return edges


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_every_package_has_a_layer():
    packages = {p.name if p.is_dir() else p.stem for p in ROOT.iterdir()
                if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py")}
    assert packages - set(LAYER_OF) == set()


def test_the_graph_sees_function_local_and_relative_imports():
    """the parser the other tests rely on: relative, function-local and lazily re-exported names resolve to the
    file that runs"""
    tree = ast.parse("from . import records\nfrom ..errors import InputError\ndef f():\n"
                     "    import capscore.scores.metric\n    from capscore.embed import factory\n"
                     "    from capscore.backbones import Backbone\n")
    found = [t for node in ast.walk(tree) for t in _targets(node, "capscore.data.images", False)]
    assert found == ["capscore.data.records", "capscore.errors", "capscore.scores.metric", "capscore.embed.factory",
                     "capscore.backbones.base"]


def test_no_circles_between_files():
    graph = {src: {dst for dst, _ in targets} for src, targets in file_edges().items()}
    circles = _circles(graph)
    assert not circles, "modules on an import circle:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_imports_point_down_the_layers():
    upward = []
    for src, targets in file_edges().items():
        for dst, where in targets:
            a, b = _unit(src), _unit(dst)
            if a == b:
                continue
            if LAYER_OF[b] > LAYER_OF[a] or (LAYER_OF[b] == LAYER_OF[a] and (a, b) not in SAME_LAYER_OK):
                upward.append(f"{where}: {src} imports {dst}")
    assert not upward, "imports that run up (or across) a layer:\n" + "\n".join(sorted(upward))


def test_no_circles_between_packages():
    graph: dict[str, set[str]] = defaultdict(set)
    for src, targets in file_edges().items():
        graph[_unit(src)] |= {_unit(dst) for dst, _ in targets} - {_unit(src)}
    assert _circles(graph) == []
