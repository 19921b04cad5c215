"""The self-checks of a cell (pure): what its own sampled questions, asked again inside the cell
(harness.benchmark.self_checks), say with no reference cell to compare with.

- co-batch: each question's teacher-forced log-probabilities alone against the same in the full
  batch of the evaluation; a question is *beyond* when its divergence exceeds the tolerance.
- cache: the same after the prefix cache was flushed (computed from scratch) against alone (read
  from the cache).
- decode: each question's answer decoded again, and a follow-up that read the answer's KV rows from
  the cache, against a prefill of the same tokens from scratch (harness.benchmark.decode_check); a
  question is *beyond* when either part's mean |delta log p| exceeds the tolerance. Decode and
  prefill run different kernels, so deterministic inference does not make this one zero-tolerance.
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
from harness.records import DecodeCheck, QuestionRecord, TeacherForced

CHECKS = ("co-batch", "cache", "decode", "replay")


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


def _mean_gap(decoded: list[float], prefilled: list[float]) -> float | None:
    return sum(abs(a - b) for a, b in zip(decoded, prefilled, strict=True)) / len(decoded) if decoded else None


def _decode_check(found: list[DecodeCheck], tolerance: float, healthy_share: float) -> SelfCheck | None:
    """decode vs a prefill from scratch: per question the larger of the answer's and the follow-up's
    mean |delta log p| (nats/token), against `tolerance`, the divergence test's binomial."""
    answers, follows, values = [], [], []
    hits = 0
    for check in found:
        answer = _mean_gap(check.decoded[:check.follow_start], check.prefilled[:check.follow_start])
        follow = _mean_gap(check.decoded[check.follow_start:], check.prefilled[check.follow_start:])
        parts = [value for value in (answer, follow) if value is not None]
        if not parts:
            continue
        answers += [answer] if answer is not None else []
        follows += [follow] if follow is not None else []
        values.append(max(parts))
        hits += (check.follow_cached or 0) > check.prompt_tokens
    if not values:
        return None
    beyond = sum(value > tolerance for value in values)
    p = beyond_p(beyond, len(values), healthy_share)
    worst = [f"{label} worst {max(group):.3g}" for label, group in (("answer", answers), ("follow-up", follows)) if group]
    return SelfCheck("decode", len(values), beyond, p,
                     f"{beyond} of {len(values)} questions decoded beyond {tolerance:.3g} nats/token from a prefill of "
                     f"the same tokens (healthy: <= {healthy_share:.0%}; {', '.join(worst)}; {hits} follow-ups read "
                     f"their answer's decoded KV from the cache)", high=quantile(values, TOP_QUANTILE))


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
    asked = [r.checks.decode for r in sampled if r.checks.decode is not None]
    decode = _decode_check([c for c in asked if c.error is None], tolerance, healthy_share)
    if decode is not None:
        made.append(decode)
    elif asked:
        why = next((c.error for c in asked if c.error), "no question had decoded tokens")
        unmeasured.append(f"self-check decode not measured ({why[:160]})")
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
