"""Expand a suite into cells: the cross product of models and axes, pruned by rules.

Pure functions over the validated suite, no I/O. Each cell knows the exact server flags its
configuration needs and what the server must report back for those flags to count as honoured.
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.suite.axes import AXES, SGLANG_ATTENTION_BACKENDS, abbreviation, backend_axes, reported_flags
from harness.suite.config import (
    ModelSpec,
    Rule,
    Suite,
    axis_value_names,
    did_you_mean,
)
from harness.suite.files import read_lines


@dataclass(frozen=True)
class Cell:
    """One server configuration to evaluate."""

    cell_id: str
    model: ModelSpec
    factors: dict[str, str]
    flags: tuple[str, ...]
    # Server-info fields (sglang's own names) and the values the flags must resolve to.
    expected: dict[str, Any]
    reference_cell: str | None = None
    # Variables the cell's custom axis values set, over the model's `env` (they are not verifiable:
    # a server does not report its environment).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def is_reference(self) -> bool:
        return self.reference_cell is None

    @property
    def gpus(self) -> int:
        return self.model.tp

    @property
    def server_env(self) -> dict[str, str]:
        """What the cell adds to its server's environment: the model's `env`, then its own."""
        return {**self.model.env, **self.env}

    def factor_values(self) -> dict[str, str]:
        """Model plus every axis value: what attribution and tracking see."""
        return {"model": self.model.id, **self.factors}


@dataclass(frozen=True)
class SkippedCell:
    cell_id: str
    model: ModelSpec
    factors: dict[str, str]
    reason: str


@dataclass(frozen=True)
class Matrix:
    cells: tuple[Cell, ...]
    skipped: tuple[SkippedCell, ...] = field(default=())

    def by_id(self) -> dict[str, Cell]:
        return {cell.cell_id: cell for cell in self.cells}


def cell_id_for(model_id: str, factors: dict[str, str]) -> str:
    """Stable, readable id: `kimi-linear.ab-fa3.um-on.rc-on` (axis order as in the suite)."""
    parts = [model_id]
    for axis, value in factors.items():
        parts.append(f"{abbreviation(axis)}-{value}")
    return ".".join(parts)


def flags_for(axis: str, value: str, axis_spec: Any) -> tuple[list[str], dict[str, Any], dict[str, str]]:
    """The server flags one factor value adds, the resolved server fields they imply, and the
    environment variables it sets (custom axes only)."""
    registered = AXES.find(axis)
    if registered is not None:
        return registered.flags(value), registered.expected(value), {}
    flags = list(axis_spec[value]["flags"])
    return flags, expectations_from_flags(flags), dict(axis_spec[value]["env"])


def expectations_from_flags(flags: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """What the server info must say for flags it is known to report: `--enable-two-batch-overlap`
    -> `{"enable_two_batch_overlap": True}`. Unknown flags are not checked."""
    known = reported_flags()
    expected: dict[str, Any] = {}
    for position, flag in enumerate(flags):
        name, _, inline = flag.partition("=")
        if name not in known:
            continue
        field_name, kind = known[name]
        if kind is None:
            expected[field_name] = True
            continue
        raw = inline or (flags[position + 1] if position + 1 < len(flags) else "")
        try:
            expected[field_name] = kind(raw)
        except ValueError:
            continue
    return expected


def rule_matches(rule: Rule, factor_values: dict[str, str]) -> bool:
    return all(factor_values.get(key) in values for key, values in rule.conditions().items())


def _expanded_axes(suite: Suite, attention_backends: tuple[str, ...]) -> dict[str, list[str]]:
    axes: dict[str, list[str]] = {}
    for axis, spec in suite.axes.items():
        values = axis_value_names(spec)
        if axis in backend_axes() and "auto" in values:
            values = [v for v in values if v != "auto"] + [b for b in attention_backends if b not in values]
        axes[axis] = values
    return axes


def expand(suite: Suite, attention_backends: tuple[str, ...] = SGLANG_ATTENTION_BACKENDS) -> Matrix:
    """Expand a suite into cells (models x axes), apply include/exclude rules, pair references.

    `attention_backends` is what the axis value `auto` expands to: the backends the installed
    sglang accepts (read on a worker), or sglang's documented list when planning offline.

    >>> # expand(load_suite("configs/demo.yaml").suite).cells[0].cell_id
    >>> # 'kimi-linear.ab-triton.um-off.rc-on'
    """
    axes = _expanded_axes(suite, attention_backends)
    cells: list[Cell] = []
    skipped: list[SkippedCell] = []
    for model in suite.models:
        for combination in itertools.product(*axes.values()) if axes else [()]:
            factors = dict(zip(axes, combination, strict=True))
            cell_id = cell_id_for(model.id, factors)
            values = {"model": model.id, **factors}
            reason = _skip_reason(suite, values)
            if reason is not None:
                skipped.append(SkippedCell(cell_id, model, factors, reason))
                continue
            flags: list[str] = []
            expected: dict[str, Any] = {"tp_size": model.tp}
            env: dict[str, str] = {}
            for axis, value in factors.items():
                axis_flags, axis_expected, axis_env = flags_for(axis, value, suite.axes[axis])
                flags += axis_flags
                expected.update(axis_expected)
                env.update(axis_env)
            cells.append(Cell(cell_id, model, factors, tuple(flags), expected, env=env))
    return Matrix(tuple(_pair_references(suite, cells, skipped)), tuple(skipped))


def _skip_reason(suite: Suite, values: dict[str, str]) -> str | None:
    if suite.include and not any(rule_matches(rule, values) for rule in suite.include):
        return "not matched by any include rule"
    for rule in suite.exclude:
        if rule_matches(rule, values):
            return rule.reason or "excluded by rule " + ", ".join(
                f"{k}={'|'.join(v)}" for k, v in rule.conditions().items())
    return None


def _pair_references(suite: Suite, cells: list[Cell], skipped: list[SkippedCell]) -> list[Cell]:
    """Give each cell its reference: the same model with every axis at its baseline value."""
    ids = {cell.cell_id for cell in cells}
    skipped_ids = {cell.cell_id: cell.reason for cell in skipped}
    paired: list[Cell] = []
    for cell in cells:
        baseline = {axis: suite.baseline_value(axis) for axis in cell.factors}
        reference = cell_id_for(cell.model.id, baseline)
        if reference not in ids:
            why = skipped_ids.get(reference, "it is not in the matrix")
            raise ConfigError(
                f"baseline: the reference cell {reference} of {cell.cell_id} is excluded ({why}); "
                "change `baseline` or the exclude rules so every model keeps its reference cell")
        paired.append(replace(cell, reference_cell=None if reference == cell.cell_id else reference))
    # Reference cells run first: every other cell of the model is compared with them.
    return sorted(paired, key=lambda c: not c.is_reference)


def select(matrix: Matrix, expression: str | None, ids: set[str] | None = None) -> Matrix:
    """Keep the cells an expression selects; reference cells of selected cells are kept too.

    The expression is a conjunction `key=value[|value],...` over `model` and axes, or a glob on
    cell ids (`kimi-linear.*um-on*`). Raises ConfigError when nothing is selected.
    """
    if not expression:
        return matrix
    chosen: set[str] = set()
    if ids is not None:
        chosen = {cell.cell_id for cell in matrix.cells if cell.cell_id in ids}
    elif "=" in expression:
        conditions: dict[str, set[str]] = {}
        for part in expression.split(","):
            key, _, values = part.partition("=")
            conditions[key.strip()] = {v.strip() for v in values.split("|")}
        known = {"model", *(matrix.cells[0].factors if matrix.cells else {})}
        for key in conditions:
            if key not in known:
                raise ConfigError(f"--select: unknown factor '{key}'; allowed: {', '.join(sorted(known))}"
                                  + did_you_mean(key, sorted(known)))
        for cell in matrix.cells:
            values = cell.factor_values()
            if all(values[key] in allowed for key, allowed in conditions.items()):
                chosen.add(cell.cell_id)
    else:
        chosen = {cell.cell_id for cell in matrix.cells if fnmatch.fnmatch(cell.cell_id, expression)}
    if not chosen:
        raise ConfigError(f"--select {expression!r} selects no cell; `regress plan SUITE` lists the cell ids")
    chosen |= {cell.reference_cell for cell in matrix.cells if cell.cell_id in chosen and cell.reference_cell}
    return Matrix(tuple(c for c in matrix.cells if c.cell_id in chosen), matrix.skipped)


def select_listed(matrix: Matrix, path: Path) -> Matrix:
    """The cells whose ids the file at `path` lists (one per line; `--cells`), with their reference cells."""
    wanted = set(read_lines(path, "--cells file"))
    if not wanted:
        raise ConfigError(f"--cells {path}: lists no cell, so there is nothing to run (`regress select` writes an "
                          "empty list when the change affects no cell of the suite); run without --cells for all")
    unknown = wanted - {c.cell_id for c in matrix.cells}
    if unknown:
        raise ConfigError(f"--cells {path}: not cells of this suite: {', '.join(sorted(unknown)[:5])}")
    return select(matrix, "|".join(sorted(wanted)), ids=wanted)
