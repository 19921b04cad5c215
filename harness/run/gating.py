"""Judging cells as they finish: each against its floor, its reference cell and its history, then
sent to every sink. `Gating` owns the run's verdict state; nothing else changes it.

A cell that finishes before its reference waits (parked) until the reference is judged, so every
paired test has its reference; a reference that never produces answers releases the cells waiting
on it at the end of the run, judged without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.benchmark.scoring import score
from harness.engine.verify import resolved_subset
from harness.gate.budget import Budget
from harness.gate.verdict import Stage, judge, pass_confidence_per_stage
from harness.records import CellOutcome, CellResult, Status, Throughput, Verdict
from harness.results.sinks import FinishedCell, Sinks
from harness.run.history import History
from harness.suite.config import GateSpec
from harness.suite.matrix import Cell, SkippedCell

JUDGED = (Status.PASS, Status.FAIL, Status.INCONCLUSIVE)  # verdicts made on answers


@dataclass(frozen=True)
class _Waiting:
    cell: Cell
    outcome: CellOutcome
    log: str


def cell_result(outcome: CellOutcome, verdict: Verdict, *, cell_id: str, model: str, factors: dict[str, str],
                reference_cell: str | None, floor: float, fingerprint: str,
                history_run_id: str | None = None) -> CellResult:
    """The cells.jsonl record of a judged cell (a matrix cell, or `regress eval`'s one server)."""
    measured = outcome.score
    reason = verdict.reason
    if outcome.log_tail and outcome.error is not None:
        reason += "\n--- server log tail ---\n" + outcome.log_tail
    return CellResult(
        **verdict.model_dump(exclude={"reason"}), reason=reason, cell_id=cell_id, model=model,
        factors=factors, args=outcome.args, resolved=resolved_subset(outcome.server.resolved),
        invalid_rate=measured.invalid_rate if measured else None,
        truncated_rate=measured.truncated_rate if measured else None, reference_cell=reference_cell,
        threshold=floor, timings=outcome.timings,
        throughput=measured.throughput if measured else Throughput(), protocol_fingerprint=fingerprint,
        server_version=outcome.server.version, cuda_visible_devices=outcome.server.cuda_visible_devices,
        node=outcome.server.node, stopped_early=outcome.stopped_early is not None,
        history_run_id=history_run_id if verdict.history_p is not None else None)


def prediction_misses(predicted: dict, resolved: dict) -> list[str]:
    """`page_size=1 (server: 64)` for each field the server resolved otherwise than the check said."""
    if not resolved:
        return []
    return [f"{key}={value} (server: {resolved[key]})" for key, value in predicted.items()
            if key in resolved and resolved[key] != value]


class Gating:
    """The verdicts of one run, made as cells finish and written through `sinks`."""

    def __init__(self, gate: GateSpec, budget: Budget, fingerprint: str, history: History, sinks: Sinks,
                 predicted: dict[str, dict] | None = None) -> None:
        self.gate = gate
        self.predicted = predicted or {}
        self.budget = budget  # extension_share > 0: undecided cells are extended (stage 2)
        self.fingerprint = fingerprint
        self.history = history
        self.sinks = sinks
        self._answers: dict[str, CellOutcome] = {}  # cells judged on answers: references, extension
        self._waiting: dict[str, list[_Waiting]] = {}  # reference cell id -> cells waiting for it
        self._results: dict[str, CellResult] = {}
        self._floor_grew: set[str] = set()  # extended cells whose extension added test questions
        self._unvouched: set[str] = set()  # cells whose reference could not vouch for them

    # ---- reading ---------------------------------------------------------------------------------
    def results(self) -> dict[str, CellResult]:
        return dict(self._results)

    def answers(self, cell_id: str) -> CellOutcome | None:
        return self._answers.get(cell_id)

    def judged(self, cell_id: str) -> bool:
        return cell_id in self._results

    def vouching_answers(self, cell: Cell) -> CellOutcome | None:
        """The answers of `cell`'s reference, when it has been judged on them and can vouch for the cell."""
        if cell.reference_cell is None or self._reference_problem(cell, missing=False):
            return None
        return self._answers.get(cell.reference_cell)

    def has_regression(self) -> bool:
        return any(result.status.is_regression for result in self._results.values())

    # ---- a resumed run ---------------------------------------------------------------------------
    def restore(self, result: CellResult, answers: CellOutcome | None) -> None:
        """A cell judged by an earlier invocation of this run (`--resume`)."""
        self._results[result.cell_id] = result
        if answers is not None and result.status in JUDGED:
            self._answers[result.cell_id] = answers

    # ---- judging ---------------------------------------------------------------------------------
    def offer(self, cell: Cell, outcome: CellOutcome, log: str) -> None:
        """A finished cell: judged now, or once its reference is."""
        reference = cell.reference_cell
        if reference is not None and reference not in self._results:
            self._waiting.setdefault(reference, []).append(_Waiting(cell, outcome, log))
            return
        self.judge(cell, outcome, log)
        for waiting in self._waiting.pop(cell.cell_id, []):
            self.judge(waiting.cell, waiting.outcome, waiting.log)

    def judge(self, cell: Cell, outcome: CellOutcome, log: str, reference_missing: bool = False,
              note: str = "", stage: int = 1) -> CellResult:
        """Judge one cell and write it everywhere. Judging a cell again (after an extension, stage 2)
        appends a line that replaces the earlier one; `note` ({n} = questions) leads its reason."""
        if outcome.score is not None and outcome.error is None:
            self._answers[cell.cell_id] = outcome
        reference = None if reference_missing or cell.reference_cell is None else self._answers.get(cell.reference_cell)
        found = self.history.baseline(cell.cell_id)
        pinned = self.history.pinned(cell.cell_id)
        if pinned is not None and found is not None and pinned[0] == found[0]:
            pinned = None  # the same run twice is one test, not two
        confidence = pass_confidence_per_stage(self.gate.pass_confidence, 2 if self.budget.extension_share else 1)
        judgement = Stage(alpha=self.budget.stage(stage), pass_confidence=confidence, number=stage,
                          floor_tested=stage == 1 or cell.cell_id in self._floor_grew)
        problem = self._reference_problem(cell, reference_missing)
        if problem:
            self._unvouched.add(cell.cell_id)
        verdict = judge(outcome, cell.model.floor, self.gate, judgement, reference, found[1] if found else None,
                        pinned[1] if pinned else None, problem, cell.model.divergence_tolerance,
                        cell.model.launch_sd)
        if note:
            verdict = verdict.model_copy(update={"reason": note.format(n=verdict.n) + verdict.reason})
        predicted = self.predicted.get(cell.cell_id, {})
        surprises = prediction_misses(predicted, outcome.server.resolved)
        if surprises:
            verdict = verdict.model_copy(update={"reason": verdict.reason + "; the sglang check predicted "
                                                 + ", ".join(surprises)})
        result = cell_result(outcome, verdict, cell_id=cell.cell_id, model=cell.model.id, factors=cell.factors,
                             reference_cell=cell.reference_cell, floor=cell.model.floor, fingerprint=self.fingerprint,
                             history_run_id=found[0] if found else None)
        result = result.model_copy(update={"predicted": predicted})
        earlier = self._results.get(cell.cell_id)
        if not log and earlier is not None:
            result = result.model_copy(update={"log_path": earlier.log_path})
        result = self.sinks.cell(FinishedCell(result, outcome.questions, outcome.server.resolved, log))
        self._results[cell.cell_id] = result
        return result

    def extensible(self, cell_id: str) -> bool:
        """An undecided cell the extension can help: judged at stage 1 on answers, and its
        reference (if any) can vouch for it (a broken reference stays broken with more questions)."""
        result = self._results.get(cell_id)
        return (self.budget.extension_share > 0 and result is not None and result.status is Status.INCONCLUSIVE
                and result.stage == 1 and cell_id in self._answers and cell_id not in self._unvouched)

    def _reference_problem(self, cell: Cell, missing: bool) -> str | None:
        """Why the cell's reference cannot vouch for it, if it cannot: a cell compared with an
        errored, failing or early-stopped reference must not pass on that comparison."""
        if cell.reference_cell is None:
            return None
        name, result = cell.reference_cell, self._results.get(cell.reference_cell)
        if missing or result is None or result.status in (Status.ERROR, Status.SKIPPED):
            why = result.reason.splitlines()[0][:160] if result is not None else "it produced no answers"
            return f"reference unavailable: {name} ({why})"
        if result.status in (Status.FAIL, Status.MISMATCH):
            return f"reference broken: {name} is {result.status.value}"
        if result.stopped_early:
            return f"reference broken: {name} stopped early after {result.n} questions"
        return None

    def extended(self, cell: Cell, more: CellOutcome) -> None:
        """Judge `cell` again on its answers plus `more` (extra questions of the extension)."""
        base = self._answers[cell.cell_id]
        records = [*base.questions, *more.questions]
        if any(r.is_test for r in more.questions):
            self._floor_grew.add(cell.cell_id)
        merged = base.model_copy(update={"questions": records,
                                         "score": score(records, base.score.eval_s + more.score.eval_s)})
        self._answers[cell.cell_id] = merged

    def rejudge(self, cell: Cell, note: str) -> None:
        """Judge a cell again, at stage 2, on the answers it has now (see `extended`)."""
        self.judge(cell, self._answers[cell.cell_id], "", note=note, stage=2)

    def release_waiting(self) -> None:
        """The run is over: cells whose reference never produced a score are judged without it."""
        waiting, self._waiting = self._waiting, {}
        for cells in waiting.values():
            for entry in cells:
                self.judge(entry.cell, entry.outcome, entry.log, reference_missing=True)

    def drop_waiting(self) -> None:
        """`--fail-fast` stopped the run: cells waiting for their reference stay unjudged (`--resume` runs them)."""
        self._waiting.clear()

    def skipped(self, skipped: tuple[SkippedCell, ...]) -> None:
        """Excluded cells are recorded as `skipped`, with the rule's reason."""
        for cell in skipped:
            if cell.cell_id not in self._results:
                result = CellResult(cell_id=cell.cell_id, model=cell.model.id, factors=cell.factors, args=[],
                                    resolved={}, status=Status.SKIPPED, reason=cell.reason)
                self._results[cell.cell_id] = self.sinks.cell(FinishedCell(result))
