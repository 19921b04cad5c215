"""The package graph has layers (docs/design.md, "Packages"): a module imports only from its own
package or from packages below it, and no two modules import each other, directly or round a
loop. Read from the source with `ast` (function-level imports count too), so a new upward import
fails here, not in review."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT, machine_s

# Lowest first. Packages on one line share a layer and may not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("harness.codes",),  # statuses, error kinds, exit codes: plain enums
    ("harness.records",),  # the results contract
    ("harness.errors",),
    ("harness.registry",),
    ("harness.benchmark",),  # benchmarks (GSM8K): data, prompts, grading, scoring; the HTTP evaluator
    ("harness.suite",),
    ("harness.sim", "harness.gate"),
    ("harness.engine",),
    ("harness.results",),  # adapters: the folder, MLflow, reports
    ("harness.run",),
    ("harness.analysis", "harness.bisect"),
    ("harness.cli",),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """module -> the harness modules it imports (anywhere in its body); `from package import module`
    counts as an import of that module."""
    paths = sorted((ROOT / "harness").rglob("*.py"))
    modules = {module_name(path) for path in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules
                found.update(submodules or {node.module})
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        name = module_name(path)
        graph[name] = {t for t in found if (t == "harness" or t.startswith("harness.")) and t != name}
    return graph


def layer_of(module: str) -> tuple[int, str]:
    for rank, packages in enumerate(LAYERS):
        for package in packages:
            if module == package or module.startswith(package + "."):
                return rank, package
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS (and docs/design.md)")


def test_every_import_goes_down_or_stays_in_its_package():
    upward = []
    for module, targets in imports().items():
        if module in ("harness", "harness.__main__"):
            continue
        rank, package = layer_of(module)
        for target in targets:
            if target == "harness":
                continue
            target_rank, target_package = layer_of(target)
            if target_package != package and target_rank >= rank:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_no_module_import_cycle():
    graph = imports()
    known = set(graph)
    cycles = []
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(t for t in graph[module] if t in known):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_contract_imports_nothing_of_the_harness_but_its_codes():
    graph = imports()
    assert graph["harness.codes"] == set()
    codes = ast.parse((ROOT / "harness" / "codes.py").read_text())
    imported = {alias.name for node in ast.walk(codes) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(codes) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(name.split(".")[0] == "pydantic" for name in imported), imported  # plain enums
    assert graph["harness.records"] == {"harness.codes"}


def test_regress_plan_loads_none_of_the_heavy_libraries():
    """`regress plan` reads a YAML file and prints its cells: no HTTP client, tracking, cluster,
    dataframe or statistics library is imported for that, nor the results records' pydantic models
    (building their classes took a fifth of the command's CPU), nor rich (~50 ms: the plan prints
    through typer), nor pydantic's plugin scan (every installed package's entry points read, ~10 ms:
    regress turns plugins off before it builds its first validator)."""
    probe = ("import io, sys, contextlib\n"
             "from harness.cli import main\n"
             "sys.argv = ['regress', 'plan', 'configs/nightly.yaml']\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    try:\n        main()\n    except SystemExit as end:\n        assert not end.code, end.code\n"
             "print(sorted(m for m in ('aiohttp', 'mlflow', 'ray', 'pandas', 'scipy', 'harness.records', 'rich') "
             "if m in sys.modules))\n"
             "from pydantic.plugin import _loader\n"
             "print('plugins scanned:', _loader._plugins is not None)\n")
    env = {name: value for name, value in os.environ.items() if name != "PYDANTIC_DISABLE_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=machine_s(120), check=True)
    assert out.stdout.strip().splitlines()[-2:] == ["[]", "plugins scanned: False"], out.stderr

