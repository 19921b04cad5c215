"""A cell's score from its question records: pure, shared by the evaluator, the gate's extension and
anything that reads answers back (no HTTP client here)."""

from __future__ import annotations

from harness.records import QuestionRecord, Score, Throughput


def score(records: list[QuestionRecord], eval_s: float) -> Score:
    """Accuracy over answered questions; transport failures are counted, not scored."""
    answered = [r for r in records if r.error is None]
    n = len(answered)
    correct = sum(r.correct for r in answered)
    tokens = sum(r.output_tokens for r in answered)
    return Score(
        n=n, correct=correct, accuracy=correct / n if n else 0.0,
        correct_strict=sum(r.correct_strict for r in answered),
        invalid_rate=sum(r.pred is None for r in answered) / n if n else 0.0,
        truncated_rate=sum(r.finish_reason == "length" for r in answered) / n if n else 0.0,
        infra_failures=len(records) - n, retries=sum(r.attempts - 1 for r in records), eval_s=eval_s,
        throughput=Throughput(requests_per_s=len(records) / eval_s if eval_s > 0 else 0.0,
                              output_tokens_per_s=tokens / eval_s if eval_s > 0 else 0.0))
