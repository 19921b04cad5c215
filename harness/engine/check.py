"""The plan-time sglang check, seen from the driver: which cells the installed sglang refuses (and
why, in its own words), and what it resolves the others to. The check itself runs under the
servers' interpreter (`harness.engine.sglang_check`); this module builds its input and reads its
answer into typed records.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from harness.engine.launch import planned_argv
from harness.engine.verify import predicted_fields
from harness.errors import ConfigError, InfraError
from harness.records import Record
from harness.suite.config import LoadedSuite
from harness.suite.matrix import Cell, Matrix, SkippedCell

HARNESS_ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = HARNESS_ROOT / "configs" / "models"
CHECK_TIMEOUT_S = 1800.0


class CheckedCell(Record):
    cell_id: str
    refused: str | None = None  # sglang's own message when it would not start the cell
    stage: str = "argparse"  # how far the check got: argparse, resolution, check
    predicted: dict = {}  # resolved fields sglang predicts (what /server_info should report)
    sglang_version: str | None = None
    stand_ins: list[str] = []
    problem: str | None = None  # why a part of the check could not run (not a refusal)


def check_request(loaded: LoadedSuite, cells: list[Cell]) -> list[dict[str, object]]:
    """The check's input: each cell's exact argv, built where the suite's engine is registered (the
    driver), so a worker runs it without knowing the engine."""
    return [{"cell_id": cell.cell_id, "argv": planned_argv(loaded, cell)} for cell in cells]


def check_groups(cells: list[Cell], base_env: dict[str, str]) -> list[tuple[dict[str, str], list[Cell]]]:
    """The cells one check process can answer for together: the same environment (`base_env`, then
    the model's, then the cell's) and the same GPU kind. A suite's models usually share both, so
    they share one sglang import (~7 CPU-seconds each here) instead of one per model."""
    groups: dict[tuple, tuple[dict[str, str], list[Cell]]] = {}
    for cell in cells:
        env = {**base_env, **cell.server_env}
        key = (tuple(sorted(env.items())), cell.model.gpu_type)
        groups.setdefault(key, (env, []))[1].append(cell)
    return list(groups.values())


def check_cells(python: str, loaded: LoadedSuite, cells: list[Cell], models_dir: Path | None = MODELS_DIR,
                gpu: str | None = None, env: dict[str, str] | None = None,
                request: list[dict[str, object]] | None = None) -> list[CheckedCell]:
    """Run the cells' exact argv (`request`, else `check_request`) through the sglang that `python` imports."""
    request = request if request is not None else check_request(loaded, cells)
    # The cell's platform, described: the CPU, or the suite's GPU kind (an H200 unless it names one).
    kind = "cpu" if loaded.suite.cluster.platform == "cpu" else (
        gpu or next((c.model.gpu_type for c in cells if c.model.gpu_type), None) or "H200")
    command = [python, "-m", "harness.engine.sglang_check", "--gpu", kind, "--fields", ",".join(predicted_fields()),
               "--gpus", str(max(loaded.suite.cluster.gpus, max((c.gpus for c in cells), default=1)))]
    if models_dir is not None and models_dir.is_dir():
        command += ["--models-dir", str(models_dir)]
    path = os.pathsep.join(filter(None, [str(HARNESS_ROOT), (env or {}).get("PYTHONPATH"),
                                         os.environ.get("PYTHONPATH")]))
    try:
        completed = subprocess.run(command, input=json.dumps(request), capture_output=True, text=True,
                                   timeout=CHECK_TIMEOUT_S, env={**os.environ, **(env or {}), "PYTHONPATH": path,
                                                                 # the check's own stand-ins, not a server's
                                                                 "REGRESS_STAND_INS": "0"})
    except (OSError, subprocess.TimeoutExpired) as error:
        raise InfraError(f"the sglang check could not run with {python}: {error}") from None
    if completed.returncode != 0:
        if "No module named 'sglang'" in completed.stderr:
            raise ConfigError(f"{python} cannot import sglang: install it there, or name the interpreter that "
                              "has it with --python (`make sglang-env` builds a CPU-only sglang 0.5.23 for checks)")
        raise InfraError(f"the sglang check failed (exit {completed.returncode}): {completed.stderr.strip()[-800:]}")
    return [CheckedCell.model_validate(item) for item in json.loads(completed.stdout.strip().splitlines()[-1])]


def without_refused(matrix: Matrix, checked: list[CheckedCell]) -> Matrix:
    """The matrix less the cells sglang refuses, which become skipped with sglang's message. A
    reference cell sglang refuses takes its cells with it (nothing to compare them with)."""
    refused = {c.cell_id: c.refused for c in checked if c.refused}
    if not refused:
        return matrix
    kept, skipped = [], list(matrix.skipped)
    for cell in matrix.cells:
        reason = refused.get(cell.cell_id) or (
            f"its reference cell {cell.reference_cell} is refused by sglang" if cell.reference_cell in refused else None)
        if reason is None:
            kept.append(cell)
        else:
            skipped.append(SkippedCell(cell.cell_id, cell.model, cell.factors,
                                       reason if cell.cell_id not in refused else f"sglang refuses it: {reason}"))
    return Matrix(tuple(kept), tuple(skipped))
