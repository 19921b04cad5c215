"""Assembling the results contract: a CellResult from measurements and a verdict, and a run's
closing files (summary.md, junit.xml, run.json). Shared by `regress run` and `regress eval`."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from harness.engine.verify import resolved_subset
from harness.gate.verdict import Verdict
from harness.results.records import CellOutcome, CellResult, RunInfo, Throughput
from harness.results.reporting import counts, junit_xml, summary_markdown
from harness.results.store import ResultsStore
from harness.results.tracking import Tracker


def cell_result(*, cell_id: str, model: str, factors: dict[str, str], reference_cell: str | None, floor: float,
                outcome: CellOutcome, verdict: Verdict, fingerprint: str, log_path: Path | None,
                history_run_id: str | None = None) -> CellResult:
    score = outcome.score
    reason = verdict.reason
    if outcome.log_tail and outcome.error is not None:
        reason += "\n--- server log tail ---\n" + outcome.log_tail
    return CellResult(
        cell_id=cell_id, model=model, factors=factors, args=outcome.args,
        resolved=resolved_subset(outcome.server.resolved), status=verdict.status, reason=reason,
        accuracy=verdict.accuracy, n=verdict.n, correct=verdict.correct, ci_low=verdict.ci_low,
        ci_high=verdict.ci_high, invalid_rate=score.invalid_rate if score else None,
        truncated_rate=score.truncated_rate if score else None, reference_cell=reference_cell,
        agreement=verdict.agreement, mcnemar_p=verdict.mcnemar_p, floor_p=verdict.floor_p, threshold=floor,
        timings=outcome.timings, throughput=score.throughput if score else Throughput(),
        log_path=str(log_path) if log_path else None, protocol_fingerprint=fingerprint,
        server_version=outcome.server.version, cuda_visible_devices=outcome.server.cuda_visible_devices,
        node=outcome.server.node, stopped_early=outcome.stopped_early is not None,
        history_run_id=history_run_id if verdict.history_p is not None else None, history_p=verdict.history_p)


def sink_cell(store: ResultsStore, tracker: Tracker | None, result: CellResult, outcome: CellOutcome,
              log: str) -> CellResult:
    """Write one finished cell everywhere: questions, MLflow child run, then its cells.jsonl line."""
    store.write_questions(result.cell_id, outcome.questions)
    if tracker is not None:
        run_id = tracker.log_cell(result, outcome.questions, outcome.server.resolved, log)
        result = result.model_copy(update={"mlflow_run_id": run_id})
    store.append_cell(result)
    return result


def close_run(store: ResultsStore, info: RunInfo, results: list[CellResult], tracker: Tracker | None,
              exit_code: int, **updates: object) -> RunInfo:
    versions = {r.server_version for r in results if r.server_version and r.server_version != "None"}
    info = info.model_copy(update={
        "ended_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "counts": counts(results),
        "exit_code": exit_code, "sglang_version": ", ".join(sorted(versions)) or None, **updates})
    summary = summary_markdown(info, results)
    store.write_text("summary.md", summary)
    store.write_text("junit.xml", junit_xml(info, results))
    if tracker is not None:
        tracker.finish(info, {"summary.md": summary})
        info = info.model_copy(update={"tracking_error": tracker.error})
    store.write_run(info)
    return info
