"""Change-aware selection: which cells of a suite a PR must run, and why (pure).

`configs/selection.yaml` maps sglang source path globs to the factor values they can affect. A
changed file that matches a rule selects the cells matching that rule; a rule marked `all` (shared
machinery) selects every cell; files no rule matches select the default set. Reference cells of
selected cells are always kept, since the paired comparison needs them.
"""

from __future__ import annotations

import fnmatch
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.errors import ConfigError
from harness.suite.files import load_yaml
from harness.suite.matrix import Matrix


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SelectionRule(_Strict):
    paths: list[str] = []
    select: dict[str, list[Any]] = {}
    all: bool = False
    reason: str = ""


class SelectionConfig(_Strict):
    rules: list[SelectionRule]
    default: SelectionRule


@dataclass(frozen=True)
class Selected:
    cells: dict[str, list[str]]  # cell id -> why
    full: bool


def load_selection(path: Path) -> SelectionConfig:
    data = load_yaml(path, "selection file")
    try:
        return SelectionConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(f"{path}: invalid selection file: {error}") from None


def _value(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _matches(rule: SelectionRule, factors: dict[str, str]) -> bool:
    return all(factors.get(key) in {_value(v) for v in values} for key, values in rule.select.items())


def select_cells(matrix: Matrix, config: SelectionConfig, changed_files: list[str]) -> Selected:
    reasons: dict[str, list[str]] = {}
    full = False
    unmatched = []
    for path in changed_files:
        rules = [r for r in config.rules if any(fnmatch.fnmatch(path, glob) for glob in r.paths)]
        if not rules:
            unmatched.append(path)
        for rule in rules:
            for cell in matrix.cells:
                if rule.all or _matches(rule, cell.factor_values()):
                    reasons.setdefault(cell.cell_id, []).append(f"{path}: {rule.reason}")
            full = full or rule.all
    if unmatched:
        for cell in matrix.cells:
            if _matches(config.default, cell.factor_values()):
                reasons.setdefault(cell.cell_id, []).append(
                    f"{len(unmatched)} unmatched file(s) such as {unmatched[0]}: {config.default.reason}")
    for cell in matrix.cells:
        if cell.cell_id in reasons and cell.reference_cell and cell.reference_cell not in reasons:
            reasons[cell.reference_cell] = [f"reference cell of {cell.cell_id}"]
    ordered = {c.cell_id: reasons[c.cell_id] for c in matrix.cells if c.cell_id in reasons}
    return Selected(ordered, full)


def changed_files_from_git(repo: Path, revisions: str) -> list[str]:
    """`git diff --name-only BASE..HEAD` in an sglang checkout."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "diff", "--name-only", revisions], capture_output=True,
                             text=True, timeout=60, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise ConfigError(f"--git-diff {revisions}: git failed in {repo}: {getattr(error, 'stderr', error)}") from None
    return [line for line in out.stdout.splitlines() if line.strip()]
