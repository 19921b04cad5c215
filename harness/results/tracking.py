"""MLflow: one experiment per suite, a parent run per invocation, a child run per cell.

Logging goes through `MlflowClient.log_batch` (40 runs in ~1 s over HTTP, against ~4 s for the
fluent API). Tracking is a sink, never a dependency: the first failure turns the tracker off for
the rest of the run, the reason is recorded in run.json, and results/ is complete regardless.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.codes import ExitCode
from harness.results.mlflow_layout import (
    EXTENSION_QUESTIONS_ARTIFACT,
    QUESTIONS_ARTIFACT,
    mlflow_client,
    sqlite_database,
)

if TYPE_CHECKING:
    from harness.records import CellResult, QuestionRecord, RunInfo


def default_tracking_uri(results_dir: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(results_dir / 'mlflow.db').resolve()}"


def _flat(prefix: str, values: dict[str, Any]) -> dict[str, str]:
    return {f"{prefix}{key}": json.dumps(value) if isinstance(value, (dict, list)) else str(value)
            for key, value in values.items()}


# MLflow 3's UI opens an experiment on its GenAI traces overview unless told this is a runs
# experiment; with the tag it opens the runs table (cells by name, sortable by accuracy).
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


# Views of the runs table that the UI opens from a link (`?viewStateShareKey=KEY`): MLflow keeps
# column choices in the browser, so without them a newcomer sees no metric column at all. A view
# is an experiment tag holding the UI's own view state (JSON), as its "Share" button writes it.
SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
CELLS_VIEW, NIGHTS_VIEW = "regress-cells", "regress-runs"
# As many columns as the UI's table shows without scrolling on a laptop: more push the factors and
# the verdict out of view (the table renders only the columns in view).
CELL_METRIC_COLUMNS = ("accuracy", "ci_low", "ci_high", "n", "invalid_rate", "mcnemar_p", "divergence_p", "history_p")
RUN_METRIC_COLUMNS = ("cells_fail", "cells_inconclusive", "cells_error", "cells_mismatch", "cells_pass")


def self_check_metrics(result: CellResult) -> dict[str, float]:
    """The cell's self-checks as metrics: `self_check_co_batch_p`, `self_check_cache_high`, ..."""
    found = {f"self_check_{name.replace('-', '_')}_p": p for name, p in result.self_check_p.items()}
    found.update({f"self_check_{name.replace('-', '_')}_high": high for name, high in result.self_check_high.items()})
    return found


def _question_row(record: QuestionRecord) -> dict[str, Any]:
    """A question as one row of the MLflow table: the teacher-forced pass summarised (its tokens'
    log-probabilities stay in the results folder's questions/<cell>.jsonl; the divergence test
    reads them there, from the same run, and nothing reads them back from MLflow)."""
    row = record.model_dump(exclude={"teacher"})
    teacher = record.teacher
    if teacher is not None:
        row |= {"teacher_tokens": len(teacher.token_ids), "teacher_cached_tokens": teacher.cached_tokens,
                "teacher_mean_logprob": sum(teacher.logprobs) / len(teacher.logprobs) if teacher.logprobs else None,
                "teacher_error": teacher.error}
    return row


def shared_views(factors: list[str]) -> dict[str, dict[str, Any]]:
    """The view states of the two links a run prints: its cells, lowest accuracy first, with their
    metrics, factors and verdict as columns; and the suite's runs, newest first, with their verdicts."""
    cells = {"searchFilter": "tags.cell_id LIKE '%'", "orderByKey": "metrics.`accuracy`", "orderByAsc": True,
             "selectedColumns": [*(f"metrics.`{m}`" for m in CELL_METRIC_COLUMNS), "params.`model`",
                                 *(f"params.`{f}`" for f in factors), "tags.`status`"],
             "runsHiddenMode": "SHOW_ALL"}
    nights = {"searchFilter": "tags.results_run_id LIKE '%'", "orderByKey": "attributes.start_time",
              "orderByAsc": False,
              "selectedColumns": [*(f"metrics.`{m}`" for m in RUN_METRIC_COLUMNS), "tags.`verdict`",
                                  "tags.`trigger`", "tags.`sglang_version`", "tags.`attribution`"],
              "runsHiddenMode": "SHOW_ALL"}
    return {CELLS_VIEW: cells, NIGHTS_VIEW: nights}


def view_url(ui: str, experiment_id: str, view: str) -> str:
    """The MLflow UI's runs table of `experiment_id` in one of the `shared_views`."""
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={view}"


def cells_view_url(ui: str, experiment_id: str) -> str:
    """The runs table of this suite's cells, lowest accuracy first, metrics and factors as columns."""
    return view_url(ui, experiment_id, CELLS_VIEW)


def _epoch_ms(iso: str | None) -> int | None:
    return int(datetime.fromisoformat(iso).timestamp() * 1000) if iso else None


@dataclass(frozen=True)
class _Child:
    """A cell's child run as logged: which judgement (stage) and how many question rows it holds."""

    run_id: str
    stage: int = 1
    questions: int = 0
    complete: bool = True  # False: found RUNNING (the logging of it was cut off): logged again, whole


def _cell_params(result: CellResult) -> dict[str, Any]:
    return {"model": result.model, **result.factors, "protocol_fingerprint": result.protocol_fingerprint,
            "reference_cell": result.reference_cell or "", "threshold": result.threshold,
            **_flat("resolved.", result.resolved)}


def run_verdict(exit_code: int | None) -> str:
    """The parent run's `verdict` tag, from the run's exit code (`ExitCode.verdict`)."""
    return ExitCode.word(exit_code)


class Tracker:
    """A thin, failure-tolerant adapter over MlflowClient."""

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self.error: str | None = None
        self.parent_run_id: str | None = None
        self._experiment_id: str | None = None
        self._client: Any = None
        self._children: dict[str, _Child] = {}  # cell id -> its child run already in the store
        self._views_written = False

    def logged_cells(self) -> set[str]:
        """Cell ids already logged under the parent run (found again on a resume or sync)."""
        return set(self._children)

    def close(self) -> None:
        """Nothing to release in this process (`TrackerProcess.close` ends its child's)."""

    @property
    def experiment_id(self) -> str | None:
        return self._experiment_id

    def log_artifact_text(self, run_id: str, text: str, name: str) -> None:
        self._call(f"logging {name}", self._client.log_text, run_id, text, name)

    def _call(self, what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        if self.error is not None:
            return None
        try:
            return function(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - MLflow raises many types; tracking must never kill a run
            self.error = f"{what} failed ({type(error).__name__}: {str(error)[:300]})"
            return None

    def _connect(self, experiment: str) -> None:
        self._client = mlflow_client(self.tracking_uri)
        found = self._client.get_experiment_by_name(experiment)
        if found:
            self._experiment_id = found.experiment_id
            if EXPERIMENT_KIND_TAG not in found.tags:
                self._client.set_experiment_tag(self._experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            return
        # A SQLite store would put artifacts in ./mlruns of whatever folder the run starts in; keep
        # them next to the database instead. A tracking server decides for itself.
        database = sqlite_database(self.tracking_uri)
        location = (database.parent / "mlartifacts").resolve().as_uri() if database else None
        self._experiment_id = self._client.create_experiment(experiment, artifact_location=location,
                                                             tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})

    def _write_views(self, factors: list[str]) -> None:
        """The experiment's shared views (`shared_views`), rewritten by each run: a suite that gains
        an axis gets its column."""
        for name, state in shared_views(factors).items():
            self._call("writing the UI's views", self._client.set_experiment_tag, self._experiment_id,
                       SHARED_VIEW_TAG_PREFIX + name, json.dumps(state))
        self._views_written = True

    def _existing_parent(self, run_id: str) -> Any:
        found = self._client.search_runs([self._experiment_id], filter_string=f"tags.results_run_id = '{run_id}'",
                                         max_results=1)
        return found[0] if found else None

    def _existing_children(self) -> dict[str, _Child]:
        """The cells' child runs under the parent. A child left RUNNING (the tracking server died while
        it was logged, or the driver was killed) is adopted and logged again whole, never doubled by a
        new one; of several runs for one cell, a finished one wins and the others are closed KILLED."""
        found: dict[str, list[Any]] = {}
        page_token = None
        while True:
            page = self._client.search_runs([self._experiment_id], max_results=1000, page_token=page_token,
                                            filter_string=f"tags.mlflow.parentRunId = '{self.parent_run_id}'")
            for run in page:
                if "cell_id" in run.data.tags:
                    found.setdefault(run.data.tags["cell_id"], []).append(run)
            page_token = page.token
            if not page_token:
                break
        children = {}
        for cell_id, runs in found.items():
            runs.sort(key=lambda run: (run.info.status in ("FINISHED", "FAILED"), int(run.data.tags.get("stage", 0)),
                                       run.info.start_time or 0), reverse=True)
            kept, *extra = runs
            tags = kept.data.tags
            done = kept.info.status in ("FINISHED", "FAILED")
            children[cell_id] = _Child(kept.info.run_id, int(tags.get("stage", 1)) if done else 0,
                                       int(tags.get("questions_logged", 0)) if done else 0, complete=done)
            for run in extra:
                if run.info.status not in ("FINISHED", "FAILED", "KILLED"):
                    self._client.set_terminated(run.info.run_id, "KILLED")
        return children

    def connect(self, experiment: str) -> None:
        """Import MLflow, open the store and find (or create) the suite's experiment, once: `start`
        does it when nobody did it before (`regress eval` does it while the questions run)."""
        if self._client is None:
            self._call("connecting to MLflow", self._connect, experiment)

    def start(self, info: RunInfo, params: dict[str, Any]) -> str | None:
        """The parent run of `info.run_id`: found again if it exists (a resume or a sync), else created."""
        self.connect(info.suite)
        existing = self._call("looking up the parent run", lambda: self._existing_parent(info.run_id))
        if existing is not None:
            self.parent_run_id = existing.info.run_id
            self._children = self._call("looking up cell runs", self._existing_children) or {}
            return self.parent_run_id
        run = self._call("creating the parent run", lambda: self._client.create_run(
            self._experiment_id, run_name=info.run_id, start_time=_epoch_ms(info.started_at), tags={
                **info.tags, "trigger": info.trigger, "suite": info.suite, "suite_sha256": info.config_sha256,
                "results_run_id": info.run_id, "engine": info.engine, "git_commit": info.git_commit or "",
                "git_dirty": str(info.git_dirty), "protocol": info.protocol, "verdict": "running"}))
        if run is None:
            return None
        self.parent_run_id = run.info.run_id
        self._batch(self.parent_run_id, params=params)
        self._log_dataset(info)
        return self.parent_run_id

    def _log_dataset(self, info: RunInfo) -> None:
        """The run's benchmark data as its MLflow dataset input (the benchmark's name, the data's digest,
        its protocol), not only a param."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(name=info.benchmark, digest=(info.dataset_sha256 or "unknown")[:36], source_type="local",
                          source=json.dumps({"dataset_sha256": info.dataset_sha256, "protocol": info.protocol}))
        self._call("logging the dataset input", self._client.log_inputs, self.parent_run_id,
                   datasets=[DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "evaluation")])])

    def _batch(self, run_id: str, params: dict[str, Any] | None = None, metrics: dict[str, float] | None = None,
               tags: dict[str, str] | None = None, step: int = 0) -> None:
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.utils.time import get_current_time_millis

        now = get_current_time_millis()
        params_list = [Param(k, str(v)[:6000]) for k, v in (params or {}).items()]
        metric_list = [Metric(k, float(v), now, step) for k, v in (metrics or {}).items() if v is not None]
        tag_list = [RunTag(k, str(v)[:5000]) for k, v in (tags or {}).items()]
        for start in range(0, max(len(params_list), 1), 100):  # MLflow takes 100 params per batch
            self._call("logging to MLflow", self._client.log_batch, run_id, metrics=metric_list if start == 0 else [],
                       params=params_list[start:start + 100], tags=tag_list if start == 0 else [])

    def log_cell(self, result: CellResult, questions: list[QuestionRecord], server_info: dict[str, Any],
                 log_text: str) -> str | None:
        """One child run: params, metrics, tags, the per-question table, the server log and info.
        A cell already logged under this parent is not logged twice; a later judgement of it (stage 2,
        after the extension) updates its run: the verdict, the metrics, the new question rows."""
        if self.parent_run_id is None or self.error is not None:
            return None
        logged = self._children.get(result.cell_id)
        if logged is not None and logged.complete and result.stage <= logged.stage:
            return logged.run_id
        if logged is None:
            run_id = self._create_cell_run(result)
            if run_id is None:
                return None
        else:
            run_id = logged.run_id
            if not logged.complete:  # adopted: its params may never have been logged
                self._log_cell_params(run_id, result)
        fresh = logged is None or not logged.complete
        metrics = {"accuracy": result.accuracy, "ci_low": result.ci_low, "ci_high": result.ci_high,
                   "n": result.n, "correct": result.correct, "invalid_rate": result.invalid_rate,
                   "truncated_rate": result.truncated_rate, "agreement": result.agreement,
                   "mcnemar_p": result.mcnemar_p, "floor_p": result.floor_p, "history_p": result.history_p,
                   "divergence_p": result.divergence_p, "divergence_share": result.divergence_share,
                   "divergence_nats": result.divergence_nats, "divergence_top1": result.divergence_top1,
                   "divergence_high": result.divergence_high,
                   "startup_s": result.timings.startup_s, "eval_s": result.timings.eval_s,
                   "total_s": result.timings.total_s, "queued_s": result.timings.queued_s,
                   "requests_per_s": result.throughput.requests_per_s,
                   "output_tokens_per_s": result.throughput.output_tokens_per_s,
                   **self_check_metrics(result)}
        self._batch(run_id, metrics=metrics, step=result.stage - 1,
                    tags={"status": result.status.value, "cell_id": result.cell_id, "reason": result.reason,
                          "stage": str(result.stage), "questions_logged": str(len(questions))})
        already = 0 if fresh else logged.questions
        if questions[already:]:
            import pandas

            # The rows the earlier judgement lacked go to a table of their own (see archive's artifacts).
            table = pandas.DataFrame([_question_row(q) for q in questions[already:]])
            name = EXTENSION_QUESTIONS_ARTIFACT if already else QUESTIONS_ARTIFACT
            self._call("logging the question table", self._client.log_table, run_id, table, name)
        if server_info and fresh:
            self._call("logging server info", self._client.log_dict, run_id, server_info, "server_info.json")
        if log_text and fresh:
            self._call("logging the server log", self._client.log_text, run_id, log_text, "server.log")
        # FINISHED: the cell was measured to the end (its verdict is the `status` tag). The run's
        # duration is the time the cell held its GPUs, not the time logging took.
        ended_ms = int(result.timings.ended_at * 1000) if result.timings.ended_at else None
        self._call("closing a cell run", self._client.set_terminated, run_id, "FINISHED", ended_ms)
        if self.error is not None:
            return None
        self._children[result.cell_id] = _Child(run_id, result.stage, len(questions))
        return run_id

    def _create_cell_run(self, result: CellResult) -> str | None:
        """A new child run for the cell, with its params (MLflow params never change afterwards)."""
        started_ms = int(result.timings.started_at * 1000) if result.timings.started_at else None
        # The cell id is a tag from the start: a child cut off before anything else was logged is
        # still found (and adopted) by a resume or a sync.
        run = self._call("creating a cell run", lambda: self._client.create_run(
            self._experiment_id, run_name=result.cell_id, start_time=started_ms,
            tags={"mlflow.parentRunId": self.parent_run_id, "cell_id": result.cell_id}))
        if run is None:
            return None
        if not self._views_written:
            self._write_views(list(result.factors))
        self._batch(run.info.run_id, params=_cell_params(result))
        return run.info.run_id

    def _log_cell_params(self, run_id: str, result: CellResult) -> None:
        """The params an adopted child lacks (MLflow refuses to change a param, so only the missing)."""
        existing = self._call("reading a cell run", self._client.get_run, run_id)
        if existing is None:
            return
        missing = {k: v for k, v in _cell_params(result).items() if k not in existing.data.params}
        if missing:
            self._batch(run_id, params=missing)

    def finish(self, info: RunInfo, artifacts: dict[str, str]) -> None:
        if self.parent_run_id is None:
            return
        metrics = {f"cells_{status}": count for status, count in info.counts.items()}
        self._batch(self.parent_run_id, metrics=metrics | {"exit_code": info.exit_code or 0},
                    tags={"attribution": info.attribution or "", "exit_code": str(info.exit_code),
                          "verdict": run_verdict(info.exit_code), "sglang_version": info.sglang_version or ""})
        for name, text in artifacts.items():
            self._call(f"logging {name}", self._client.log_text, self.parent_run_id, text, name)
        # A run that completed and found regressions did its job: FINISHED, with the `verdict` tag;
        # KILLED only when it was interrupted.
        self._call("closing the parent run", self._client.set_terminated, self.parent_run_id,
                   "KILLED" if info.interrupted else "FINISHED", _epoch_ms(info.ended_at))
