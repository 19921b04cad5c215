"""Against a real `mlflow server` (SQLite backend, loopback): the parent and child runs, params,
metrics, tags, the table and dashboard artifacts; then the server is stopped mid-run and the run
is synced afterwards."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from harness.cli import app
from harness.engine.ports import free_port
from harness.records import RunInfo
from harness.results.mlflow_layout import mlflow_client
from harness.results.tracking import NIGHTS_VIEW, cells_view_url, view_url
from tests.helpers import INCIDENT_WORLD, few_questions_suite, machine_s
from tests.test_run_end_to_end import children_of


class TrackingServer:
    """A real `mlflow server` on a free loopback port, shared by this module's tests (each start
    costs ~7 s of CPU); a test may stop it and start it again on the same port and store."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        # The server's store starts migrated, as the harness's own SQLite stores do (a copy of the
        # machine's empty template), so the server skips MLflow's migrations: /health answered after
        # 6.7-7.3 s against 7.9-8.5 s from an empty file (session 12, 2 quiet cores).
        store = f"sqlite:///{self.folder / 'server.db'}"
        mlflow_client(store)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", store,
             "--default-artifact-root", str(self.folder / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + machine_s(90)
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise AssertionError("mlflow server did not start in 90 s")

    def running(self) -> TrackingServer:
        """Started again if a test stopped it (and failed before starting it again)."""
        if self.process is None:
            self.start()
        return self

    def stop(self) -> None:
        if self.process is None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=machine_s(20))
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process = None


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory) -> Iterator[TrackingServer]:
    server = TrackingServer(tmp_path_factory.mktemp("mlflow-server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_runs_on_a_tracking_server_then_it_goes_down_and_sync_completes(ray_local, tracking_server, tmp_path):
    server = tracking_server.running()
    uri = server.uri
    result = CliRunner().invoke(app, ["run", "configs/demo.yaml", "--results-dir", str(tmp_path / "results"),
                                      "--tracking-uri", uri, "--num-questions", "40", "--quiet", "--select",
                                      "model=kimi-linear,radix_cache=on"], catch_exceptions=False)
    assert result.exit_code == 1
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("demo")
    runs = client.search_runs([experiment.experiment_id])
    children = children_of(runs)
    assert len(runs) == 1 + 8 and len(children) == 8
    parent = next(r for r in runs if r not in children)
    assert parent.data.tags["trigger"] == "manual" and "attribution" in parent.data.tags
    failing = next(c for c in children if c.data.tags["cell_id"] == "kimi-linear.ab-fa3.um-on.rc-on")
    assert failing.data.tags["status"] == "fail" and failing.data.params["attention_backend"] == "fa3"
    assert failing.data.metrics["accuracy"] < 0.5 and "ci_low" in failing.data.metrics
    artifacts = {a.path for a in client.list_artifacts(failing.info.run_id)}
    assert {"questions.json", "server.log", "server_info.json"} <= artifacts
    dashboard = CliRunner().invoke(app, ["dashboard", "demo", "--results-dir", str(tmp_path / "results"),
                                         "--output", str(tmp_path / "demo.html"), "--tracking-uri", uri])
    assert dashboard.exit_code == 0
    assert "dashboard.html" in {a.path for a in client.list_artifacts(parent.info.run_id)}

    # Now the server goes down in the middle of a run: the run completes, results/ is whole.
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["latency"] = {"slots": 4, "base_s": 0.05, "startup_s": 0.5}
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(world))
    suite = yaml.safe_load(open("configs/demo.yaml"))
    suite["sim_world"] = str(tmp_path / "slow.yaml")
    suite["cluster"]["gpus"] = 4  # two rounds of 4 cells: the server goes down after the first two cells
    few_questions_suite(suite)  # 40 questions: a gate they can meet
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    runner = subprocess.Popen([str(Path(sys.executable).parent / "regress"), "run", str(tmp_path / "demo.yaml"),
                               "--results-dir", str(tmp_path / "results2"), "--tracking-uri", uri, "--quiet",
                               "--num-questions", "40", "--select", "model=deepseek-v2-lite,radix_cache=on"])
    deadline = time.monotonic() + machine_s(180)
    while time.monotonic() < deadline:
        found = list((tmp_path / "results2").glob("demo-*/cells.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    server.stop()
    assert runner.wait(timeout=machine_s(300)) == 0  # DeepSeek runs no wrapper: every cell passes
    run_dir = next((tmp_path / "results2").glob("demo-*"))
    assert len((run_dir / "cells.jsonl").read_text().splitlines()) == 8
    lost = RunInfo.model_validate_json((run_dir / "run.json").read_text())
    assert lost.tracking_error and lost.tracking_uri == uri  # run.json says MLflow was not updated, and where
    server.start()
    for _ in range(2):
        synced = CliRunner().invoke(app, ["sync", run_dir.name, "--results-dir", str(tmp_path / "results2"),
                                          "--tracking-uri", uri], catch_exceptions=False)
        assert synced.exit_code == 0, synced.output
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.results_run_id = '{run_dir.name}'")
    assert len(runs) == 1
    assert len(children_of(client.search_runs([experiment.experiment_id], max_results=1000))) == 8 + 8


def ui_dom(url: str) -> str:
    """The MLflow UI's page at `url` as headless Chromium renders it (its script run, its API calls
    answered), wide enough that the runs table renders every column it was asked for."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: `make test` installs it (apt-get install chromium)"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=2600,1400", "--virtual-time-budget=30000"]
    done = subprocess.run([chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=machine_s(180))
    return done.stdout


@pytest.mark.slow
@pytest.mark.browser
def test_two_nights_on_clean_runners_share_their_history_through_the_tracking_server(ray_local, tracking_server,
                                                                                     tmp_path):
    """CI runners start with an empty results/ every night: the second night pairs every cell with
    the first through MLflow alone, and compare and the dashboard read both nights from it."""
    uri = tracking_server.running().uri
    select = ["--select", "model=deepseek-v2-lite,radix_cache=on", "--num-questions", "40", "--quiet"]
    # The demo as a suite (so an experiment) of its own on the shared server; 40 questions: a gate they can meet.
    suite = tmp_path / "nights.yaml"
    suite.write_text(yaml.safe_dump({**few_questions_suite(yaml.safe_load(open("configs/demo.yaml"))), "suite": "nights"},
                                    sort_keys=False))
    nights = []
    for runner in ("runner-1", "runner-2"):
        result = CliRunner().invoke(app, ["run", str(suite), "--results-dir", str(tmp_path / runner),
                                          "--tracking-uri", uri, "--trigger", "nightly", *select],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        (run_dir,) = (tmp_path / runner).glob("nights-*")
        nights.append([json.loads(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()])
    first_run = next((tmp_path / "runner-1").glob("nights-*")).name
    assert len(nights[1]) == 8
    for cell in nights[1]:
        assert cell["history_p"] is not None and cell["history_run_id"] == first_run, cell["cell_id"]
    empty = tmp_path / "runner-3"
    compared = CliRunner().invoke(app, ["compare", "previous:nights", "latest:nights", "--results-dir", str(empty),
                                        "--tracking-uri", uri, "--markdown", str(tmp_path / "diff.md")])
    assert compared.exit_code == 0, compared.output
    diff = (tmp_path / "diff.md").read_text()
    assert "8 still passing" in diff and first_run in diff
    page = tmp_path / "nights.html"
    built = CliRunner().invoke(app, ["dashboard", str(suite), "--results-dir", str(empty),
                                     "--tracking-uri", uri, "--output", str(page)])
    assert built.exit_code == 0, built.output
    html = page.read_text()
    assert first_run in html and next((tmp_path / "runner-2").glob("nights-*")).name in html
    assert 'id="history-plot"' in html and "deepseek-v2-lite.ab-fa3.um-on.rc-on" in html

    # The links a run prints open MLflow's own runs table with the columns people compare.
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("nights")
    parents = [r for r in client.search_runs([experiment.experiment_id]) if "results_run_id" in r.data.tags]
    assert {p.info.status for p in parents} == {"FINISHED"} and len(parents) == 2
    cells_page = ui_dom(cells_view_url(uri, experiment.experiment_id))
    for column in ("accuracy", "ci_low", "ci_high", "n", "mcnemar_p", "divergence_p", "history_p",
                   "attention_backend", "unified_memory", "status"):
        assert f">{column}<" in cells_page, column
    assert cells_page.count("deepseek-v2-lite.ab-fa3.um-on.rc-on") >= 2  # the cell on both nights
    nights_page = ui_dom(view_url(uri, experiment.experiment_id, NIGHTS_VIEW))
    for column in ("verdict", "cells_pass", "sglang_version"):
        assert f">{column}<" in nights_page, column
    assert first_run in nights_page and ">pass<" in nights_page
