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
from harness.gate.evidence import leans_to_a_drop
from harness.gate.launches import SpreadEstimate, churn_floor, launch_sample, pooled_spread, spread_for_gate
from harness.gate.verdict import (
    Stage,
    judge,
    pass_confidence_per_stage,
)
from harness.records import CellOutcome, CellResult, LaunchSample, QuestionRecord, Status, Throughput, Verdict
from harness.results.sinks import FinishedCell, Sinks
from harness.run.history import History
from harness.run.scheduling.durations import held_s
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
                history_runs: tuple[str, ...] = ()) -> CellResult:
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
        history_run_id=history_runs[0] if verdict.history_p is not None and history_runs else None,
        history_runs=list(history_runs) if verdict.history_p is not None else [])


def prediction_misses(predicted: dict, resolved: dict) -> list[str]:
    """`page_size=1 (server: 64)` for each field the server resolved otherwise than the check said."""
    if not resolved:
        return []
    return [f"{key}={value} (server: {resolved[key]})" for key, value in predicted.items()
            if key in resolved and resolved[key] != value]


class Gating:
    """The verdicts of one run, made as cells finish and written through `sinks`."""

    def __init__(self, gate: GateSpec, budget: Budget, fingerprint: str, history: History, sinks: Sinks,
                 predicted: dict[str, dict] | None = None, extends: bool = False) -> None:
        self.gate = gate
        self.predicted = predicted or {}
        self.budget = budget  # its stages: 1, the extension when `extends` (2), then one per relaunch
        self.extends = extends
        self.fingerprint = fingerprint
        self.history = history
        self.sinks = sinks
        self._answers: dict[str, CellOutcome] = {}  # cells judged on answers: references, extension
        self._waiting: dict[str, list[_Waiting]] = {}  # reference cell id -> cells waiting for it
        self._results: dict[str, CellResult] = {}
        self._floor_grew: set[str] = set()  # extended cells whose extension added test questions
        self._unvouched: set[str] = set()  # cells whose reference could not vouch for them
        self._samples: dict[tuple[str, int], LaunchSample | None] = {}  # (cell id, launches) -> its sample
        # cell id -> its launches made whatever their answers (the first, and a reference's second with
        # gate.measure_launch_spread): the launch-spread samples (harness.gate.launches)
        self._unselected: dict[str, set[int]] = {}
        self._extended: set[str] = set()  # cells that answered the extension's questions too
        self._launch_counts: dict[tuple[str, int], int] = {}
        self._relaunches: dict[str, int] = {}  # cell id -> relaunches on its questions so far
        self._prior: dict[str, float] = {}  # model id -> its suite's launch_sd (the prior)
        self._server_s: dict[str, float] = {}
        self._first: dict[str, CellOutcome] = {}  # cell id -> its first launch's outcome (timings: what a launch costs)
        self.budget_left_s: float | None = None  # what deciding undecided cells may still spend (harness.run.relaunch)
        self.reserve_s = 0.0  # what cells leaning to a drop may spend beyond it (`spend`)
        self.extension_plan = None  # the extension's questions, once asked (harness.run.extension)

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
        self.count_server_time(cell, outcome)
        self._first.setdefault(cell.cell_id, outcome)
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
        since_pass = self.history.baseline(cell.cell_id, before_streak=True)
        pinned = self.history.pinned(cell.cell_id)
        if pinned is not None and found is not None and found.run_ids == (pinned[0],):
            pinned = None  # the same run twice is one test, not two
        confidence = pass_confidence_per_stage(self.gate.pass_confidence, self.budget.stages)
        # The floor is tested again only on new evidence: test questions the extension added, or another launch of them.
        judgement = Stage(alpha=self.budget.stage(stage), pass_confidence=confidence, number=stage,
                          floor_tested=stage == 1 or cell.cell_id in self._floor_grew or self.relaunches(cell.cell_id) > 0,
                          self_check_alpha=self.budget.self_check if stage == 1 else 0.0)
        problem = self._reference_problem(cell, reference_missing)
        if problem:
            self._unvouched.add(cell.cell_id)
        self._prior[cell.model.id] = cell.model.launch_sd
        verdict = judge(outcome, cell.model.floor, self.gate, judgement, reference, found.outcomes if found else None,
                        pinned[1] if pinned else None, problem, cell.model.divergence_tolerance,
                        self.launch_sd(cell.model.id, cell.model.launch_sd), self.history.carried_nights(cell.cell_id),
                        deterministic=cell.expected.get("enable_deterministic_inference") is True,
                        evidence_history=since_pass.outcomes if since_pass else None,
                        churn=self.churn(cell.model.id))
        if note:
            verdict = verdict.model_copy(update={"reason": note.format(n=verdict.n) + verdict.reason})
        if outcome.unverified:
            verdict = verdict.model_copy(update={"reason": f"{verdict.reason}; {outcome.unverified}"})
        predicted = self.predicted.get(cell.cell_id, {})
        surprises = prediction_misses(predicted, outcome.server.resolved)
        if surprises:
            verdict = verdict.model_copy(update={"reason": verdict.reason + "; the sglang check predicted "
                                                 + ", ".join(surprises)})
        result = cell_result(outcome, verdict, cell_id=cell.cell_id, model=cell.model.id, factors=cell.factors,
                             reference_cell=cell.reference_cell, floor=cell.model.floor, fingerprint=self.fingerprint,
                             history_runs=found.run_ids if found else ())
        result = result.model_copy(update={"predicted": predicted,
                                           "launch_sample": self._sample(cell.cell_id, outcome)})
        earlier = self._results.get(cell.cell_id)
        if not log and earlier is not None:
            result = result.model_copy(update={"log_path": earlier.log_path})
        if earlier is not None and earlier.self_check_p and not result.self_check_p:
            # Made at stage 1 only: their figures stand on the cell's later lines (regress calibrate reads the last).
            result = result.model_copy(update={"self_check_p": earlier.self_check_p,
                                               "self_check_high": earlier.self_check_high})
        result = self.sinks.cell(FinishedCell(result, outcome.questions, outcome.server.resolved, log))
        self._results[cell.cell_id] = result
        return result

    def extensible(self, cell_id: str) -> bool:
        """An undecided cell the extension can help: judged at stage 1 on answers, and its
        reference (if any) can vouch for it (a broken reference stays broken with more questions)."""
        result = self._results.get(cell_id)
        return (self.extends and result is not None and result.stage == 1 and self.undecided(cell_id))

    def undecided(self, cell_id: str) -> bool:
        """Judged `inconclusive` on answers, and its reference (if any) can vouch for it: more
        questions or another launch may decide it (a broken reference stays broken either way)."""
        result = self._results.get(cell_id)
        return (result is not None and result.status is Status.INCONCLUSIVE and cell_id in self._answers
                and cell_id not in self._unvouched)

    def leaning(self, cell_id: str) -> bool:
        """The cell's evidence from earlier nights leans to a drop: a log e above 0 since it last passed
        (harness.gate.evidence). Known before tonight's answers, so what it decides (who is launched
        again first) changes no test's size; a healthy cell leans so rarely: its drops must have come
        out beyond the midpoint of their margin and gate.min_effect."""
        return leans_to_a_drop(self.history.carried_evidence(cell_id))

    def leaning_first(self, cells: list[Cell]) -> list[Cell]:
        """`cells`, those `leaning` to a drop first (the budget for undecided cells goes to a drop that
        persists before healthy cells left open), in the given order otherwise."""
        return sorted(cells, key=lambda cell: not self.leaning(cell.cell_id))

    def launches(self, cell_id: str) -> int:
        """How many launches the cell's answers come from (0: none judged on answers)."""
        outcome = self._answers.get(cell_id)
        return self._count_launches(cell_id, outcome) if outcome is not None else 0

    def _count_launches(self, cell_id: str, outcome: CellOutcome) -> int:
        key = (cell_id, len(outcome.questions))  # a cell's records only ever grow
        if key not in self._launch_counts:
            self._launch_counts[key] = len({r.launch for r in outcome.questions}) or 1
        return self._launch_counts[key]

    def was_extended(self, cell_id: str) -> bool:
        return cell_id in self._extended

    def relaunches(self, cell_id: str) -> int:
        """How many times the cell was launched again on its questions (the extension is not one)."""
        return self._relaunches.get(cell_id, 0)

    def relaunch_stage(self, launches: int) -> int:
        """The stage a cell is judged at after its (launches - 1)th relaunch: after stage 1 and the extension."""
        return (2 if self.extends else 1) + launches - 1

    # ---- launch spread ---------------------------------------------------------------------------
    def spread(self, model: str) -> SpreadEstimate | None:
        """The launch spread measured on `model`'s cells (with gate.pool_launch_spread: on every
        model's cells): this run's launches so far and the history's."""
        pooled = self.gate.pool_launch_spread
        models = sorted(self.history.models() | {model}) if pooled else [model]
        samples = [sample for name in models for sample in self.history.launch_samples(name, self.gate.extraction)]
        return pooled_spread(samples + self._run_samples(None if pooled else model))

    def _run_samples(self, model: str | None) -> list[LaunchSample]:
        """This run's launch samples so far, of `model`'s cells (None: every model's)."""
        samples = []
        for cell_id, outcome in self._answers.items():
            result = self._results.get(cell_id)
            if result is None or (model is not None and result.model != model):
                continue
            sample = self._sample(cell_id, outcome)
            if sample is not None:
                samples.append(sample)
        return samples

    def _sample(self, cell_id: str, outcome: CellOutcome) -> LaunchSample | None:
        """The cell's launch-spread sample: its launches made whatever their answers, if two or more."""
        launches = self._unselected.get(cell_id, set())
        key = (cell_id, len(launches))
        if len(launches) < 2:
            return None
        if key not in self._samples:
            self._samples[key] = launch_sample([r for r in outcome.questions if r.launch in launches],
                                               self.gate.extraction)
        return self._samples[key]

    def churn(self, model: str) -> float:
        """`model`'s answer churn at its lower bound (harness.gate.launches.churn_floor), from the
        launch samples of its cells in this run so far and in the history's runs."""
        return churn_floor(self.history.recorded_samples(model) + self._run_samples(model))

    def launch_sd(self, model: str, prior: float) -> float:
        """What the paired tests of `model`'s cells add for launch spread (harness.gate.launches)."""
        return spread_for_gate(prior, self.spread(model))

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

    def count_server_time(self, cell: Cell, outcome: CellOutcome) -> None:
        """Add what a finished launch of `cell` held (its GPUs x seconds) to the run's server time."""
        seconds = held_s(outcome.timings)
        self._server_s[cell.cell_id] = self._server_s.get(cell.cell_id, 0.0) + cell.gpus * (seconds or 0.0)

    def launch_cost(self, cell: Cell, questions: int) -> float:
        """What one more launch of `cell` on `questions` questions is expected to cost (GPU-seconds):
        its first launch's start-up, and its evaluation scaled to the questions."""
        first = self._first.get(cell.cell_id)
        if first is None:
            return 0.0
        asked = max(len(first.questions), 1)
        timings = first.timings
        return cell.gpus * (timings.startup_s + timings.eval_s * questions / asked)

    def spend(self, cost: float, leaning: bool = False) -> bool:
        """Take `cost` GPU-seconds from what deciding undecided cells may add (gate.undecided_budget of
        the first pass, set at the first call); False, and nothing taken, when it does not fit. A cell
        `leaning` to a drop (`leaning_first`) may also draw on a reserve of the same size once the
        budget is spent: a drop that persists is launched again whatever healthy cells were left
        open (at most twice gate.undecided_budget in all)."""
        if self.gate.undecided_budget is None:
            return True
        if self.budget_left_s is None:
            self.budget_left_s = self.gate.undecided_budget * self.server_seconds()
            self.reserve_s = self.budget_left_s
        if cost > self.budget_left_s + (self.reserve_s if leaning else 0.0) + 1e-9:
            return False
        self.budget_left_s -= cost
        return True

    def server_seconds(self, cell_id: str | None = None) -> float:
        """GPU-seconds the run's servers held so far: one cell's (all its launches), or every cell's."""
        return self._server_s.get(cell_id, 0.0) if cell_id else sum(self._server_s.values())

    def extended(self, cell: Cell, more: CellOutcome) -> None:
        """Judge `cell` again on its answers plus `more` (extra questions of the extension)."""
        self.count_server_time(cell, more)
        base = self._answers[cell.cell_id]
        # The extension ran on a server of its own: its answers are another launch's (on other
        # questions), and the gate counts them so (harness.gate.launches, effective launches).
        number = max((r.launch for r in base.questions), default=0) + 1
        records = [*base.questions, *(_numbered(r, number) for r in more.questions)]
        self._extended.add(cell.cell_id)
        if any(r.is_test for r in more.questions):
            self._floor_grew.add(cell.cell_id)
        merged = base.model_copy(update={"questions": records,
                                         "score": score(records, base.score.eval_s + more.score.eval_s)})
        self._answers[cell.cell_id] = merged

    def override(self, result: CellResult, reason: str, failed: list[str]) -> None:
        """Fail a judged cell by a judgement over several cells (harness.run.across_cells), written
        after every stage: `reason` leads its reason, `failed` names the test."""
        outcome = self._answers.get(result.cell_id)
        changed = result.model_copy(update={"status": Status.FAIL, "reason": f"{reason}; {result.reason}",
                                            "failed": failed, "decide": None, "stage": self.budget.stages + 1})
        self._results[result.cell_id] = self.sinks.cell(FinishedCell(changed, outcome.questions if outcome else []))

    def prior(self, model: str) -> float:
        """The suite's `launch_sd` of `model` (the prior), as its cells were judged with."""
        return self._prior.get(model, 0.0)

    def note(self, cell: Cell, text: str) -> None:
        """Add `text` to a judged cell's reason (its verdict unchanged): why it stays as it is."""
        result = self._results.get(cell.cell_id)
        if result is None:
            return
        outcome = self._answers.get(cell.cell_id)
        noted = result.model_copy(update={"reason": f"{result.reason}; {text}"})
        self._results[cell.cell_id] = self.sinks.cell(FinishedCell(noted, outcome.questions if outcome else []))

    def relaunched(self, cell: Cell, launch: CellOutcome, measurement: bool = False) -> None:
        """Another launch of `cell` (same questions, another server): its records join the cell's
        answers as the next launch; `rejudge` then judges the cell on every launch. `measurement`:
        made whatever the cell's answers (a reference's second launch), so a launch-spread sample."""
        self.count_server_time(cell, launch)
        self._relaunches[cell.cell_id] = self._relaunches.get(cell.cell_id, 0) + 1
        base = self._answers[cell.cell_id]
        number = max((r.launch for r in base.questions), default=0) + 1
        if measurement:
            self._unselected.setdefault(cell.cell_id, {min((r.launch for r in base.questions), default=0)}).add(number)
        records = [*base.questions, *(_numbered(r, number) for r in launch.questions)]
        eval_s = base.score.eval_s + (launch.score.eval_s if launch.score else 0.0)
        self._answers[cell.cell_id] = base.model_copy(update={"questions": records, "score": score(records, eval_s)})

    def rejudge(self, cell: Cell, note: str, stage: int = 2) -> None:
        """Judge a cell again, at a later stage, on the answers it has now (see `extended`, `relaunched`)."""
        self.judge(cell, self._answers[cell.cell_id], "", note=note, stage=stage)

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


def _numbered(record: QuestionRecord, launch: int) -> QuestionRecord:
    """`record` as an answer of launch `launch` (a worker numbers every answer 0: it knows one launch)."""
    return record if record.launch == launch else record.model_copy(update={"launch": launch})
