"""The README's first command, `regress run configs/demo.yaml`, end to end: a module of its own so
that pytest-xdist (`make test`) runs it beside the other end-to-end tests, not after them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from tests.helpers import ROOT, machine_s
from tests.test_run_end_to_end import CONTRACT_FIELDS, INCIDENT_CELLS, children_of, mlflow_runs, only_run


@pytest.mark.slow
def test_the_incident_demo(tmp_path):
    """The README's first command: 32 cells, exactly the three cells the wrapper bug breaks fail
    (Kimi-Linear runs its MLA backend inside HybridLinearAttnBackend; DeepSeek is not wrapped), exit 1.
    Healthy cells that 200 questions cannot clear are extended to the whole test split, then pass."""
    result = subprocess.run([str(Path(sys.executable).parent / "regress"), "run", "configs/demo.yaml",
                             "--results-dir", str(tmp_path)], capture_output=True, text=True, timeout=machine_s(600), cwd=ROOT,
                            env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = only_run(tmp_path)
    lines = [json.loads(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]
    cells = list({cell["cell_id"]: cell for cell in lines}.values())  # a later line replaces an earlier one
    assert len(cells) == 32 and all(CONTRACT_FIELDS <= set(cell) for cell in lines)
    extended = [cell for cell in cells if cell["stage"] == 2]
    assert len(lines) == 32 + len(extended) and extended  # each extended cell: a stage-1 line, then its final one
    assert {c["cell_id"] for c in cells if c["status"] == "fail"} == INCIDENT_CELLS
    assert {c["status"] for c in cells if c["cell_id"] not in INCIDENT_CELLS} == {"pass"}
    for cell in cells:
        questions = len((run_dir / "questions" / f"{cell['cell_id']}.jsonl").read_text().splitlines())
        if cell["cell_id"] in INCIDENT_CELLS:  # decided by the sequential test at its first look
            assert cell["accuracy"] <= 0.35 and cell["stopped_early"] and questions == cell["n"] <= 100
        else:
            assert cell["accuracy"] >= 0.85 and not cell["stopped_early"]
            assert questions == cell["n"] == (1319 if cell["stage"] == 2 else 200)
        assert Path(cell["log_path"]).is_file() and cell["mlflow_run_id"]
    junit = ElementTree.parse(run_dir / "junit.xml").getroot()
    assert len(junit.findall("testcase")) == 32 and len(junit.findall("testcase/failure")) == 3
    run_info = json.loads((run_dir / "run.json").read_text())
    assert run_info["counts"] == {"pass": 29, "fail": 3} and run_info["exit_code"] == 1
    assert run_info["gate_budget"].startswith("alpha 0.01 over 32 cells") and "1 later stage(s)" in run_info["gate_budget"]
    assert run_info["attribution"] == ("model=kimi-linear & attention_backend in {fa3, flashinfer, flashmla} & "
                                       "radix_cache=on & unified_memory=on")
    runs = mlflow_runs(tmp_path, "demo")
    children = children_of(runs)
    assert len(runs) - len(children) == 1 and len(children) == 32
    for child in children:
        assert {"attention_backend", "unified_memory", "radix_cache", "model"} <= set(child.data.params)
        assert {"accuracy", "ci_low", "ci_high", "invalid_rate", "eval_s"} <= set(child.data.metrics)
    assert sorted(c.data.tags["status"] for c in children).count("fail") == 3
    final = {c.data.tags["cell_id"]: c for c in children}  # an extended cell's run shows its final judgement
    for cell in extended:
        run = final[cell["cell_id"]]
        assert run.data.tags["status"] == "pass" and run.data.tags["stage"] == "2" and run.data.metrics["n"] == 1319
    from harness.results.archive import MlflowArchive

    archive = MlflowArchive(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert run_dir.name in {info.run_id for info in archive.runs("demo")}
    assert len(archive.questions(run_dir.name, extended[0]["cell_id"])) == 1319  # what the next night pairs with
    assert "failures share" in result.stdout and "mlflow ui" in result.stdout
