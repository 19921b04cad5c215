"""`regress sync RUN_ID`: upload a results folder to MLflow after the fact (the tracking server was
down during the run, or the run used --no-tracking). Idempotent: the parent run is found by its
results run id and cells already logged are skipped, so syncing twice creates no duplicates."""

from __future__ import annotations

from harness.errors import TrackingError
from harness.results.records import RunInfo
from harness.results.store import ResultsStore
from harness.results.tracking import Tracker


def sync_run(store: ResultsStore, tracking_uri: str) -> tuple[RunInfo, int]:
    """Returns the updated run info and how many cells were logged now."""
    info = store.read_run()
    results = store.cells()
    tracker = Tracker(tracking_uri)
    params = {"suite": info.suite, "engine": info.engine, "protocol": info.protocol,
              "protocol_fingerprint": info.protocol_fingerprint, "dataset_sha256": info.dataset_sha256,
              "results_dir": str(store.path), "synced": "true"}
    parent = tracker.start(info, params)
    if parent is None:
        raise TrackingError(f"cannot sync {info.run_id} to {tracking_uri}: {tracker.error}")
    already = tracker.logged_cells()
    updated = []
    for result in results:
        log_path = store.path / "logs" / f"{result.cell_id}.log"
        log = log_path.read_text() if log_path.is_file() else ""
        run_id = tracker.log_cell(result, store.read_questions(result.cell_id), result.resolved, log)
        if tracker.error:
            raise TrackingError(f"sync of {info.run_id} stopped: {tracker.error}; run it again to continue")
        updated.append(result.model_copy(update={"mlflow_run_id": run_id}))
    info = info.model_copy(update={"mlflow_run_id": parent, "mlflow_experiment_id": tracker.experiment_id,
                                   "tracking_uri": tracking_uri, "tracking_error": None})
    tracker.finish(info, {"summary.md": (store.path / "summary.md").read_text()} if (store.path / "summary.md").exists() else {})
    if tracker.error:
        raise TrackingError(f"sync of {info.run_id} stopped: {tracker.error}; run it again to continue")
    store.rewrite_cells(updated)
    store.write_run(info)
    return info, len([r for r in results if r.cell_id not in already])
