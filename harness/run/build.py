"""One run, built once: from what was asked (`RunRequest`) to what runs (`RunInputs`).

    load the suite and its engine -> select cells -> data and protocol     (`prepare`: before Ray)
    -> with the cluster up: `auto` backends, --cells, fit, the engine's    (`on_cluster`)
       plan-time check (sglang refuses or predicts each cell)

`regress run`, the driver of a `regress submit` job (which is `regress run` on the cluster) and every
`regress bisect` probe build their run here, and `regress eval` its questions (`questions`);
nothing else re-does a part of it. This module imports
no Ray at load time: `regress plan` uses `load_matrix` from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.benchmark.base import Dataset, ProtocolPlan
from harness.benchmark.registry import benchmark_named
from harness.engine.engines import engine_of
from harness.errors import ConfigError
from harness.suite.config import LoadedSuite, load_suite
from harness.suite.matrix import Matrix, expand, select, select_listed


@dataclass(frozen=True)
class RunRequest:
    """What a command asks of a run, before anything is read."""

    suite_path: Path
    selection: str | None = None
    cells_file: Path | None = None  # only these cell ids (`regress select --write`)
    num_questions: int | None = None  # overrides the suite; alone, a quick look (no extension)
    extend_to: int | None = None  # overrides gate.extend_to; 0: never extend
    gsm8k_path: Path | None = None  # else the suite's dataset.path, REGRESS_GSM8K_PATH, the hub


@dataclass(frozen=True)
class RunInputs:
    """What a run is made of: the suite, its (selected) matrix, the data and the protocol."""

    loaded: LoadedSuite
    matrix: Matrix
    data: Dataset
    plan: ProtocolPlan
    predicted: dict[str, dict] = field(default_factory=dict)  # cell id -> fields the sglang check predicts
    # cell id -> what sglang resolves otherwise than the cell asks: `mismatch` without a server started
    planned_mismatches: dict[str, list[str]] = field(default_factory=dict)


def load_matrix(path: Path, selection: str | None) -> tuple[LoadedSuite, Matrix]:
    """The suite at `path`, checked against its engine and benchmark, and its (selected) matrix;
    ConfigError when either is unknown, the engine cannot run the suite, or no cell is left."""
    loaded = load_suite(path)
    engine_of(loaded).validate(loaded)
    benchmark_named(loaded.suite.benchmark, loaded.suite.protocol)
    matrix = select(expand(loaded.suite), selection)
    if not matrix.cells:
        raise ConfigError(f"{path}: the include/exclude rules leave no cell to run")
    return loaded, matrix


def _with_overrides(loaded: LoadedSuite, request: RunRequest) -> LoadedSuite:
    if request.num_questions is not None and request.num_questions < 1:
        raise ConfigError(f"--num-questions: must be at least 1 (got {request.num_questions})")
    if request.extend_to is not None and request.extend_to < 0:
        raise ConfigError(f"--extend-to: must be 0 (no extension) or a number of questions (got {request.extend_to})")
    updates: dict = {} if request.num_questions is None else {"num_questions": request.num_questions}
    if request.extend_to is not None or request.num_questions is not None:  # --num-questions alone: not extended
        updates["gate"] = loaded.suite.gate.model_copy(update={"extend_to": request.extend_to or None})
    return loaded.model_copy(update={"suite": loaded.suite.model_copy(update=updates)})


@dataclass(frozen=True)
class QuestionsRequest:
    """Which benchmark's questions, and how many: what `regress run` (from its suite) and `regress
    eval` (from its options) both ask for."""

    benchmark: str
    protocol: str | None  # None: the benchmark's default protocol
    num_questions: int | None
    seed: int
    max_tokens: int
    data_path: Path | None = None  # else the benchmark's default source


def questions(request: QuestionsRequest) -> tuple[Dataset, ProtocolPlan]:
    """The benchmark's data and plan; ConfigError (exit 2, nothing launched) for an unknown
    benchmark or protocol, or data that cannot be had."""
    benchmark = benchmark_named(request.benchmark, request.protocol)
    protocol = request.protocol or benchmark.default_protocol
    data = benchmark.load(request.data_path)
    return data, benchmark.plan(data, protocol, request.num_questions, request.seed, request.max_tokens)


def prepare(request: RunRequest) -> RunInputs:
    """Everything checked before Ray starts: suite, engine, selection, data and protocol (exit 2 on
    any problem, nothing launched)."""
    loaded, matrix = load_matrix(request.suite_path, request.selection)
    if request.cells_file is not None:
        matrix = select_listed(matrix, request.cells_file)
    loaded = _with_overrides(loaded, request)
    spec = loaded.suite
    data, plan = questions(QuestionsRequest(
        spec.benchmark, spec.protocol, spec.num_questions, spec.seed, spec.max_tokens,
        request.gsm8k_path or (loaded.resolve_path(spec.dataset.path) if spec.dataset.path else None)))
    return RunInputs(loaded, matrix, data, plan)


def on_cluster(inputs: RunInputs, request: RunRequest, warn: Callable[[str], None]) -> RunInputs:
    """The rest, with Ray connected: `auto` backends as the workers' engine accepts them, the
    --cells list again over that matrix, every cell fits a node, and the engine's plan-time check
    (cells it refuses become `skipped`, its predictions are kept)."""
    from harness.run.ray.cluster import check_fits

    matrix = cluster_matrix(inputs, request)
    check_fits(matrix, inputs.loaded.suite.cluster.slot_resource)
    return plan_check(replace(inputs, matrix=matrix), warn)


def cluster_matrix(inputs: RunInputs, request: RunRequest) -> Matrix:
    """The matrix with `auto` backends as the workers' engine accepts them (Ray connected), and the
    --cells list applied to it."""
    from harness.run.ray.cluster import expand_auto

    matrix = expand_auto(inputs.loaded, request.selection, inputs.data.source) or inputs.matrix
    return select_listed(matrix, request.cells_file) if request.cells_file is not None else matrix


def plan_check(inputs: RunInputs, warn: Callable[[str], None]) -> RunInputs:
    """The engine's plan-time check of every cell, on a worker (a no-op for engines without one)."""
    if not engine_of(inputs.loaded).checks_at_plan_time:
        return inputs
    from harness.run.ray.cluster import sglang_check

    matrix, predicted = sglang_check(inputs.loaded, inputs.matrix, inputs.data.source, warn)
    planned = {cell.cell_id: problems for cell in matrix.cells
               if (problems := predicted_mismatches(cell.expected, predicted.get(cell.cell_id, {})))}
    return replace(inputs, matrix=matrix, predicted={**inputs.predicted, **predicted},
                   planned_mismatches={**inputs.planned_mismatches, **planned})


def predicted_mismatches(expected: dict, predicted: dict) -> list[str]:
    """What the plan-time check says the server would resolve otherwise than the cell is labelled:
    `attention_backend: requested 'intel_amx', sglang resolves it to 'torch_native'` (only fields
    it predicted)."""
    return [f"{key}: requested {wanted!r}, sglang resolves it to {predicted[key]!r} (plan-time check; no server "
            "was started)" for key, wanted in expected.items() if key in predicted and predicted[key] != wanted]
