"""How this harness talks to an MLflow store, shared by the writer (`tracking`) and the reader
(`archive`): the client, with bounded retries, and the names of the artifacts a run leaves there
(docs/results-contract.md, "MLflow")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CELLS_ARTIFACT = "cells.jsonl"
# A cell's answers: the table of its first judgement, then the rows its extension added (a table of
# their own: MLflow appends to a table by reading it back with pandas, which turns "16" into 16).
QUESTIONS_ARTIFACT = "questions.json"
EXTENSION_QUESTIONS_ARTIFACT = "questions_extension.json"


def mlflow_client(tracking_uri: str) -> Any:
    """An MlflowClient that gives up on an unreachable server after a few seconds, not minutes
    (MLflow's own defaults retry for a long time; a run must not wait on its tracking store)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    from mlflow.tracking import MlflowClient

    if not tracking_uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=tracking_uri)
    return _opened_once(lambda: MlflowClient(tracking_uri=tracking_uri),
                        Path(tracking_uri.removeprefix("sqlite:///")))


def _opened_once(open_client: Any, database: Path) -> Any:
    """Open a SQLite store under an exclusive lock beside it. MLflow creates and migrates the schema
    the first time a process opens the file (in MlflowClient's constructor, and at the first query);
    two processes doing it at once (two `regress eval`, `make demo` twice) race in Alembic and leave
    it half-migrated for good ("duplicate column name: step"). Under the lock the first migrates,
    the rest find it done."""
    import fcntl

    database.parent.mkdir(parents=True, exist_ok=True)
    with open(database.with_name(database.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            client = open_client()
            client.search_experiments(max_results=1)
            return client
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
