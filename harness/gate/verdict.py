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
from harness.gate.stats import below_floor_p, paired_comparison, wilson_interval
from harness.results.records import CellOutcome, QuestionRecord, Status, Verdict
from harness.suite.config import GateSpec


def correctness(records: list[QuestionRecord], extraction: str) -> dict[int, bool]:
    """Question index -> correct, over answered questions, under the suite's extraction rule."""
    return {r.index: (r.correct_strict if extraction == "strict" else r.correct)
            for r in records if r.error is None}


def judge(outcome: CellOutcome, floor: float, gate: GateSpec, cells_tested: int,
          reference: CellOutcome | None = None, history: CellOutcome | None = None) -> Verdict:
    """`reference`: the reference cell of this run; `history`: the same cell in the last run of the
    suite where it passed (same protocol). Each is a paired test on the questions both answered."""
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
    answers = correctness(outcome.questions, gate.extraction)
    n, correct = len(answers), sum(answers.values())
    accuracy = correct / n
    low, high = wilson_interval(correct, n)
    # Bonferroni over cells and over the tests made on each (floor, reference, history).
    alpha = gate.alpha / max(cells_tested, 1) / (2 if history is not None else 1)
    floor_p = below_floor_p(correct, n, floor)
    reasons = [f"accuracy {accuracy:.3f} ({correct}/{n}, 95% CI {low:.3f}-{high:.3f})"]
    if outcome.stopped_early:
        reasons.append(outcome.stopped_early)
    status = Status.PASS
    if floor > 0 and floor_p < alpha:
        status = Status.FAIL
        reasons.append(f"below floor {floor:.2f} (p={floor_p:.2g} < {alpha:.2g})")
    elif accuracy < floor:
        status = Status.INCONCLUSIVE
        reasons.append(f"under floor {floor:.2f} but not significantly (p={floor_p:.2g})")
    paired = None
    if reference is not None and reference.score is not None and reference.error is None:
        paired = paired_comparison(answers, correctness(reference.questions, gate.extraction))
    if paired is not None:
        reasons.append(f"vs reference {paired.reference_accuracy:.3f} on {paired.n} shared: "
                       f"lost {paired.losses}, gained {paired.gains}, McNemar p={paired.p_drop:.2g}")
        if paired.p_drop < alpha and paired.drop >= gate.min_effect:
            status = Status.FAIL
        elif paired.drop >= gate.min_effect and status is Status.PASS:
            status = Status.INCONCLUSIVE
    history_p = None
    if history is not None and history.score is not None:
        before = paired_comparison(answers, correctness(history.questions, gate.extraction))
        if before is not None:
            history_p = before.p_drop
            reasons.append(f"vs the last passing run {before.reference_accuracy:.3f} on {before.n} shared: "
                           f"lost {before.losses}, gained {before.gains}, McNemar p={before.p_drop:.2g}")
            if before.p_drop < alpha and before.drop >= gate.min_effect:
                status = Status.FAIL
    return Verdict(status=status, reason="; ".join(reasons), accuracy=accuracy, n=n, correct=correct, ci_low=low,
                   ci_high=high, floor_p=floor_p, mcnemar_p=paired.p_drop if paired else None,
                   agreement=paired.agreement if paired else None, history_p=history_p)
