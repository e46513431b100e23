"""The package's imports point down the layer order of docs/architecture.md (its table) and
never form a cycle, counting imports inside functions too (only function-level imports once
kept a cycle of 24 modules from crashing at import time). Read from the source with `ast`;
nothing is imported."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a module may import its own layer or lower ones, never a higher one
LAYER = {"cli": 10, "api": 10, "ablate": 9, "diagnostics": 9, "app": 8, "train": 7, "evaluation": 6, "rollout": 5,
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


MAX_FUNCTION_LINES = 60      # docs/architecture.md: a function a reader takes in at once

# Functions allowed over MAX_FUNCTION_LINES, by "module.function", each with the reason.
LONG_FUNCTION_EXCEPTIONS: dict[str, str] = {}


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


def test_no_function_over_60_lines():
    found = {f"{m}.{name}": n for m, name, n in long_functions(ROOT)}
    assert sorted(set(found) - set(LONG_FUNCTION_EXCEPTIONS)) == []
    # an exception that is no longer long leaves the list (it only shrinks)
    assert sorted(set(LONG_FUNCTION_EXCEPTIONS) - set(found)) == []


def test_the_length_check_finds_a_long_function(tmp_path):
    pkg = tmp_path / "agentrl_cli"
    pkg.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(60))
    (pkg / "long.py").write_text(f"def short():\n    return 1\n\n\nclass C:\n    def big(self):\n{body}")
    assert long_functions(tmp_path) == [("agentrl_cli.long", "big", 61)]


# ------------------------------------------------------------------ function-level imports
# An import sits at the top of its module unless it is deferred on purpose, and then the
# line above it (or its own line) says why: `# deferred: <why>` (CLI start-up, an optional
# extra, a package that takes seconds to import). A comment may stand above a run of imports.

# Packages whose function-level imports are not yet moved or reasoned (this list only shrinks).
DEFERRALS_NOT_YET_REASONED = ()


def bare_function_imports(root: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """'module:line' of every import inside a function without a `# deferred:` reason, outside
    the packages in `skip`."""
    out = []
    for m, f in modules(root).items():
        if (m.split(".") + [""])[1] in skip:
            continue
        lines = f.read_text(encoding="utf-8").splitlines()
        imports = [node for fn in ast.walk(ast.parse("\n".join(lines)))
                   if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))]
        import_lines = {i for node in imports for i in range(node.lineno, node.end_lineno + 1)}
        for node in imports:
            above = node.lineno - 1
            while above in import_lines:         # a run of imports under one comment
                above -= 1
            said = [lines[i - 1] for i in range(node.lineno, node.end_lineno + 1)]
            said += [lines[above - 1]] if above else []
            if not any("# deferred: " in line for line in said):
                out.append(f"{m}:{node.lineno}")
    return sorted(set(out))


def test_function_level_imports_say_why_they_are_deferred():
    assert bare_function_imports(ROOT, skip=DEFERRALS_NOT_YET_REASONED) == []


def test_the_deferral_check_finds_a_bare_import(tmp_path):
    pkg = tmp_path / "agentrl_cli" / "envs"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text(
        "import json\n\n\ndef ok():\n    # deferred: optional extra (vllm)\n    import vllm\n"
        "    from vllm import LLM\n    return vllm, LLM, json\n\n\n"
        "def bare():\n    x = 1\n    import yaml\n    return yaml, x\n")
    assert bare_function_imports(tmp_path) == ["agentrl_cli.envs.x:13"]
    assert bare_function_imports(tmp_path, skip=("envs",)) == []


# ----------------------------------------------------------------------------- re-exports
# docs/architecture.md (its first paragraph): no compatibility re-exports inside the
# package. A module that is not a package's `__init__` defines what it exports; whoever needs
# a name imports it from the module that defines it (a package's `__init__` is its public
# face: its own registrations and the names it gathers for users, e.g. `credit`'s public
# math API).

# Modules allowed to re-export, by module name, each with the reason.
REEXPORT_EXCEPTIONS: dict[str, str] = {}


def _top_level(tree: ast.Module):
    """Top-level statements, looking into `if` / `try` blocks."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            todo[:0] = [*node.body, *getattr(node, "handlers", []), *node.orelse,
                        *getattr(node, "finalbody", [])]
        elif isinstance(node, ast.ExceptHandler):
            todo[:0] = node.body
        else:
            yield node


def _bindings(tree: ast.Module) -> tuple[set[str], set[str], list[str]]:
    """(names the module defines, names it binds by importing, its `__all__`)."""
    defined, imported, exported = set(), set(), []
    for node in _top_level(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            imported |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        if n.id == "__all__" and isinstance(node, ast.Assign):
                            exported = [e.value for e in node.value.elts]
                        else:
                            defined.add(n.id)
    return defined, imported - defined, exported


def _is_package(f: Path) -> bool:
    return f.name == "__init__.py"


def reexports(root: Path, sources: dict[str, Path] | None = None) -> list[tuple[str, str]]:
    """(module, what) for every compatibility re-export: a module (not a package's `__init__`)
    that only imports, one whose `__all__` lists a name it imports, and every `from M import
    name` (in `sources`, default the package's modules) where M is such a module that binds
    `name` only by importing it."""
    mods = modules(root)
    info = {m: _bindings(ast.parse(f.read_text(encoding="utf-8"))) for m, f in mods.items()}
    out = set()
    for m, f in mods.items():
        if _is_package(f):
            continue
        tree = ast.parse(f.read_text(encoding="utf-8"))
        body = [n for n in _top_level(tree)
                if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
                and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
        defined, imported, exported = info[m]
        if body and all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in body) or \
                (body and not defined - {"__all__"} and imported):
            out.add((m, "only re-exports"))
        for name in exported:
            if name in imported:
                out.add((m, f"__all__ lists {name}, imported from elsewhere"))
    for src, f in (sources or mods).items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        alias: dict[str, str] = {}                # local name -> a package module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                alias.update({a.asname: a.name for a in node.names if a.asname and a.name in mods})
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                cur = src.split(".")
                parts = cur if _is_package(f) else cur[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                if f"{target}.{a.name}" in mods:
                    alias[a.asname or a.name] = f"{target}.{a.name}"
                elif target in mods and not _is_package(mods[target]) and a.name in info[target][1]:
                    out.add((target, f"{a.name} imported from it by {src}"))
        for node in ast.walk(tree):   # `module.name` through a module alias, of a name the
            # module lists in `__all__` but imports (reading a module's imports to patch them
            # where they are looked up is fine)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                target = alias.get(node.value.id)
                if target and not _is_package(mods[target]) and node.attr in info[target][1] \
                        and node.attr in info[target][2]:
                    out.add((target, f"{node.attr} read from it by {src}"))
    return sorted(out)


def test_no_compatibility_reexports():
    tests = {f"tests.{f.stem}": f for f in (ROOT / "tests").glob("*.py")}
    found = reexports(ROOT, {**modules(ROOT), **tests})
    assert [(m, w) for m, w in found if m not in REEXPORT_EXCEPTIONS] == []
    # an exception that no longer re-exports leaves the list (it only shrinks)
    assert sorted(set(REEXPORT_EXCEPTIONS) - {m for m, _ in found}) == []


def test_the_reexport_check_finds_them(tmp_path):
    pkg = tmp_path / "agentrl_cli"
    for rel, text in {
        "__init__.py": "from .a import f\n",                     # a package face: allowed
        "a.py": "def f():\n    return 1\n",
        "b.py": '"""Only re-exports."""\nfrom .a import f\n',
        "c.py": "from .a import f\n\n__all__ = ['f', 'g']\n\n\ndef g():\n    return f()\n",
        "d.py": "from .c import f, g\n\n\ndef h():\n    return f() + g()\n",
        "e.py": "from . import c\n\n\ndef k():\n    return c.f() + c.g()\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    assert reexports(tmp_path) == [
        ("agentrl_cli.b", "only re-exports"),
        ("agentrl_cli.c", "__all__ lists f, imported from elsewhere"),
        ("agentrl_cli.c", "f imported from it by agentrl_cli.d"),
        ("agentrl_cli.c", "f read from it by agentrl_cli.e"),
    ]


# ------------------------------------------------------------------ one registry, a typed step
def string_keyed_handoffs(files: dict[str, Path]) -> list[str]:
    """`X.extras[...]`, `X.extras.get(...)` or `X.extras.update(...)`: a string-keyed hand-off
    (the rollout's result and the batch carry named fields instead)."""
    out = []
    for m, f in files.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "extras":
                out.append(f"{m}:{node.lineno}")
    return out


def controller_name_sets(files: dict[str, Path], names: set[str]) -> list[str]:
    """Module-level collections of controller names (`FORKING = {"focus", "vine"}`): a
    capability kept outside the controller's one registration."""
    out = []
    for m, f in files.items():
        for node in ast.parse(f.read_text(encoding="utf-8")).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any("ESTIMATOR" in ast.unparse(t) for t in targets):
                continue              # an estimator's name may be a controller's too ("focus")
            value = node.value
            if isinstance(value, ast.Call) and value.args:     # frozenset({...})
                value = value.args[0]
            if isinstance(value, (ast.Set, ast.Tuple, ast.List)) and value.elts and all(
                    isinstance(e, ast.Constant) and e.value in names for e in value.elts):
                out.append(f"{m}:{node.lineno}")
    return out


def test_one_registration_per_controller_and_no_string_keyed_handoff():
    from dataclasses import fields

    from agentrl_cli.rollout.controllers import CONTROLLERS, Controller, RolloutResult
    from agentrl_cli.train.batch import Batch

    mods = modules(ROOT)
    assert string_keyed_handoffs(mods) == []
    assert "extras" not in {f.name for f in fields(RolloutResult)} | {f.name for f in fields(Batch)}
    names = set(CONTROLLERS.names())
    assert controller_name_sets(mods, names) == []
    registrations = [n for f in mods.values() for n in ast.walk(ast.parse(f.read_text()))
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and n.func.attr == "register" and isinstance(n.func.value, ast.Name)
                     and n.func.value.id == "CONTROLLERS"]
    assert len(registrations) == len(names)
    assert all(isinstance(CONTROLLERS.get(n), Controller) for n in names)
    # no second registry of controllers
    kinds = [n.args[0].value for f in mods.values() for n in ast.walk(ast.parse(f.read_text()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Registry"
             and n.args and isinstance(n.args[0], ast.Constant) and "controller" in str(n.args[0].value)]
    assert kinds == ["controller"]


def test_the_handoff_and_name_set_checks_find_them(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('FORKING = frozenset({"focus", "vine"})\nOK = ("grpo",)\n'
                   'def f(batch):\n    return batch.extras["focus_trees"]\n')
    assert string_keyed_handoffs({"bad": bad}) == ["bad:4"]
    assert controller_name_sets({"bad": bad}, {"focus", "vine", "linear"}) == ["bad:1"]


def test_only_the_application_floor_calls_the_trainer():
    """The trainer (`train.loop`) is started from one place, `app.train` (behind the checks
    every command runs before any work): `ablate`, `diagnostics`, `cli` and `api` call the
    floor, never the loop."""
    edges = import_edges(ROOT)
    callers = sorted(m for m, targets in edges.items()
                     if "agentrl_cli.train.loop" in targets and not m.startswith("agentrl_cli.train."))
    assert callers == ["agentrl_cli.app.train"]
