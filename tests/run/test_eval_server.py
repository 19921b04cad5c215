"""`regress eval` against a running server: what it records, what it refuses to call a pass, and
how it fails when nothing is there."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from pathlib import Path

from typer.testing import CliRunner

from harness.benchmark.gsm8k.protocol import build_plan
from harness.benchmark.scoring import score
from harness.cli import app
from harness.engine.ports import free_port
from harness.engine.server import ServerProcess
from harness.errors import ErrorKind
from harness.records import CellOutcome, QuestionRecord, Status
from harness.run.eval_server import _verdict
from harness.suite.config import GateSpec
from tests.helpers import DEEPSEEK, fault_world, machine_s, make_cell, sim_spec


@contextlib.contextmanager
def running_server(tmp_path: Path, world: Path | None = None, extra_args: list[str] | None = None):
    """A simulated server in a background event loop for the duration of the block."""
    cell = make_cell({"attention_backend": "triton"}, DEEPSEEK, extra_args=extra_args)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = ServerProcess(sim_spec(cell, world) if world else sim_spec(cell), tmp_path / "server.log")
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=machine_s(120))
    try:
        yield server.base_url
    finally:
        server.stop()
        loop.call_soon_threadsafe(loop.stop)


def evaluate(tmp_path: Path, base_url: str, *extra: str):
    return CliRunner().invoke(app, ["eval", "--base-url", base_url, "--num-questions", "40", "--concurrency", "8",
                                    "--results-dir", str(tmp_path / "results"), "--no-tracking", *extra])


def only_cell(tmp_path: Path) -> dict:
    (run_dir,) = (tmp_path / "results").glob("eval-*")
    (line,) = (run_dir / "cells.jsonl").read_text().splitlines()
    return json.loads(line) | {"run": json.loads((run_dir / "run.json").read_text())}


def test_a_healthy_server_with_a_floor_passes_and_the_served_model_name_is_recorded(tmp_path):
    with running_server(tmp_path, extra_args=["--served-model-name", "my-model"]) as url:
        result = evaluate(tmp_path, url, "--floor", "0.5")
    assert result.exit_code == 0, result.output
    cell = only_cell(tmp_path)
    assert cell["status"] == "pass" and cell["model"] == "my-model" and cell["n"] == 40
    assert cell["run"]["started_at"] <= cell["run"]["ended_at"] and cell["run"]["engine"] == "external"


def test_without_a_floor_nothing_passes_not_even_a_server_that_answers_nothing_right(tmp_path):
    world = fault_world(tmp_path, empty_output_rate=1.0)
    with running_server(tmp_path, world) as url:
        result = evaluate(tmp_path, url)
    assert result.exit_code == 3, result.output
    cell = only_cell(tmp_path)
    assert cell["status"] == "inconclusive" and cell["accuracy"] == 0.0 and "no test made" in cell["reason"]


def test_nothing_listening_is_one_line_exit_3_and_writes_nothing(tmp_path):
    result = evaluate(tmp_path, f"http://127.0.0.1:{free_port()}", "--floor", "0.5")
    assert result.exit_code == 3
    assert "nothing answers at" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "results").exists()


def test_a_404_on_generate_says_the_protocol_needs_an_sglang_server(gsm8k):
    plan = build_plan(gsm8k, "sglang-fewshot", 3, 0)
    records = [QuestionRecord(index=i, prompt_sha="s", gold="1", pred=None, correct=False, finish_reason=None,
                              output="", latency_s=0.0, output_tokens=0, error="HTTP 404: Not Found") for i in range(3)]
    outcome = CellOutcome(cell_id="eval", args=[], questions=records, score=score(records, 1.0))
    verdict = _verdict(outcome, plan, 0.5, GateSpec())
    assert verdict.status is Status.ERROR and verdict.error_kind is ErrorKind.TRANSPORT
    assert "needs an sglang server" in verdict.reason and "--protocol clean" in verdict.reason


def test_with_tracking_on_the_eval_lands_in_mlflow_and_its_cells_line_names_the_mlflow_run(tmp_path):
    """MLflow runs in a child process (`TrackerProcess`); the results folder still records its ids."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with running_server(tmp_path) as url:
        result = CliRunner().invoke(app, ["eval", "--base-url", url, "--num-questions", "20", "--concurrency", "8",
                                          "--results-dir", str(tmp_path / "results"), "--floor", "0.5",
                                          "--tracking-uri", uri])
    assert result.exit_code == 0, result.output
    cell = only_cell(tmp_path)
    assert cell["mlflow_run_id"] and cell["run"]["mlflow_run_id"] and cell["run"]["tracking_error"] is None
    client = MlflowClient(tracking_uri=uri)
    child = client.get_run(cell["mlflow_run_id"])
    assert child.data.tags["mlflow.parentRunId"] == cell["run"]["mlflow_run_id"]
    assert child.data.metrics["n"] == 20 and child.data.tags["status"] == "pass"
    assert client.get_run(cell["run"]["mlflow_run_id"]).data.tags["verdict"] == "pass"
