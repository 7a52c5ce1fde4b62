"""The import-layer contract: every import between capscore's packages points down a layer, so there are no
circles and nothing below the command line imports it (function-level imports count; TYPE_CHECKING ones do not).

Layers, bottom first; a package may import its own layer's helpers only where listed in SAME_LAYER_OK.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import capscore

ROOT = Path(capscore.__file__).parent

LAYERS = [
    {"errors"},  # one-line errors
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
    {"commands", "cli", "__init__"},  # the command line (and the package's own re-exports)
]
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}
SAME_LAYER_OK = {("integrations", "api"), ("probes", "meta"), ("train", "probes"), ("scores", "perturb"),
                 ("cli", "commands"), ("__init__", "api"), ("meta", "probes")}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def import_edges() -> dict[str, set[tuple[str, str]]]:
    """package -> {(imported package, 'file:line')} for every capscore import outside TYPE_CHECKING blocks."""
    edges: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        src = _unit(".".join(parts)) if len(parts) > 1 else "__init__"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
            node.test) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "capscore":
                targets = [node.module] if node.module != "capscore" else [f"capscore.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "capscore"]
            for t in targets:
                dst = _unit(t)
                if dst != src and dst != "__version__":
                    edges[src].add((dst, f"{path.relative_to(ROOT.parent)}:{node.lineno}"))
    return edges


def test_every_package_has_a_layer():
    packages = {p.name if p.is_dir() else p.stem for p in ROOT.iterdir()
                if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py")}
    assert packages - set(LAYER_OF) == set()


def test_imports_point_down_the_layers():
    upward = []
    for src, targets in import_edges().items():
        for dst, where in targets:
            if LAYER_OF[dst] > LAYER_OF[src] or (LAYER_OF[dst] == LAYER_OF[src] and (src, dst) not in SAME_LAYER_OK):
                upward.append(f"{where}: {src} imports {dst}")
    assert not upward, "imports that run up (or across) a layer:\n" + "\n".join(sorted(upward))


def test_no_circles_between_packages():
    graph = {src: {dst for dst, _ in targets} for src, targets in import_edges().items()}

    def reach(start):
        seen, todo = set(), list(graph.get(start, ()))
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo += graph.get(n, ())
        return seen

    in_circles = sorted(n for n in graph if n in reach(n))
    assert not in_circles, f"packages on an import circle: {in_circles}"
