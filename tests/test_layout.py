"""The import picture of src/gpuwise: no loop, cheap imports. Read from the source with `ast` (imports at
module level and inside functions alike), so a loop hidden by an in-function import is found too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__)."""
    out = {}
    for path in sorted((SRC / "gpuwise").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def import_edges() -> dict[str, dict[str, list[tuple[int, bool]]]]:
    """module -> imported gpuwise module -> [(line, at module level)] for every import statement, with the
    packages whose __init__ it runs on the way."""
    mods = _modules()

    def known(name: str) -> str:
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    edges: dict[str, dict[str, list[tuple[int, bool]]]] = {}
    for mod, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                target = known(target)
                if not target.startswith("gpuwise") or target == mod:
                    continue
                # importing a.b.c runs a/__init__ and a/b/__init__ first: those are imports too
                parts = target.split(".")
                for name in [".".join(parts[:i]) for i in range(2, len(parts))] + [target]:
                    if name in mods and name != mod and not mod.startswith(name + "."):
                        edges.setdefault(mod, {}).setdefault(name, []).append((node.lineno, id(node) in top))
    return edges


def cycles(edges) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_sees_a_loop_through_an_in_function_import():
    assert cycles({"a": {"b": [(1, True)]}, "b": {"c": [(3, False)]}, "c": {"a": [(9, False)]}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": [(1, True)]}, "b": {"c": [(3, False)]}}) == []


def test_no_import_loop_in_src():
    edges = import_edges()
    assert "gpuwise.plan.tracing.trace" in edges["gpuwise.plan.tracer"]  # the reader sees in-function imports
    assert cycles(edges) == []


def test_plan_is_one_straight_line_from_events_to_trace():
    edges = import_edges()
    assert "gpuwise.plan.tracing.fallback" in edges["gpuwise.plan.tracing.trace"]
    assert "gpuwise.plan.tracing.fallback" in edges["gpuwise.plan.tracing.setup"]
    assert "gpuwise.plan.tracing.trace" not in edges["gpuwise.plan.tracing.fallback"]
    assert "gpuwise.plan.tracing.setup" not in edges.get("gpuwise.plan.tracing.fallback", {})


def test_importing_plan_does_not_import_torch():
    """plan/__init__'s promise (and the other packages' and the CLI's): torch is imported when a step is
    built or traced, not when gpuwise is imported."""
    code = ("import gpuwise.plan, sys; assert 'torch' not in sys.modules, 'gpuwise.plan imported torch'; "
            "import gpuwise.measuring, gpuwise.tuning, gpuwise.monitoring, gpuwise.integrations, gpuwise.devices, gpuwise.cli; "
            "assert 'torch' not in sys.modules, 'a gpuwise package imported torch'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(SRC), "PATH": ""})
    assert done.returncode == 0, done.stderr


# Who may import report/ (rendering): the front ends, i.e. the CLI, its commands, report/ itself, and the
# integrations in users' code (`gpuwise.monitor(report=...)`, `merged_summary(report=...)`, the callbacks).
RENDERERS = ("gpuwise.cli", "gpuwise.commands", "gpuwise.report", "gpuwise.integrations")


def test_the_library_returns_data_and_report_renders_it():
    offenders = sorted((mod, target) for mod, targets in import_edges().items() for target in targets
                       if target.startswith("gpuwise.report") and not mod.startswith(RENDERERS))
    assert offenders == []


# modules that import torch (or lightning) when imported: the only ones another module may import inside
# a function, to keep `import gpuwise...` cheap
IMPORT_TORCH = ("gpuwise.examples", "gpuwise.plan.tracing.trace", "gpuwise.plan.tracing.dispatch", "gpuwise.plan.tracing.sdpa",
                "gpuwise.integrations.lightning", "gpuwise.integrations.hf")


def test_in_function_imports_of_gpuwise_modules_only_defer_torch():
    edges = import_edges()

    def on_the_way(mod: str, package: str, line: int) -> bool:
        """`package` is only run on the way to one of its modules imported by the same statement."""
        return any(target.startswith(package + ".") and (line, False) in places
                   for target, places in edges[mod].items())

    nested = sorted((mod, target, line) for mod, targets in edges.items()
                    for target, places in targets.items() for line, at_top in places
                    if not at_top and not target.startswith(IMPORT_TORCH) and not on_the_way(mod, target, line))
    assert nested == []


def private_imports() -> list[tuple[str, str, str]]:
    """(module, imported module, name) for every `from gpuwise.x import _name` across modules of src."""
    mods = _modules()
    found = []
    for mod, (path, is_pkg) in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            if not base.startswith("gpuwise"):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append((mod, base, alias.name))
    return sorted(found)


def test_the_private_import_finder_sees_one(tmp_path, monkeypatch):
    pkg = tmp_path / "gpuwise" / "a"
    pkg.mkdir(parents=True)
    (tmp_path / "gpuwise" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "b.py").write_text("def _hidden(): pass\n")
    (pkg / "c.py").write_text("def f():\n    from .b import _hidden\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    assert private_imports() == [("gpuwise.a.c", "gpuwise.a.b", "_hidden")]


def test_no_module_imports_another_modules_private_name():
    """Modules talk through public names (in plan/, tracer.py is the way into the tracer)."""
    assert private_imports() == []
