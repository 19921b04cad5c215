"""From measurements to a verdict (pure).

- `error`: the server or transport failed (never a score), or too many questions failed in transport.
- `mismatch`: the server resolved another configuration than the cell's label.
- `fail`: accuracy is significantly below the model's floor (exact binomial), or significantly
  below the reference cell on the same questions (exact McNemar) by at least `min_effect`.
- `inconclusive`: it looks below the floor, or down by `min_effect`, but not significantly.
- `pass`: otherwise.
Significance is Bonferroni-corrected over the cells tested, so a healthy night stays green.
"""

from __future__ import annotations

from harness.errors import ErrorKind
from harness.gate.stats import Paired, below_floor_p, paired_comparison, wilson_interval
from harness.results.records import CellOutcome, QuestionRecord, Status, Verdict
from harness.suite.config import GateSpec


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


def _floor_test(correct: int, n: int, floor: float, alpha: float) -> tuple[Status, float, str | None]:
    floor_p = below_floor_p(correct, n, floor)
    if floor > 0 and floor_p < alpha:
        return Status.FAIL, floor_p, f"below floor {floor:.2f} (p={floor_p:.2g} < {alpha:.2g})"
    if correct / n < floor:
        return Status.INCONCLUSIVE, floor_p, f"under floor {floor:.2f} but not significantly (p={floor_p:.2g})"
    return Status.PASS, floor_p, None


def _paired_test(answers: dict[int, bool], other: CellOutcome | None, gate: GateSpec, alpha: float, label: str,
                 undecided_drop: Status) -> tuple[Status, Paired | None, str | None]:
    """Against `other` on the questions both answered: `fail` for a significant drop of at least
    `min_effect`; `undecided_drop` for such a drop that is not significant."""
    if other is None or other.score is None or other.error is not None:
        return Status.PASS, None, None
    paired = paired_comparison(answers, correctness(other.questions, gate.extraction))
    if paired is None:
        return Status.PASS, None, None
    reason = (f"vs {label} {paired.reference_accuracy:.3f} on {paired.n} shared: "
              f"lost {paired.losses}, gained {paired.gains}, McNemar p={paired.p_drop:.2g}")
    if paired.drop >= gate.min_effect:
        return (Status.FAIL if paired.p_drop < alpha else undecided_drop), paired, reason
    return Status.PASS, paired, reason


MIN_SHARED_SHARE = 0.5  # a paired test on fewer shared questions than this share of the cell's proves little


def _tests_made(floor: float, reference: CellOutcome | None, history: CellOutcome | None) -> int:
    return max(1, (floor > 0) + (reference is not None) + (history is not None))


def judge(outcome: CellOutcome, floor: float, gate: GateSpec, cells_tested: int,
          reference: CellOutcome | None = None, history: CellOutcome | None = None,
          reference_problem: str | None = None) -> Verdict:
    """`reference`: the reference cell of this run; `history`: the same cell in the last run of the
    suite where it passed (same protocol). Each is a paired test on the questions both answered.
    `reference_problem`: why the cell's reference cannot vouch for it (it errored, failed, or stopped
    early); a cell that would pass is then `inconclusive`, since a broken reference proves nothing."""
    early = unmeasured(outcome, gate)
    if early is not None:
        return early
    answers = correctness(outcome.questions, gate.extraction)
    n, correct = len(answers), sum(answers.values())
    low, high = wilson_interval(correct, n)
    # Bonferroni over the cells and over the tests actually made on each (floor, reference, history).
    alpha = gate.alpha / max(cells_tested, 1) / _tests_made(floor, reference, history)
    reasons = [f"accuracy {correct / n:.3f} ({correct}/{n}, 95% CI {low:.3f}-{high:.3f})"]
    if outcome.stopped_early:
        reasons.append(outcome.stopped_early)
    status, floor_p, why = _floor_test(correct, n, floor, alpha)
    # One rule for both paired tests: a drop of at least min_effect is `fail` when significant and
    # `inconclusive` when not.
    versus_reference, paired, why_reference = _paired_test(answers, reference, gate, alpha, "reference",
                                                           Status.INCONCLUSIVE)
    versus_history, before, why_history = _paired_test(answers, history, gate, alpha, "the last passing run",
                                                       Status.INCONCLUSIVE)
    for verdict_part, text in ((status, why), (versus_reference, why_reference), (versus_history, why_history)):
        status = _worse(status, verdict_part)
        if text:
            reasons.append(text)
    if paired is not None and paired.n < MIN_SHARED_SHARE * n:
        reference_problem = reference_problem or (f"reference unavailable: only {paired.n} questions shared of "
                                                  f"the cell's {n}")
    if reference_problem and status is Status.PASS:
        status = Status.INCONCLUSIVE
    if reference_problem:
        reasons.append(reference_problem)
    return Verdict(status=status, reason="; ".join(reasons), accuracy=correct / n, n=n, correct=correct, ci_low=low,
                   ci_high=high, floor_p=floor_p, mcnemar_p=paired.p_drop if paired else None,
                   agreement=paired.agreement if paired else None, history_p=before.p_drop if before else None)
