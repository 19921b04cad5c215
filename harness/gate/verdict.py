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

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import ErrorKind
from harness.gate.divergence import Divergence, divergence_test
from harness.gate.evidence import LABELS as EVIDENCE_LABELS
from harness.gate.evidence import NightDrop, joint_log_e, night_drop, rejects
from harness.gate.evidence import describe as describe_evidence
from harness.gate.launches import Answers, churn_variance, drop_with_variance
from harness.gate.self_checks import self_checks
from harness.gate.stats import Paired, below_floor_p, paired_comparison, wilson_interval
from harness.records import CellOutcome, QuestionRecord, Status, Verdict
from harness.suite.config import GateSpec

HISTORY_LABEL = "its last runs"  # the cell's answers in its latest earlier runs where it passed, pooled
PINNED_LABEL = "the pinned run"
TEST_NAMES = {"reference": "reference", HISTORY_LABEL: "history", PINNED_LABEL: "pinned"}
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
    # For the cell's self-checks (harness.gate.self_checks), made at stage 1 only; 0: none.
    self_check_alpha: float = 0.0


def pass_confidence_per_stage(pass_confidence: float, stages: int) -> float:
    """Each stage's share of the chance that a cell whose drop is min_effect passes: 0.95 over two
    stages is 0.975 each (a union bound: 2.5% + 2.5%)."""
    return 1 - (1 - pass_confidence) / max(stages, 1)


@dataclass(frozen=True)
class _TestOutcome:
    status: Status
    reason: str | None = None
    undecided: str = ""  # why it leaves the cell open: said only when nothing failed it
    decide: str | None = None  # what would decide it: another launch, more questions
    test: str = ""  # which test this is (Verdict.failed names the failing ones)


def correctness(records: list[QuestionRecord], extraction: str) -> dict[int, bool]:
    """Question index -> correct, over answered questions, under the suite's extraction rule (one
    launch's records; `Answers.of` takes several)."""
    return {r.index: (r.correct_strict if extraction == "strict" else r.correct)
            for r in records if r.error is None}


def test_mask(answers: Answers, records: list[QuestionRecord]):
    """Which of `answers`' questions are test-split questions (the floor's)."""
    import numpy as np

    test = {r.index for r in records if r.is_test}
    return np.isin(answers.questions, np.fromiter(test, dtype=np.int64, count=len(test)))


def first_launch(records: list[QuestionRecord]) -> list[QuestionRecord]:
    """The records of a cell's first launch (the divergence test pairs one launch with one launch)."""
    first = min((r.launch for r in records), default=0)
    return [r for r in records if r.launch == first]


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


def _floor_part(test_answers: Answers, floor: float, alpha: float, tested: bool) -> tuple[_TestOutcome, float | None]:
    """The floor test on test-split questions only (train questions of an extension are another
    population; the floor is the model's accuracy on the protocol's test questions). With several
    launches a question counts by the share of launches that got it right, and the count the exact
    test takes is rounded up (never more rejections than one launch's answers would give)."""
    n, correct = test_answers.n, test_answers.total
    if floor <= 0 or n == 0:
        return _TestOutcome(Status.PASS), None
    p = below_floor_p(math.ceil(correct - 1e-9), n, floor)
    if tested and p < alpha:
        return _TestOutcome(Status.FAIL, f"below floor {floor:.4g} on {n} test questions (p={p:.2g} < {alpha:.2g})",
                     test="floor"), p
    if correct / n < floor:
        return _TestOutcome(Status.INCONCLUSIVE, f"under floor {floor:.4g} on {n} test questions but not "
                                          f"significantly (p={p:.2g})", decide="more test questions"), p
    return _TestOutcome(Status.PASS), p


def _count(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _paired_part(paired: Paired, label: str, gate: GateSpec, alpha: float, cell_n: int, confidence: float) -> _TestOutcome:
    """`fail` when the drop beyond the test's margin is significant; `pass` when the drop's upper
    bound (at `pass_confidence`) is under `min_effect`; else `inconclusive`. An earlier run sharing
    under half the cell's questions (the cell was extended tonight, not then) can fail it, but not
    hold it undecided: tonight's larger evidence decides that, and the reason says so. The pinned
    run can fail a cell, never hold it open: it is there to catch a slow drift, and one old launch's
    own spread would otherwise keep healthy cells undecided (the bound a pass needs is against the
    reference and the cell's last runs)."""
    null = f"drop > {paired.margin * 100:.3g} pts" if paired.margin else "a drop"
    upper = paired.drop_upper(confidence)
    sides = "" if paired.launches == (1, 1) else f" ({paired.launches[0]:.3g} launch(es) vs {paired.launches[1]:.3g})"
    reason = (f"vs {label} {paired.reference_accuracy:.3f} on {paired.n} shared{sides}: lost {_count(paired.losses)}, "
              f"gained {_count(paired.gains)}, drop {paired.drop * 100:.1f} pts ({confidence:.1%} bound "
              f"{upper * 100:.1f}), p({null})={paired.p_drop:.2g}")
    if paired.p_drop < alpha:
        return _TestOutcome(Status.FAIL, reason + f" < {alpha:.2g}", test=TEST_NAMES[label])
    if upper < gate.min_effect or label == PINNED_LABEL:
        return _TestOutcome(Status.PASS, reason)
    if label != "reference" and paired.n < MIN_SHARED_SHARE * cell_n:
        return _TestOutcome(Status.PASS, reason + f"; on too few of the cell's {cell_n} questions to hold it")
    return _TestOutcome(Status.INCONCLUSIVE, reason, f"; the bound is not under min_effect {gate.min_effect * 100:.3g} pts",
                 decide=what_decides(paired, label))


def what_decides(paired: Paired, label: str) -> str:
    """Which evidence the drop's bound lacks most: another launch when the launches' share of its
    variance is the larger, else more questions (launch spread does not shrink with questions)."""
    if paired.sampling_variance is not None:
        sampling = paired.sampling_variance
    else:
        sampling = drop_with_variance(paired.losses, paired.gains, paired.n)[1]
    launches = paired.launch_variance
    share = launches / (launches + sampling) if launches + sampling > 0 else 0.0
    if share >= 0.5:
        return f"another launch (launch spread is {share:.0%} of its drop's variance vs {label})"
    return f"more questions (their sampling is {1 - share:.0%} of its drop's variance vs {label})"


Side = CellOutcome | Sequence[CellOutcome] | None  # one run's answers, or several runs' pooled


def _runs(side: Side) -> list[CellOutcome]:
    """The measured runs of a side (a single outcome is one run)."""
    runs = [side] if isinstance(side, CellOutcome) else list(side or [])
    return [run for run in runs if run.score is not None and run.error is None]


def _comparisons(answers: Answers, gate: GateSpec, others: dict[str, Side],
                 launch_sd: float) -> dict[str, Paired]:
    """label -> the paired comparison with each measured other side that shares a question. The
    reference may differ by `gate.tolerance`; the cell's own earlier runs (history, pinned) by
    `gate.history_margin`. Each side counts its launches (its records' `launch`; each run of a
    pooled side brings its own)."""
    found = {}
    for label, other in others.items():
        runs = _runs(other)
        if not runs:
            continue
        margin = gate.tolerance if label == "reference" else gate.own_margin
        paired = paired_comparison(answers, Answers.pooled([run.questions for run in runs], gate.extraction), margin,
                                   launch_sd=launch_sd)
        if paired is not None:
            found[label] = paired
    return found


def _divergence(outcome: CellOutcome, reference: CellOutcome | None, gate: GateSpec,
                tolerance: float | None) -> Divergence | None:
    """The teacher-forced divergence test against the reference, when both sides have teacher records."""
    if not gate.divergence.enabled or reference is None or reference.score is None or reference.error is not None:
        return None
    return divergence_test(first_launch(outcome.questions), first_launch(reference.questions),
                           tolerance or gate.divergence.tolerance, gate.divergence.healthy_share)


def judge(outcome: CellOutcome, floor: float, gate: GateSpec, stage: Stage,
          reference: CellOutcome | None = None, history: Side = None,
          pinned: CellOutcome | None = None, reference_problem: str | None = None,
          divergence_tolerance: float | None = None, launch_sd: float = 0.0,
          carried: dict[str, Sequence[NightDrop]] | None = None, deterministic: bool = False,
          evidence_history: Side = None, churn: float = 0.0) -> Verdict:
    """`reference`: the reference cell of this run (null hypotheses: accuracy drop <= gate.tolerance,
    and teacher-forced divergence within the tolerance on all but a healthy share of questions);
    `history`: the same cell in its last runs of the suite where it passed (one outcome, or several
    pooled: each run's launches are launches of the pool); `pinned`:
    the same cell in the suite's pinned run (both: drop <= gate.history_margin). Each is a paired
    test on the questions both answered; the stage's alpha is split evenly over the tests made.
    `reference_problem`: why the reference cannot vouch for the cell (it errored, failed, or stopped
    early): a cell that would pass is then `inconclusive`, since a broken reference proves nothing.
    `divergence_tolerance`: the model's (nats per token), else the gate's. `launch_sd`: the
    launch-to-launch spread (harness.gate.launches), added to every paired test for each side's
    launches. Every side may hold several launches (its records' `launch`): a question then counts
    by the share of launches that answered it right. `carried`: the cell's evidence from its nights
    since it last passed (harness.gate.evidence), continued with tonight's launches against
    `evidence_history` (the cell's runs from its last pass on; default: `history`).
    `deterministic`: the cell asked for deterministic inference (its self-checks are zero-tolerance).
    `churn`: the model's answer churn at its lower bound (harness.gate.launches.churn_floor): the
    part of tonight's drop no other night shares, for the evidence across nights.

    Example: `judge(outcome, 0.85, GateSpec(), Stage(alpha=1e-4), reference=ref)`."""
    early = unmeasured(outcome, gate)
    if early is not None:
        return early
    answers = Answers.of(outcome.questions, gate.extraction)
    test_answers = answers.only(test_mask(answers, outcome.questions))
    n, share = answers.n, answers.total
    correct = round(share)
    low, high = wilson_interval(correct, n)
    found = _comparisons(answers, gate, {"reference": reference, HISTORY_LABEL: history,
                                         PINNED_LABEL: pinned}, launch_sd)
    # Against a reference that cannot vouch (it failed, errored, stopped early), every healthy cell
    # would diverge: the test is not made, and the cell is held open below like any other.
    diverged = None if reference_problem else _divergence(outcome, reference, gate, divergence_tolerance)
    floor_tested = stage.floor_tested and floor > 0 and test_answers.n > 0
    evidence_nights = _evidence(outcome, gate, {"reference": reference, "history": evidence_history or history},
                                launch_sd, carried or {}, churn)
    evidence = {key: (len(nights), joint_log_e(nights, gate.min_effect - _margin(key, gate)))
                for key, nights in evidence_nights.items()}
    # An accumulated test is made from a cell's second night on (on its first it would repeat the
    # night's own paired test); its nights are kept either way (harness.gate.evidence).
    accumulated = {key: (nights, log_e) for key, (nights, log_e) in evidence.items() if nights > 1}
    tests = floor_tested + len(found) + (diverged is not None) + len(accumulated)
    alpha = stage.alpha / max(tests, 1)
    count = answers.launch_count
    launches = f" over {count} launches" if count > 1 else ""
    reasons = [f"accuracy {share / n:.3f} ({_count(share)}/{n}{launches}, 95% CI {low:.3f}-{high:.3f})"]
    status = Status.PASS
    if outcome.stopped_early:  # a sequential test (floor or divergence) rejected, at its own share of the budget
        status = Status.FAIL
        reasons.append(outcome.stopped_early)
    floor_part, floor_p = _floor_part(test_answers, floor, alpha, floor_tested)
    parts = [floor_part, *(_paired_part(paired, label, gate, alpha, n, stage.pass_confidence or gate.pass_confidence) for label, paired in found.items())]
    if diverged is not None:  # it can fail the cell, never hold it open (harness.gate.divergence)
        parts.append(_TestOutcome(Status.FAIL if diverged.p < alpha else Status.PASS, diverged.describe(alpha), test="divergence"))
    checks, not_measured = ([], []) if not stage.self_check_alpha else self_checks(
        first_launch(outcome.questions), gate.self_checks.tolerance or divergence_tolerance or gate.divergence.tolerance,
        gate.divergence.healthy_share, gate.tolerance, deterministic, gate.extraction)
    for check in checks:  # each can fail the cell, never hold it open (harness.gate.self_checks)
        check_alpha = stage.self_check_alpha / len(checks)
        parts.append(_TestOutcome(Status.FAIL if check.p < check_alpha else Status.PASS, check.describe(check_alpha),
                           test=f"self-check {check.name}"))
    for key, (nights, log_e) in accumulated.items():  # it can fail the cell, never hold it open
        parts.append(_TestOutcome(Status.FAIL if rejects(log_e, alpha) else Status.PASS,
                           describe_evidence(EVIDENCE_LABELS[key], nights, log_e, alpha, count), test=f"evidence {key}"))
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
    reasons += not_measured
    if stage.self_check_alpha and not checks and not not_measured and not outcome.stopped_early:
        reasons.append("self-checks not measured (no sampled question was scored teacher-forced)")
    if (gate.divergence.enabled and reference is not None and diverged is None and not reference_problem
            and not any(r.teacher for r in outcome.questions)):
        reasons.append("divergence vs reference not measured (no question was scored teacher-forced)")
    decide = None
    if status is Status.INCONCLUSIVE:
        decide = ("a reference that can vouch for it" if reference_problem and not any(p.decide for p in parts)
                  else next((p.decide for p in parts if p.decide), None))
    history_paired, pinned_paired = found.get(HISTORY_LABEL), found.get(PINNED_LABEL)
    return Verdict(status=status, reason="; ".join(reasons), stage=stage.number, accuracy=share / n, n=n,
                   correct=correct, ci_low=low, ci_high=high, floor_p=floor_p, floor_n=test_answers.n,
                   floor_correct=round(test_answers.total),
                   launches=max(count, 1), launch_sd=launch_sd if found and launch_sd > 0 else None,
                   decide=decide, evidence=evidence,
                   evidence_nights={key: [tuple(night) for night in nights] for key, nights in evidence_nights.items()},
                   failed=[*(["early stop"] if outcome.stopped_early else []),
                           *(part.test for part in parts if part.status is Status.FAIL)], self_check_p={check.name: check.p for check in checks},
                   self_check_high={check.name: check.high for check in checks if check.high is not None},
                   mcnemar_p=paired.p_drop if paired else None,
                   agreement=paired.agreement if paired else None,
                   history_p=history_paired.p_drop if history_paired else None,
                   pinned_p=pinned_paired.p_drop if pinned_paired else None,
                   **_divergence_fields(diverged))


def _margin(key: str, gate: GateSpec) -> float:
    return gate.tolerance if key == "reference" else gate.own_margin


def _evidence(outcome: CellOutcome, gate: GateSpec, others: dict[str, Side], launch_sd: float,
              carried: dict[str, Sequence[NightDrop]], churn: float = 0.0) -> dict[str, list[NightDrop]]:
    """Each accumulating test's nights since the cell last passed: those carried from earlier nights,
    then tonight's drop over every launch the cell and its reference have at this stage (the
    likelihood ratio stopped where the night stopped launching it: harness.gate.evidence). What
    tonight's launches churn is tonight's alone: the cell's, and the reference's (launched again
    every night), not the history's baseline (the same runs on the nights since the cell's pass)."""
    found = {}
    mine = Answers.of(outcome.questions, gate.extraction)
    for key, other in others.items():
        every = [run.questions for run in _runs(other)]
        if not every:
            continue
        theirs = Answers.pooled(every, gate.extraction)
        paired = paired_comparison(mine, theirs, _margin(key, gate), launch_sd=launch_sd)
        if paired is None:
            continue
        fresh = churn_variance(mine, theirs, churn, other_fresh=key == "reference")
        found[key] = [*carried.get(key, ()), night_drop(paired, shared_launches=key == "history", fresh=fresh)]
    return found


def _divergence_fields(diverged: Divergence | None) -> dict[str, float | int | None]:
    if diverged is None:
        return {}
    return {"divergence_p": diverged.p, "divergence_share": diverged.share, "divergence_nats": diverged.nats,
            "divergence_top1": diverged.top1, "divergence_high": diverged.high, "divergence_n": diverged.n}
