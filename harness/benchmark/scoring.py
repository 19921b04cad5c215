"""A cell's score from its question records: pure, shared by the evaluator, the gate's extension and
anything that reads answers back (no HTTP client here)."""

from __future__ import annotations

from harness.records import QuestionRecord, Score, Throughput


def score(records: list[QuestionRecord], eval_s: float) -> Score:
    """Accuracy over answered questions; transport failures are counted, not scored."""
    answered = [r for r in records if r.error is None]
    n = len(answered)
    correct = correct_strict = tokens = invalid = truncated = 0
    for r in answered:  # one pass: a nightly judges ~70 cells of 2,638 answers several times
        correct += r.correct
        correct_strict += r.correct_strict
        tokens += r.output_tokens
        invalid += r.pred is None
        truncated += r.finish_reason == "length"
    return Score(
        n=n, correct=correct, accuracy=correct / n if n else 0.0, correct_strict=correct_strict,
        invalid_rate=invalid / n if n else 0.0, truncated_rate=truncated / n if n else 0.0,
        infra_failures=len(records) - n, retries=sum(r.attempts for r in records) - len(records), eval_s=eval_s,
        throughput=Throughput(requests_per_s=len(records) / eval_s if eval_s > 0 else 0.0,
                              output_tokens_per_s=tokens / eval_s if eval_s > 0 else 0.0))
