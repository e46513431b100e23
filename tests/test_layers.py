"""The package's imports point down the layer order of DESIGN.md ("Layout") and never form a
cycle, counting imports inside functions too (only function-level imports once kept a cycle
of 24 modules from crashing at import time). Read from the source with `ast`; nothing is
imported."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a module may import its own layer or lower ones, never a higher one
LAYER = {"cli": 9, "ablate": 8, "diagnostics": 8, "train": 7, "evaluation": 6, "rollout": 5,
         "context": 4, "envs": 3, "engines": 3, "models": 3, "config": 2, "methods": 2,
         "credit": 2, "losses": 2, "metrics": 2, "reporting": 2, "registry": 1, "types": 1,
         "errors": 1}


def modules(root: Path, package: str = "agentrl_cli") -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package (a package is its __init__)."""
    out = {}
    for f in (root / package).rglob("*.py"):
        name = ".".join(f.relative_to(root).with_suffix("").parts)
        out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = f
    return out


def _targets(mods: dict[str, Path], cur: str, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    parts = cur.split(".")
    if node.level:
        parts = parts if mods[cur].name == "__init__.py" else parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def import_edges(root: Path, package: str = "agentrl_cli") -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source (functions too)."""
    mods = modules(root, package)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for t in _targets(mods, m, node):
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and t.startswith(package):
                    edges[m].add(t)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    idx: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        idx[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in idx:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10000))
    try:
        for v in sorted(edges):
            if v not in idx:
                strong(v)
    finally:
        sys.setrecursionlimit(old)
    return out


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module sits in a higher layer."""
    def layer(m: str) -> int | None:
        parts = m.split(".")
        return LAYER.get(parts[1]) if len(parts) > 1 else None

    return sorted((a, b) for a in edges for b in edges[a]
                  if layer(a) is not None and layer(b) is not None and layer(b) > layer(a))


def test_no_import_cycle_and_no_upward_import():
    edges = import_edges(ROOT)
    assert len(edges) > 50                      # the package was found and read
    assert cycles(edges) == []
    assert upward(edges) == []


def test_every_top_level_name_has_a_layer():
    tops = {m.split(".")[1] for m in modules(ROOT) if m.count(".") >= 1}
    assert tops - set(LAYER) == set(), "a new top-level module needs a place in the layer order"


def test_the_check_finds_a_cycle_and_an_upward_import(tmp_path):
    pkg = tmp_path / "agentrl_cli"
    for rel, text in {
        "__init__.py": "",
        "config.py": "def f():\n    from .rollout import runner\n",       # upward, in a function
        "rollout/__init__.py": "",
        "rollout/runner.py": "from ..types import T\nfrom . import vine\n",
        "rollout/vine.py": "from .runner import x\n",                        # runner <-> vine
        "types.py": "",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    edges = import_edges(tmp_path)
    assert cycles(edges) == [["agentrl_cli.rollout.runner", "agentrl_cli.rollout.vine"]]
    assert upward(edges) == [("agentrl_cli.config", "agentrl_cli.rollout.runner")]


def test_one_plotting_helper():
    """Every figure goes through `reporting/plots.py`: no other module imports matplotlib."""
    importers = set()
    for m, f in modules(ROOT).items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "matplotlib" or n.startswith("matplotlib.") for n in names):
                importers.add(m)
    assert importers == {"agentrl_cli.reporting.plots"}


MAX_FUNCTION_LINES = 80      # DESIGN.md, house style: a function a reader takes in at once


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, str, int]]:
    """(module, function, lines) for every function or method longer than `limit` lines."""
    out = []
    for m, f in modules(root).items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append((m, node.name, n))
    return sorted(out)


def test_no_function_over_80_lines():
    assert long_functions(ROOT) == []


def test_the_length_check_finds_a_long_function(tmp_path):
    pkg = tmp_path / "agentrl_cli"
    pkg.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(80))
    (pkg / "long.py").write_text(f"def short():\n    return 1\n\n\nclass C:\n    def big(self):\n{body}")
    assert long_functions(tmp_path) == [("agentrl_cli.long", "big", 81)]
