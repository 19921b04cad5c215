"""How this harness talks to an MLflow store, shared by the writer (`tracking`) and the reader
(`archive`): the client, with bounded retries, and the names of the artifacts a run leaves there
(docs/results-contract.md, "MLflow")."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CELLS_ARTIFACT = "cells.jsonl"
# A cell's answers: the table of its first judgement, then the rows its extension added (a table of
# their own: MLflow appends to a table by reading it back with pandas, which turns "16" into 16).
QUESTIONS_ARTIFACT = "questions.json"
EXTENSION_QUESTIONS_ARTIFACT = "questions_extension.json"


def mlflow_client(tracking_uri: str) -> Any:
    """An MlflowClient that gives up on an unreachable server after a few seconds, not minutes
    (MLflow's own defaults retry for a long time; a run must not wait on its tracking store), and
    at once, before MLflow is even imported, when nothing listens at the server's address."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    # An artifact read back (a run's cells.jsonl, a cell's questions) draws no progress bar on stderr:
    # `regress assess` and `compare` print one headline, and a CI log should hold just that.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    _refuse_if_nothing_listens(tracking_uri)
    from mlflow.tracking import MlflowClient

    database = sqlite_database(tracking_uri)
    if database is None:
        return MlflowClient(tracking_uri=tracking_uri)
    return _opened_once(lambda: MlflowClient(tracking_uri=tracking_uri), database)


def sqlite_database(tracking_uri: str) -> Path | None:
    """The file of a `sqlite:///PATH` store; None for any other store (a server, a folder)."""
    return Path(tracking_uri.removeprefix("sqlite:///")) if tracking_uri.startswith("sqlite:///") else None


def holds_no_runs(tracking_uri: str) -> bool:
    """True when the store certainly holds no run: a SQLite store whose file does not exist yet.
    Readers skip it without importing MLflow or creating the file (the writer creates it)."""
    database = sqlite_database(tracking_uri)
    return database is not None and not database.exists()


def _refuse_if_nothing_listens(tracking_uri: str, timeout_s: float = 2.0) -> None:
    """ConnectionRefusedError when a tracking server's port refuses connections: MLflow would
    retry that with backoff (~4.6 s a call, measured) although nothing is listening. A port that
    does not answer in `timeout_s`, a name that does not resolve, and a server reached through a
    proxy (HTTP_PROXY and the like: this probe would not go through it) are left to MLflow."""
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    if getproxies().get(parts.scheme) and not proxy_bypass(parts.hostname):
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except ConnectionRefusedError:
        raise ConnectionRefusedError(f"nothing listens at {parts.hostname}:{port} (connection refused): "
                                     "is the MLflow server running?") from None
    except OSError:
        return


def _opened_once(open_client: Any, database: Path) -> Any:
    """Open a SQLite store under an exclusive lock beside it. MLflow creates and migrates the schema
    the first time a process opens the file (in MlflowClient's constructor, and at the first query);
    two processes doing it at once (two `regress eval`, `make demo` twice) race in Alembic and leave
    it half-migrated for good ("duplicate column name: step"). Under the lock the first migrates,
    the rest find it done. A store that does not exist yet starts as a copy of an empty one migrated
    once per machine and MLflow version (`_copy_template`): the ~30 migrations cost ~3 s of CPU."""
    database.parent.mkdir(parents=True, exist_ok=True)
    with _locked(database):
        if not database.exists():
            _copy_template(database)
        client = open_client()
        client.search_experiments(max_results=1)
        return client


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path`'s `.lock` file beside it, for as long as the block runs."""
    import fcntl

    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def schema_cache_dir() -> Path:
    """REGRESS_CACHE_DIR, else `$XDG_CACHE_HOME/regress` (`~/.cache/regress`)."""
    configured = os.environ.get("REGRESS_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "regress"


def _copy_template(database: Path) -> None:
    """Put an empty, migrated store at `database` (which does not exist; its lock is held). Any
    failure leaves it absent, and MLflow then creates and migrates it as before. (MLflow's `Default`
    experiment in the copy keeps the artifact folder of wherever the template was built; the harness
    logs to one experiment per suite, whose artifacts it puts beside the database.)"""
    import shutil

    from mlflow.tracking import MlflowClient
    from mlflow.version import VERSION

    template = schema_cache_dir() / f"mlflow-{VERSION}-empty.db"
    try:
        if not template.exists():
            template.parent.mkdir(parents=True, exist_ok=True)
            with _locked(template):
                if not template.exists():  # another process may have built it while this one waited
                    building = template.with_name(f".{template.name}.{os.getpid()}.tmp")
                    MlflowClient(tracking_uri=f"sqlite:///{building}").search_experiments(max_results=1)
                    os.replace(building, template)
        copying = database.with_name(f".{database.name}.{os.getpid()}.tmp")
        shutil.copyfile(template, copying)
        os.replace(copying, database)
    except Exception:  # noqa: BLE001 - only a shortcut: whatever failed, MLflow migrates the new store itself
        for leftover in (*template.parent.glob(f".{template.name}.{os.getpid()}.tmp"),
                         *database.parent.glob(f".{database.name}.{os.getpid()}.tmp")):
            leftover.unlink(missing_ok=True)
