"""Record builders for tests: one place that knows how to make an answer, an outcome or a
cells.jsonl line with only the fields a test cares about."""

from __future__ import annotations

from typing import Any

from harness.benchmark.scoring import score
from harness.records import CellOutcome, CellResult, QuestionRecord, RunInfo, Score, Status, Throughput


def answer(index: int, correct: bool, *, error: str | None = None, prompt_sha: str = "x", **fields: Any) -> QuestionRecord:
    """One answered question (gold "1"; "1" when right, "2" when wrong), or a transport failure."""
    if error is not None:
        return QuestionRecord(index=index, prompt_sha=prompt_sha, gold="1", pred=None, correct=False, finish_reason=None,
                              output="", latency_s=0.0, output_tokens=0, error=error, **fields)
    return QuestionRecord(index=index, prompt_sha=prompt_sha, gold="1", pred="1" if correct else "2", correct=correct,
                          correct_strict=correct, finish_reason="stop", output="", latency_s=0.0, output_tokens=1,
                          **fields)


def answers(pattern: list[bool], start: int = 0, errors: int = 0, **fields: Any) -> list[QuestionRecord]:
    """Questions start, start+1, ... answered as `pattern` says, then `errors` transport failures
    (indices from 100000 are train questions, as GSM8K records them)."""
    out = [answer(start + i, ok, **fields) for i, ok in enumerate(pattern)]
    return out + [answer(start + len(pattern) + i, False, error="HTTP 503", **fields) for i in range(errors)]


def outcome(records: list[QuestionRecord], cell_id: str = "c", **fields: Any) -> CellOutcome:
    """A measured cell with these answers and their score."""
    return CellOutcome(cell_id=cell_id, args=[], score=score(records, 1.0), questions=records, **fields)


def scored(accuracy: float, n: int = 100, cell_id: str = "c") -> CellOutcome:
    """A measured cell known only by its score (no answers to pair)."""
    return CellOutcome(cell_id=cell_id, args=[], score=Score(
        n=n, correct=int(accuracy * n), accuracy=accuracy, correct_strict=0, invalid_rate=0, truncated_rate=0,
        infra_failures=0, retries=0, eval_s=1, throughput=Throughput()))


def result(cell_id: str, status: Status = Status.PASS, model: str = "m", **fields: Any) -> CellResult:
    """A cells.jsonl line with its verdict."""
    return CellResult(cell_id=cell_id, model=model, factors=fields.pop("factors", {}), args=[], resolved={},
                      status=status, reason=fields.pop("reason", f"{status.value} because"), **fields)


def run_info(run_id: str, suite: str = "nightly", **fields: Any) -> RunInfo:
    """A run.json with only what a test sets (engine sglang, protocol clean)."""
    return RunInfo(run_id=run_id, suite=suite, config_path=fields.pop("config_path", ""),
                   config_sha256=fields.pop("config_sha256", ""), engine=fields.pop("engine", "sglang"),
                   harness_version=fields.pop("harness_version", "0"), protocol=fields.pop("protocol", "clean"),
                   started_at=fields.pop("started_at", "2026-12-01T00:00:00+00:00"), **fields)
