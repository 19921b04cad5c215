"""MLflow writes that a crash or a lost tracking server cannot double: a cell's child run cut off
while RUNNING is adopted on the next resume or sync, never joined by a second one."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from harness.records import Status
from harness.results.tracking import Tracker
from tests.records import answer, result, run_info


def test_a_child_left_running_is_adopted_not_doubled(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    info = run_info("night-1", suite="nightly", protocol_fingerprint="fp")
    first = Tracker(uri)
    parent = first.start(info, {"suite": "nightly"})
    first.log_cell(result("m.a", Status.PASS, accuracy=0.9, n=1), [answer(0, True)], {}, "")
    # The driver dies while the second cell's child is being logged: created, tagged, never closed.
    client = MlflowClient(tracking_uri=uri)
    cut_off = client.create_run(first.experiment_id, run_name="m.b",
                                tags={"mlflow.parentRunId": parent, "cell_id": "m.b"}).info.run_id
    stray = client.create_run(first.experiment_id, run_name="m.a",
                              tags={"mlflow.parentRunId": parent, "cell_id": "m.a"}).info.run_id

    resumed = Tracker(uri)  # `--resume` or `regress sync`
    assert resumed.start(info, {"suite": "nightly"}) == parent
    assert resumed.log_cell(result("m.b", Status.FAIL, accuracy=0.2, n=1), [answer(0, False)], {}, "log") == cut_off
    assert resumed.log_cell(result("m.a", Status.PASS, accuracy=0.9, n=1), [answer(0, True)], {}, "") != stray
    assert resumed.error is None
    children = client.search_runs([first.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    by_cell = {}
    for child in children:
        by_cell.setdefault(child.data.tags["cell_id"], []).append(child.info.status)
    assert sorted(by_cell["m.b"]) == ["FINISHED"]  # adopted and closed, not a second run
    assert sorted(by_cell["m.a"]) == ["FINISHED", "KILLED"]  # the finished one kept, the stray closed
    adopted = client.get_run(cut_off)
    assert adopted.data.params["model"] == "m" and adopted.data.tags["status"] == "fail"


def test_four_processes_opening_a_fresh_sqlite_store_at_once_all_get_a_working_store(tmp_path):
    """Two terminals, two CI shards, `make demo` twice: without the lock MLflow's schema migration
    raced and left the store half-migrated for good."""
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT, machine_s

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    script = ("import sys; from harness.results.mlflow_layout import mlflow_client; "
              "client = mlflow_client(sys.argv[1]); client.create_experiment('e' + sys.argv[2]); print('ok')")
    # A cache without the schema template: the four also race to build it (under its own lock).
    env = {**os.environ, "REGRESS_CACHE_DIR": str(tmp_path / "cache")}
    processes = [subprocess.Popen([sys.executable, "-c", script, uri, str(n)], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for n in range(4)]
    outputs = [p.communicate(timeout=machine_s(300)) for p in processes]
    assert all(p.returncode == 0 for p in processes), [err[-800:] for _, err in outputs]
    names = {e.name for e in MlflowClient(tracking_uri=uri).search_experiments()}
    assert {"e0", "e1", "e2", "e3"} <= names
    assert [p.name for p in (tmp_path / "cache").glob("mlflow-*-empty.db")] and not list(tmp_path.glob("**/.*.tmp"))


def test_a_fresh_store_is_a_copy_of_the_migrated_template_and_works_like_one_migrated_in_place(tmp_path, monkeypatch):
    from harness.results.mlflow_layout import mlflow_client

    monkeypatch.setenv("REGRESS_CACHE_DIR", str(tmp_path / "cache"))
    first = mlflow_client(f"sqlite:///{tmp_path / 'a.db'}")  # builds the template, then copies it
    (template,) = (tmp_path / "cache").glob("mlflow-*-empty.db")
    second = mlflow_client(f"sqlite:///{tmp_path / 'b.db'}")  # a copy of it
    assert (tmp_path / "b.db").stat().st_size == template.stat().st_size
    for client in (first, second):
        experiment = client.create_experiment("demo", artifact_location=(tmp_path / "art").as_uri())
        run = client.create_run(experiment)
        client.log_metric(run.info.run_id, "accuracy", 0.9)
        assert client.get_run(run.info.run_id).data.metrics == {"accuracy": 0.9}
    monkeypatch.setenv("REGRESS_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    (tmp_path / "a-file").write_text("")  # no cache can be made: MLflow migrates the store itself
    third = mlflow_client(f"sqlite:///{tmp_path / 'c.db'}")
    assert third.search_experiments(max_results=1) and (tmp_path / "c.db").exists()


def test_a_tracker_in_a_child_process_logs_what_one_in_process_logs_and_resumes_the_same(tmp_path):
    """`regress eval`'s tracker: MLflow in a process of its own, the same runs in the same store."""
    from harness.results.tracker_process import TrackerProcess

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    info = run_info("eval-1", suite="eval", protocol_fingerprint="fp")
    first = TrackerProcess(uri)
    first.connect(info.suite)  # returns at once; the child imports MLflow meanwhile
    parent = first.start(info, {"base_url": "http://x"})
    cell = first.log_cell(result("m.a", Status.FAIL, accuracy=0.2, n=2, self_check_p={"co-batch": 1e-6, "replay": 0.5},
                                 self_check_high={"co-batch": 0.8}), [answer(0, True), answer(1, False)],
                          {"attention_backend": "fa3"}, "server log")
    first.finish(info, {"summary.md": "# eval-1"})
    first.close()
    assert first.error is None and parent and cell and first.experiment_id
    assert first.logged_cells() == {"m.a"}
    client = MlflowClient(tracking_uri=uri)
    (child,) = client.search_runs([first.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert child.info.run_id == cell and child.data.metrics["accuracy"] == 0.2 and child.data.tags["status"] == "fail"
    assert {key: value for key, value in child.data.metrics.items() if key.startswith("self_check")} == {
        "self_check_co_batch_p": 1e-6, "self_check_replay_p": 0.5, "self_check_co_batch_high": 0.8}
    assert {a.path for a in client.list_artifacts(cell)} >= {"questions.json", "server.log", "server_info.json"}

    resumed = TrackerProcess(uri)
    assert resumed.start(info, {"base_url": "http://x"}) == parent  # found again, not a second parent
    assert resumed.logged_cells() == {"m.a"}
    resumed.close()


def test_a_sqlite_store_not_yet_created_is_read_as_no_runs_without_importing_mlflow(tmp_path):
    """A first run's history: no store to read, and MLflow (~1.2 s of CPU to import) is not
    imported, nor the file created, to learn that."""
    database = tmp_path / "results" / "mlflow.db"
    probe = ("import sys; from pathlib import Path; from harness.results.archive import archives; "
             f"runs = archives(Path({str(tmp_path / 'results')!r}), {f'sqlite:///{database}'!r}).runs('nightly'); "
             "print(runs, 'mlflow' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert shown.split() == ["[]", "False"] and not database.exists()


def test_a_child_tracker_outlives_the_sigint_and_sigterm_its_process_group_gets(tmp_path):
    """A cancelled CI job signals the whole group; the parent still has to mark its run, so the
    logger keeps serving until the parent closes the pipe."""
    import signal

    from harness.results.tracker_process import TrackerProcess

    tracker = TrackerProcess(f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker.connect("eval")
    info = run_info("eval-3", suite="eval", protocol_fingerprint="fp")
    assert tracker.start(info, {}) is not None  # the child has set its handlers by now
    for stop in (signal.SIGINT, signal.SIGTERM):
        tracker._child.send_signal(stop)
    tracker.finish(info, {"summary.md": "# eval-3"})
    child = tracker._child
    tracker.close()
    assert tracker.error is None and child.returncode == 0


def test_a_child_tracker_that_dies_turns_tracking_off_with_the_reason_and_nothing_raises(tmp_path):
    from harness.results.tracker_process import TrackerProcess

    tracker = TrackerProcess(f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker.connect("eval")
    tracker._child.kill()  # an OOM kill, a node's cgroup: the logger is gone
    tracker._child.wait()
    info = run_info("eval-2", suite="eval", protocol_fingerprint="fp")
    assert tracker.start(info, {}) is None
    assert "MLflow logger process ended (exit code -9)" in tracker.error
    assert tracker.log_cell(result("m.a", Status.PASS, accuracy=1.0, n=1), [answer(0, True)], {}, "") is None
    tracker.finish(info, {})  # still nothing raised
    tracker.close()


def test_a_tracking_server_whose_port_refuses_is_no_history_and_no_wait():
    """Nothing listens: the archive has no history and says why, the tracker turns off, both on the
    harness's own probe (its message), before MLflow would retry the refused connection with backoff
    (~4.6 s a call; its own message says "Max retries exceeded")."""
    from harness.engine.ports import free_port
    from harness.results.archive import MlflowArchive

    port = free_port()  # bound, then closed: nothing listens on it
    archive = MlflowArchive(f"http://127.0.0.1:{port}")
    assert archive.runs("nightly") == [] and archive.cells("any") == []
    tracker = Tracker(f"http://127.0.0.1:{port}")
    tracker.connect("nightly")
    for error in (archive.error, tracker.error):
        assert error and f"nothing listens at 127.0.0.1:{port} (connection refused)" in error, error


def test_a_tracking_server_behind_a_proxy_is_left_to_mlflow(monkeypatch):
    """The probe connects directly: a server reached through a proxy is not judged by it."""
    from harness.engine.ports import free_port
    from harness.results.mlflow_layout import _refuse_if_nothing_listens

    port = free_port()
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConnectionRefusedError, match="nothing listens"):
        _refuse_if_nothing_listens(f"http://127.0.0.1:{port}")
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    _refuse_if_nothing_listens(f"http://127.0.0.1:{port}")  # no error: MLflow goes through the proxy
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with pytest.raises(ConnectionRefusedError):
        _refuse_if_nothing_listens(f"http://127.0.0.1:{port}")
