"""How this harness talks to an MLflow store, shared by the writer (`tracking`) and the reader
(`archive`): the client, with bounded retries, and the names of the artifacts a run leaves there
(docs/results-contract.md, "MLflow")."""

from __future__ import annotations

import os
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

    return MlflowClient(tracking_uri=tracking_uri)
