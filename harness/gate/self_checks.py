"""The self-checks of a cell (pure): what its own sampled questions, asked again inside the cell
(harness.benchmark.self_checks), say with no reference cell to compare with.

- co-batch: each question's teacher-forced log-probabilities alone against the same in the full
  batch of the evaluation; a question is *beyond* when its divergence exceeds the tolerance.
- cache: the same after the prefix cache was flushed (computed from scratch) against alone (read
  from the cache).
- replay: the question answered again with its whole prompt cached against its first answer: the
  paired drop in accuracy (losses: right first, wrong on the replay), H0: drop <= gate.tolerance.

co-batch and cache are the divergence test's exact binomial on the count beyond against
`healthy_share` (harness.gate.divergence), beyond `gate.self_checks.tolerance` (nats/token; unset:
the model's divergence tolerance; `regress calibrate` proposes it from the 95th percentile, `high`,
passing cells recorded); with deterministic inference on (the cell asked for it)
both are zero-tolerance: a single question whose numbers moved at all is beyond, and none may be.
Each check can fail a cell, never hold it open, at its share of the cell's self-check alpha
(harness.gate.budget); a check the server could not answer is "not measured", never passed.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.gate.divergence import TOP_QUANTILE, beyond_p, quantile, question_divergence
from harness.gate.stats import drop_above_margin_p
from harness.records import QuestionRecord, TeacherForced

CHECKS = ("co-batch", "cache", "replay")


@dataclass(frozen=True)
class SelfCheck:
    name: str
    n: int  # questions compared
    beyond: int  # diverged (co-batch, cache) or answered right first and wrong on the replay
    p: float
    detail: str
    high: float | None = None  # co-batch, cache: the 95th percentile of the questions' divergences (regress calibrate)

    def describe(self, alpha: float) -> str:
        verdict = f" < {alpha:.2g}" if self.p < alpha else ""
        return f"self-check {self.name}: {self.detail}, p={self.p:.2g}{verdict}"


def _divergence_check(name: str, pairs: list[tuple[TeacherForced, TeacherForced]], tolerance: float,
                      healthy_share: float, deterministic: bool, what: str) -> SelfCheck | None:
    compared = [found for a, b in pairs if (found := question_divergence(a, b)) is not None]
    if not compared:
        return None
    limit = 0.0 if deterministic else tolerance
    share = 0.0 if deterministic else healthy_share
    beyond = sum(value > limit for value, _, _ in compared)
    worst = max(value for value, _, _ in compared)
    p = beyond_p(beyond, len(compared), share) if share > 0 else (0.0 if beyond else 1.0)
    rule = "moved at all (deterministic inference)" if deterministic else f"beyond {tolerance:.3g} nats/token"
    return SelfCheck(name, len(compared), beyond, p, f"{beyond} of {len(compared)} questions {what} {rule} "
                                                      f"(healthy: <= {share:.0%}; worst {worst:.3g} nats/token)",
                     high=quantile([value for value, _, _ in compared], TOP_QUANTILE))


def self_checks(records: list[QuestionRecord], tolerance: float, healthy_share: float, margin: float,
                deterministic: bool = False, extraction: str = "flexible") -> tuple[list[SelfCheck], list[str]]:
    """(the checks made, what could not be measured and why) over the cell's sampled questions."""
    sampled = [r for r in records if r.checks is not None and r.teacher is not None]
    if not sampled:
        return [], []
    made, unmeasured = [], []
    cobatch = _divergence_check("co-batch", [(r.checks.alone, r.teacher) for r in sampled if r.checks.alone],
                                tolerance, healthy_share, deterministic, "alone vs batched")
    cache = _divergence_check("cache", [(r.checks.cold, r.checks.alone) for r in sampled
                                        if r.checks.cold and r.checks.alone], tolerance, healthy_share, deterministic,
                              "cold (cache flushed) vs warm")
    for name, check in (("co-batch", cobatch), ("cache", cache)):
        if check is not None:
            made.append(check)
        else:
            why = next((t.error for r in sampled for t in (r.checks.alone, r.checks.cold) if t is not None and t.error),
                       "the server answered none of them")
            unmeasured.append(f"self-check {name} not measured ({why[:160]})")
    replays = [(r, r.checks.replay) for r in sampled if r.checks.replay is not None and r.checks.replay.error is None]
    if replays:
        def right(record) -> bool:
            return record.correct_strict if extraction == "strict" else record.correct

        losses = sum(right(r) and not right(replay) for r, replay in replays)
        gains = sum(right(replay) and not right(r) for r, replay in replays)
        changed = sum(replay.output != r.output for r, replay in replays)
        p = drop_above_margin_p(losses, gains, len(replays), margin)
        made.append(SelfCheck("replay", len(replays), losses, p, f"{len(replays)} questions answered again with their "
                              f"prompt cached: {changed} answers changed, lost {losses}, gained {gains} "
                              f"(H0: drop <= {margin * 100:.3g} pts)"))
    else:
        unmeasured.append("self-check replay not measured (no replay was answered)")
    return made, unmeasured
