"""Where finished runs can be read back from: a results folder, an MLflow tracking store, or both.

CI runners start clean every night (`actions/checkout` removes results/), so the tracking server is
the history several drivers share. History pairing, `regress compare` and the dashboard read runs
through a `RunArchive`; `archives(results_dir, tracking_uri)` puts the local folder first (complete
and fast) and MLflow second (everything any driver logged).

From MLflow a run is read from what `MlflowSink` writes: the parent run's tags and params (listing),
its `cells.jsonl` artifact (the verdicts, written when the run closes) and each cell run's
`questions.json` table. Runs logged before `cells.jsonl` existed, and interrupted runs, are not listed.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from harness.errors import ConfigError
from harness.records import CellResult, QuestionRecord, RunInfo, latest_per_cell
from harness.results.catalog import relative_name, runs_of
from harness.results.mlflow_layout import (
    CELLS_ARTIFACT,
    EXTENSION_QUESTIONS_ARTIFACT,
    QUESTIONS_ARTIFACT,
    holds_no_runs,
    mlflow_client,
)
from harness.results.store import ResultsStore


class RunArchive(Protocol):
    def runs(self, suite: str) -> list[RunInfo]:
        """Finished (not interrupted) runs of the suite, oldest first."""
        ...

    def cells(self, run_id: str) -> list[CellResult]:
        """The run's cells.jsonl lines (a later line for a cell replaces an earlier one)."""
        ...

    def questions(self, run_id: str, cell_id: str) -> list[QuestionRecord]:
        """Every question the cell answered in that run (empty when unknown)."""
        ...


class FolderArchive:
    """`results/<run_id>/` folders."""

    def __init__(self, results_dir: Path) -> None:
        self.results_dir = Path(results_dir)

    def runs(self, suite: str) -> list[RunInfo]:
        return runs_of(self.results_dir, suite) if self.results_dir.is_dir() else []

    def cells(self, run_id: str) -> list[CellResult]:
        return ResultsStore(self.results_dir, run_id).cells()

    def questions(self, run_id: str, cell_id: str) -> list[QuestionRecord]:
        return ResultsStore(self.results_dir, run_id).read_questions(cell_id)


def _iso(epoch_ms: int | None) -> str | None:
    if epoch_ms is None:
        return None
    return datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")


class MlflowArchive:
    """Runs an MLflow tracking store holds (one experiment per suite)."""

    def __init__(self, tracking_uri: str) -> None:

        self.tracking_uri = tracking_uri
        self.client: Any = None  # opened by the first `runs`, where a store that cannot be reached is no history
        self.error: str | None = None  # why the store could not be read, when it could not
        self._parents: dict[str, Any] = {}  # results run id -> MLflow parent run
        self._cells: dict[str, list[CellResult]] = {}

    def runs(self, suite: str) -> list[RunInfo]:
        if self.client is None and holds_no_runs(self.tracking_uri):  # a first run: nothing to import MLflow for
            return []
        try:
            self.client = self.client or mlflow_client(self.tracking_uri)
            experiment = self.client.get_experiment_by_name(suite)
            found = [] if experiment is None else self.client.search_runs(
                [experiment.experiment_id], filter_string="tags.results_run_id != ''", max_results=5000)
        except Exception as error:  # noqa: BLE001 - an unreachable tracking store is no history, not a crash
            self.error = f"{type(error).__name__}: {str(error)[:200]}"
            return []
        infos = []
        for run in found:
            tags = run.data.tags
            if "mlflow.parentRunId" in tags or run.info.status not in ("FINISHED", "FAILED"):
                continue
            self._parents[tags["results_run_id"]] = run
            infos.append(self._info(suite, run))
        return sorted(infos, key=lambda info: info.started_at)

    def _info(self, suite: str, run: Any) -> RunInfo:
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        counts = {name.removeprefix("cells_"): int(value) for name, value in metrics.items()
                  if name.startswith("cells_")}
        return RunInfo(run_id=tags["results_run_id"], suite=suite, config_path=params.get("results_dir", ""),
                       config_sha256=tags.get("suite_sha256", ""), trigger=tags.get("trigger", "manual"),
                       engine=tags.get("engine", "unknown"), git_commit=tags.get("git_commit") or None,
                       sglang_version=tags.get("sglang_version") or None, harness_version="unknown",
                       protocol=params.get("protocol", "unknown"),
                       protocol_fingerprint=params.get("protocol_fingerprint"),
                       dataset_sha256=params.get("dataset_sha256"), started_at=_iso(run.info.start_time) or "",
                       ended_at=_iso(run.info.end_time), counts=counts,
                       exit_code=int(metrics["exit_code"]) if "exit_code" in metrics else None,
                       mlflow_run_id=run.info.run_id, mlflow_experiment_id=run.info.experiment_id,
                       tracking_uri=self.tracking_uri, attribution=tags.get("attribution") or None)

    def _download(self, run_id: str, artifact: str) -> str | None:
        with tempfile.TemporaryDirectory(prefix="regress-mlflow-") as folder:
            try:
                path = self.client.download_artifacts(run_id, artifact, folder)
            except Exception:  # noqa: BLE001 - MLflow raises many types for a missing artifact; absent is the answer
                return None
            return Path(path).read_text()

    def cells(self, run_id: str) -> list[CellResult]:
        if run_id not in self._cells:
            parent = self._parents.get(run_id)
            text = self._download(parent.info.run_id, CELLS_ARTIFACT) if parent is not None else None
            self._cells[run_id] = [CellResult.model_validate_json(line) for line in (text or "").splitlines()
                                   if line.strip()]
        return self._cells[run_id]

    def questions(self, run_id: str, cell_id: str) -> list[QuestionRecord]:
        cell = next((c for c in reversed(self.cells(run_id)) if c.cell_id == cell_id), None)
        if cell is None or not cell.mlflow_run_id:
            return []
        records = []
        for artifact in (QUESTIONS_ARTIFACT, EXTENSION_QUESTIONS_ARTIFACT):
            text = self._download(cell.mlflow_run_id, artifact)
            if not text:
                continue
            table = json.loads(text)
            records += [QuestionRecord.model_validate(dict(zip(table["columns"], row, strict=True)))
                        for row in table["data"]]
        return records


class Archives:
    """Archives in order: a run is read from the first that lists it."""

    def __init__(self, archives: list[RunArchive]) -> None:
        self.archives = archives
        self._owner: dict[str, RunArchive] = {}

    def runs(self, suite: str) -> list[RunInfo]:
        seen: dict[str, RunInfo] = {}
        for archive in self.archives:
            for info in archive.runs(suite):
                if info.run_id not in seen:
                    seen[info.run_id] = info
                    self._owner[info.run_id] = archive
        return sorted(seen.values(), key=lambda info: info.started_at)

    def _archive(self, run_id: str) -> RunArchive | None:
        return self._owner.get(run_id)

    def cells(self, run_id: str) -> list[CellResult]:
        archive = self._archive(run_id)
        return archive.cells(run_id) if archive else []

    def questions(self, run_id: str, cell_id: str) -> list[QuestionRecord]:
        archive = self._archive(run_id)
        return archive.questions(run_id, cell_id) if archive else []


def archives(results_dir: Path, tracking_uri: str | None) -> Archives:
    """The local results folder, then the tracking store when there is one."""
    chain: list[RunArchive] = [FolderArchive(results_dir)]
    if tracking_uri:
        chain.append(MlflowArchive(tracking_uri))
    return Archives(chain)


@dataclass(frozen=True)
class LoadedRun:
    """A finished run read back from an archive: run.json, its cells, and its answers on demand."""

    info: RunInfo
    cells: dict[str, CellResult]
    archive: RunArchive

    def questions(self, cell_id: str) -> list[QuestionRecord]:
        return self.archive.questions(self.info.run_id, cell_id)


def _suite_of(run_id: str) -> str:
    """`nightly-20261201-020000-ab12` -> `nightly` (run ids are `<suite>-<date>-<time>-<hex>`)."""
    return run_id.rsplit("-", 3)[0]


def find_run(archive: Archives, name: str) -> LoadedRun:
    """A run named by id, results folder, or `latest:<suite>` / `previous:<suite>`."""
    relative = relative_name(name)
    if relative is not None:
        needed, suite = relative
        infos = archive.runs(suite)
        if len(infos) < needed:
            where = ", ".join(type(a).__name__.removesuffix("Archive").lower() for a in archive.archives)
            raise ConfigError(f"{name}: {len(infos)} finished run(s) of suite {suite!r} (looked in: {where}; "
                              "--tracking-uri reads the runs other machines logged)")
        info = infos[-needed]
    elif (Path(name) / "run.json").is_file():
        folder = Path(name)
        archive = Archives([FolderArchive(folder.parent), *archive.archives])
        info = next(i for i in archive.runs(ResultsStore(folder.parent, folder.name).read_run().suite)
                    if i.run_id == folder.name)
    else:
        info = next((i for i in archive.runs(_suite_of(name)) if i.run_id == name), None)
        if info is None:
            raise ConfigError(f"{name}: no such run in the results folder or the tracking store; "
                              "`latest:SUITE` names the newest run of a suite")
    return LoadedRun(info, latest_per_cell(archive.cells(info.run_id)), archive)
