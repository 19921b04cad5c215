"""From measurements to a verdict (pure).

- `error`: the server or transport failed (never a score), or too many questions failed in transport.
- `mismatch`: the server resolved another configuration than the cell's label.
- `fail`: a test rejected at its share of the run's budget (harness.gate.budget): accuracy on the
  test split below the model's floor (exact binomial); a drop against the reference cell beyond
  `gate.tolerance` (paired, on the same questions); teacher-forced log-probabilities that diverge
  from the reference cell's on more questions than a healthy cell's do (harness.gate.divergence);
  a drop beyond `gate.history_margin` against the cell's own last run that was not a regression, or
  against the pinned run; or the early-stop test stopped the cell.
- `pass`: no test rejected, and every paired drop is bounded under `gate.min_effect` (its upper
  confidence bound at `gate.pass_confidence`), at every stage: a pass says "it dropped by less than
  min_effect", never only "no drop was proven".
- `inconclusive`: no test rejected, but a drop's bound (or the floor) leaves it open: extended when
  the suite can, else final.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import ErrorKind
from harness.gate.divergence import Divergence, divergence_test
from harness.gate.stats import Paired, below_floor_p, paired_comparison, wilson_interval
from harness.records import CellOutcome, QuestionRecord, Status, Verdict
from harness.suite.config import GateSpec

HISTORY_LABEL = "the last run"  # the newest earlier run in which the cell was not a regression
MIN_SHARED_SHARE = 0.5  # a paired test on fewer shared questions than this share of the cell's proves little


@dataclass(frozen=True)
class Stage:
    """One judgement of a cell: the alpha for all its tests at this stage, and whether the floor is
    tested again (stage 2 only when the extension added test questions: on the same answers, stage
    1's floor test stands and spends nothing more)."""

    alpha: float
    floor_tested: bool = True
    number: int = 1  # 1: the planned questions; 2: after the extension
    # The confidence of the drop bounds a pass needs here: gate.pass_confidence, split over the
    # stages a cell can pass at (`pass_confidence_per_stage`), so that a cell that truly dropped by
    # min_effect passes about 1 - gate.pass_confidence of the time or less over all its chances (a
    # union bound over stages of approximate score bounds; benchmarks/gate_calibration.py measures it).
    pass_confidence: float | None = None


def pass_confidence_per_stage(pass_confidence: float, stages: int) -> float:
    """Each stage's share of the chance that a cell whose drop is min_effect passes: 0.95 over two
    stages is 0.975 each (a union bound: 2.5% + 2.5%)."""
    return 1 - (1 - pass_confidence) / max(stages, 1)


@dataclass(frozen=True)
class _Part:
    status: Status
    reason: str | None = None
    undecided: str = ""  # why it leaves the cell open: said only when nothing failed it


def correctness(records: list[QuestionRecord], extraction: str) -> dict[int, bool]:
    """Question index -> correct, over answered questions, under the suite's extraction rule."""
    return {r.index: (r.correct_strict if extraction == "strict" else r.correct)
            for r in records if r.error is None}


def unmeasured(outcome: CellOutcome, gate: GateSpec) -> Verdict | None:
    """`error` or `mismatch` when the outcome cannot be scored as the cell it is labelled; else None."""
    if outcome.error is not None:
        return Verdict(status=Status.ERROR, reason=outcome.error.message, error_kind=outcome.error.kind)
    if outcome.mismatches:
        return Verdict(status=Status.MISMATCH, reason="server did not honour the requested configuration: "
                       + "; ".join(outcome.mismatches))
    score = outcome.score
    asked = score.n + score.infra_failures if score else 0
    if score is None or asked == 0:
        return Verdict(status=Status.ERROR, reason="no question was asked", error_kind=ErrorKind.NO_ANSWERS)
    if score.infra_failures / asked > gate.max_infra_failure_rate:
        first = next((r.error for r in outcome.questions if r.error), "")
        return Verdict(status=Status.ERROR, error_kind=ErrorKind.TRANSPORT,
                       reason=f"{score.infra_failures} of {asked} questions failed in transport "
                              f"(limit {gate.max_infra_failure_rate:.0%}); first: {first}")
    return None


def _worse(status: Status, other: Status) -> Status:
    order = (Status.PASS, Status.INCONCLUSIVE, Status.FAIL)
    return max(status, other, key=order.index)


def _floor_part(test_answers: dict[int, bool], floor: float, alpha: float, tested: bool) -> tuple[_Part, float | None]:
    """The floor test on test-split questions only (train questions of an extension are another
    population; the floor is the model's accuracy on the protocol's test questions)."""
    n, correct = len(test_answers), sum(test_answers.values())
    if floor <= 0 or n == 0:
        return _Part(Status.PASS), None
    p = below_floor_p(correct, n, floor)
    if tested and p < alpha:
        return _Part(Status.FAIL, f"below floor {floor:.4g} on {n} test questions (p={p:.2g} < {alpha:.2g})"), p
    if correct / n < floor:
        return _Part(Status.INCONCLUSIVE, f"under floor {floor:.4g} on {n} test questions but not "
                                          f"significantly (p={p:.2g})"), p
    return _Part(Status.PASS), p


def _paired_part(paired: Paired, label: str, gate: GateSpec, alpha: float, cell_n: int, confidence: float) -> _Part:
    """`fail` when the drop beyond the test's margin is significant; `pass` when the drop's upper
    bound (at `pass_confidence`) is under `min_effect`; else `inconclusive`. An earlier run sharing
    under half the cell's questions (the cell was extended tonight, not then) can fail it, but not
    hold it undecided: tonight's larger evidence decides that, and the reason says so."""
    null = f"drop > {paired.margin * 100:.3g} pts" if paired.margin else "a drop"
    upper = paired.drop_upper(confidence)
    reason = (f"vs {label} {paired.reference_accuracy:.3f} on {paired.n} shared: lost {paired.losses}, "
              f"gained {paired.gains}, drop {paired.drop * 100:.1f} pts ({confidence:.1%} bound "
              f"{upper * 100:.1f}), p({null})={paired.p_drop:.2g}")
    if paired.p_drop < alpha:
        return _Part(Status.FAIL, reason + f" < {alpha:.2g}")
    if upper < gate.min_effect:
        return _Part(Status.PASS, reason)
    if label != "reference" and paired.n < MIN_SHARED_SHARE * cell_n:
        return _Part(Status.PASS, reason + f"; on too few of the cell's {cell_n} questions to hold it")
    return _Part(Status.INCONCLUSIVE, reason, f"; the bound is not under min_effect {gate.min_effect * 100:.3g} pts")


def _comparisons(answers: dict[int, bool], gate: GateSpec, others: dict[str, CellOutcome | None],
                 launch_sd: float) -> dict[str, Paired]:
    """label -> the paired comparison with each measured other side that shares a question. The
    reference may differ by `gate.tolerance`; the cell's own earlier runs (history, pinned) by
    `gate.history_margin`."""
    found = {}
    for label, other in others.items():
        if other is None or other.score is None or other.error is not None:
            continue
        margin = gate.tolerance if label == "reference" else gate.own_margin
        paired = paired_comparison(answers, correctness(other.questions, gate.extraction), margin,
                                   launch_sd=launch_sd)
        if paired is not None:
            found[label] = paired
    return found


def _divergence(outcome: CellOutcome, reference: CellOutcome | None, gate: GateSpec,
                tolerance: float | None) -> Divergence | None:
    """The teacher-forced divergence test against the reference, when both sides have teacher records."""
    if not gate.divergence.enabled or reference is None or reference.score is None or reference.error is not None:
        return None
    return divergence_test(outcome.questions, reference.questions, tolerance or gate.divergence.tolerance,
                           gate.divergence.healthy_share)


def judge(outcome: CellOutcome, floor: float, gate: GateSpec, stage: Stage,
          reference: CellOutcome | None = None, history: CellOutcome | None = None,
          pinned: CellOutcome | None = None, reference_problem: str | None = None,
          divergence_tolerance: float | None = None, launch_sd: float = 0.0) -> Verdict:
    """`reference`: the reference cell of this run (null hypotheses: accuracy drop <= gate.tolerance,
    and teacher-forced divergence within the tolerance on all but a healthy share of questions);
    `history`: the same cell in the last run of the suite where it was not a regression; `pinned`:
    the same cell in the suite's pinned run (both: drop <= gate.history_margin). Each is a paired
    test on the questions both answered; the stage's alpha is split evenly over the tests made.
    `reference_problem`: why the reference cannot vouch for the cell (it errored, failed, or stopped
    early): a cell that would pass is then `inconclusive`, since a broken reference proves nothing.
    `divergence_tolerance`: the model's (nats per token), else the gate's. `launch_sd`: the
    model's launch-to-launch spread (ModelSpec.launch_sd), added to every paired test.

    Example: `judge(outcome, 0.85, GateSpec(), Stage(alpha=1e-4), reference=ref)`."""
    early = unmeasured(outcome, gate)
    if early is not None:
        return early
    answers = correctness(outcome.questions, gate.extraction)
    test_answers = correctness([r for r in outcome.questions if r.is_test], gate.extraction)
    n, correct = len(answers), sum(answers.values())
    low, high = wilson_interval(correct, n)
    found = _comparisons(answers, gate, {"reference": reference, HISTORY_LABEL: history,
                                         "the pinned run": pinned}, launch_sd)
    # Against a reference that cannot vouch (it failed, errored, stopped early), every healthy cell
    # would diverge: the test is not made, and the cell is held open below like any other.
    diverged = None if reference_problem else _divergence(outcome, reference, gate, divergence_tolerance)
    floor_tested = stage.floor_tested and floor > 0 and bool(test_answers)
    tests = floor_tested + len(found) + (diverged is not None)
    alpha = stage.alpha / max(tests, 1)
    reasons = [f"accuracy {correct / n:.3f} ({correct}/{n}, 95% CI {low:.3f}-{high:.3f})"]
    status = Status.PASS
    if outcome.stopped_early:  # a sequential test (floor or divergence) rejected, at its own share of the budget
        status = Status.FAIL
        reasons.append(outcome.stopped_early)
    floor_part, floor_p = _floor_part(test_answers, floor, alpha, floor_tested)
    parts = [floor_part, *(_paired_part(paired, label, gate, alpha, n, stage.pass_confidence or gate.pass_confidence) for label, paired in found.items())]
    if diverged is not None:  # it can fail the cell, never hold it open (harness.gate.divergence)
        parts.append(_Part(Status.FAIL if diverged.p < alpha else Status.PASS, diverged.describe(alpha)))
    for part in parts:
        status = _worse(status, part.status)
    reasons += [part.reason + (part.undecided if status is not Status.FAIL else "") for part in parts if part.reason]
    paired = found.get("reference")
    if paired is not None and paired.n < MIN_SHARED_SHARE * n:
        reference_problem = reference_problem or (f"reference unavailable: only {paired.n} questions shared of "
                                                  f"the cell's {n}")
    if reference_problem and status is Status.PASS:
        status = Status.INCONCLUSIVE
    if reference_problem:
        reasons.append(reference_problem)
    history_paired, pinned_paired = found.get(HISTORY_LABEL), found.get("the pinned run")
    return Verdict(status=status, reason="; ".join(reasons), stage=stage.number, accuracy=correct / n, n=n,
                   correct=correct, ci_low=low,
                   ci_high=high, floor_p=floor_p, floor_n=len(test_answers), floor_correct=sum(test_answers.values()),
                   mcnemar_p=paired.p_drop if paired else None,
                   agreement=paired.agreement if paired else None,
                   history_p=history_paired.p_drop if history_paired else None,
                   pinned_p=pinned_paired.p_drop if pinned_paired else None,
                   **_divergence_fields(diverged))


def _divergence_fields(diverged: Divergence | None) -> dict[str, float | int | None]:
    if diverged is None:
        return {}
    return {"divergence_p": diverged.p, "divergence_share": diverged.share, "divergence_nats": diverged.nats,
            "divergence_top1": diverged.top1, "divergence_high": diverged.high, "divergence_n": diverged.n}
