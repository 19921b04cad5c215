"""`regress sync RUN_ID`: upload a results folder to MLflow after the fact (the tracking server was
down during the run, or the run used --no-tracking). Idempotent: the parent run is found by its
results run id and cells already logged are skipped, so syncing twice creates no duplicates."""

from __future__ import annotations

from harness.errors import TrackingError
from harness.records import RunInfo
from harness.results.sinks import FinishedCell, MlflowSink
from harness.results.store import ResultsStore
from harness.results.tracking import Tracker


def sync_run(store: ResultsStore, tracking_uri: str) -> tuple[RunInfo, int]:
    """Returns the updated run info and how many cells were logged now."""
    info = store.read_run()
    results = store.cells()
    sink = MlflowSink(Tracker(tracking_uri))
    params = {"suite": info.suite, "engine": info.engine, "protocol": info.protocol,
              "protocol_fingerprint": info.protocol_fingerprint, "dataset_sha256": info.dataset_sha256,
              "results_dir": str(store.path), "synced": "true"}
    info = sink.open(info, params)
    _stop_if_failed(sink, f"cannot sync {info.run_id} to {tracking_uri}")
    already = sink.tracker.logged_cells()
    updated = []
    for result in results:
        log_path = store.path / "logs" / f"{result.cell_id}.log"
        log = log_path.read_text() if log_path.is_file() else ""
        updated.append(sink.cell(FinishedCell(result, store.read_questions(result.cell_id), result.resolved, log)))
        _stop_if_failed(sink, f"sync of {info.run_id} stopped")
    info = sink.close(info, updated)
    _stop_if_failed(sink, f"sync of {info.run_id} stopped")
    store.rewrite_cells(updated)
    store.write_run(info)
    return info, len([r for r in results if r.cell_id not in already])


def _stop_if_failed(sink: MlflowSink, what: str) -> None:
    if sink.tracker.error:
        raise TrackingError(f"{what}: {sink.tracker.error}; run it again to continue")
