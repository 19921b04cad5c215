"""Typed records that cross module and process boundaries (docs/results-contract.md): the bottom
layer of the harness above `harness.codes`, importing nothing else of it (tests/test_layers.py checks).

`RunInfo` (run.json) and `CellResult` (cells.jsonl) are the contract other tools read; their
`SCHEMA_VERSION` moves when a field changes meaning or disappears (new optional fields do not).
The codes the records carry (`Status`, `ErrorKind`, `ExitCode`) live in `harness.codes` and are named
here too, for readers of the contract.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from harness.codes import ErrorKind as ErrorKind
from harness.codes import ExitCode as ExitCode
from harness.codes import Status as Status
from harness.codes import run_exit_code as run_exit_code
from harness.codes import status_counts as status_counts

SCHEMA_VERSION = 2  # 1: before schema_version, error_kind and package_versions were recorded


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)


TEST_SPLIT = "test"
# Before `split` was recorded, a train question (asked past the test split) was index 100000 + i.
_LEGACY_TRAIN_OFFSET = 100_000


class TeacherForced(Record):
    """A question's teacher-forced pass: the server read the prompt plus a fixed continuation (the
    benchmark's reference solution) and returned, without decoding, each continuation token's
    log-probability and its own top-1 token there (harness.gate.divergence compares two servers')."""

    start: int = 0  # prompt tokens: the continuation's first token is at this position
    token_ids: list[int] = []
    logprobs: list[float] = []
    top_ids: list[int] = []
    cached_tokens: int | None = None  # of this request's prompt, from the prefix cache
    error: str | None = None  # the request failed (never a score: the question is left out of the test)


class Replay(Record):
    """A question answered again once the cell's prefix cache holds its whole prompt (harness.benchmark.self_checks)."""

    pred: str | None = None
    correct: bool = False
    correct_strict: bool = False
    output: str = ""
    cached_tokens: int | None = None
    error: str | None = None  # the request failed (never a score: the question is left out of the test)


class DecodeCheck(Record):
    """A sampled question decoded again and its decoded tokens then prefilled from scratch
    (harness.benchmark.decode_check; sglang's own kl_test_utils compare the same): a server's
    decode path, and a request that reads KV rows a decode wrote, against a prefill of the same tokens."""

    prompt_tokens: int = 0
    token_ids: list[int] = []  # the answer's decoded tokens, then the follow-up's (from `follow_start` on)
    decoded: list[float] = []  # each token's log-probability as the server decoded it
    prefilled: list[float] = []  # the same token's log-probability in a prefill of the whole sequence from scratch
    follow_start: int = 0
    follow_cached: int | None = None  # the follow-up's prompt tokens read from the cache (> prompt_tokens: decode-written rows)
    error: str | None = None  # a request failed (never a score: the question is left out of the check)


class SelfChecks(Record):
    """A sampled question asked again inside its own cell, after the evaluation, one at a time
    (harness.benchmark.self_checks): evidence that needs no reference cell."""

    alone: TeacherForced | None = None  # its teacher text scored with nothing else in flight (the cache warm)
    cold: TeacherForced | None = None  # the same right after the prefix cache was flushed (None: no flush route)
    replay: Replay | None = None  # its question answered again, the cache warm with its whole prompt
    decode: DecodeCheck | None = None  # its answer decoded again, then prefilled from scratch (None: not asked)


class QuestionRecord(Record):
    """One question as asked and answered. `error` set means an infrastructure failure, not a score.
    `(split, index)` is the question's identity in its benchmark's data; the floor counts `test` only."""

    index: int
    split: str = TEST_SPLIT
    prompt_sha: str
    gold: str
    pred: str | None
    pred_strict: str | None = None
    correct: bool
    correct_strict: bool = False
    finish_reason: str | None
    output: str
    latency_s: float
    output_tokens: int
    attempts: int = 1
    error: str | None = None
    cached_tokens: int | None = None  # prompt tokens the server served from its prefix cache (None: not reported)
    teacher: TeacherForced | None = None  # None: not asked (the protocol has no teacher text, or it is off)
    checks: SelfChecks | None = None  # None: not one of the cell's sampled self-check questions
    # Which launch of the cell's server answered (0: the first; a relaunch, harness.run.relaunch, is 1, 2, ...).
    # The same question answered by two launches is two records.
    launch: int = 0

    @model_validator(mode="before")
    @classmethod
    def _split_of_older_lines(cls, data: Any) -> Any:
        if isinstance(data, dict) and "split" not in data and isinstance(data.get("index"), int) \
                and data["index"] >= _LEGACY_TRAIN_OFFSET:
            return {**data, "split": "train"}
        return data

    @property
    def is_test(self) -> bool:
        return self.split == TEST_SPLIT


class Timings(Record):
    queued_s: float = 0.0
    startup_s: float = 0.0
    eval_s: float = 0.0
    total_s: float = 0.0
    # Wall clock (epoch seconds) when the worker started and finished: GPU occupancy for schedules.
    started_at: float | None = None
    ended_at: float | None = None


class Throughput(Record):
    requests_per_s: float = 0.0
    output_tokens_per_s: float = 0.0


class Score(Record):
    """What the evaluator measured on one server."""

    n: int
    correct: int
    accuracy: float
    correct_strict: int
    invalid_rate: float
    truncated_rate: float
    infra_failures: int
    retries: int
    eval_s: float
    throughput: Throughput


class ServerInfo(Record):
    """What a server said about itself after it became ready."""

    version: str | None = None
    resolved: dict[str, Any] = {}
    cuda_visible_devices: str | None = None
    node: str | None = None
    port: int | None = None


class CellError(Record):
    """Why a cell could not be measured: a kind to count and filter on, and words for people."""

    kind: ErrorKind
    message: str

    def __str__(self) -> str:
        return self.message


class CellOutcome(Record):
    """What a worker returns for one cell: measurements only, no verdict yet."""

    cell_id: str
    args: list[str]
    server: ServerInfo = ServerInfo()
    mismatches: list[str] = []
    score: Score | None = None
    questions: list[QuestionRecord] = []
    error: CellError | None = None
    log_path: str | None = None
    log_tail: str = ""
    timings: Timings = Timings()
    stopped_early: str | None = None
    # Why the configuration the cell is labelled with could not be checked (an engine that reports
    # none): the cell is judged, and its reason says so.
    unverified: str | None = None


class LaunchSample(Record):
    """What a cell's launches in one run say about launch spread (harness.gate.launches): the sum of
    squared deviations of its launches' accuracies from their mean, on the questions every launch
    answered (`between`, `df` = launches - 1 degrees of freedom), and the part of it the questions'
    own sampling explains (`within`, its expectation when launches differ only by chance per question)."""

    df: int
    between: float
    within: float
    n: int  # questions every launch answered


class Verdict(Record):
    """What the gate decided for one cell, with the numbers behind it (`harness.gate.verdict.judge`)."""

    status: Status
    reason: str
    stage: int = 1  # 1: judged on the planned questions; 2: again after the extension (harness.gate.budget)
    accuracy: float | None = None
    n: int = 0
    correct: int = 0
    ci_low: float | None = None
    ci_high: float | None = None
    floor_p: float | None = None
    # The test-split answers the floor was tested on (extension train questions are not); 0: unknown.
    floor_n: int = 0
    floor_correct: int = 0
    mcnemar_p: float | None = None
    agreement: float | None = None
    history_p: float | None = None
    pinned_p: float | None = None  # against the suite's pinned run (gate.pinned_run)
    # Teacher-forced divergence from the reference cell (harness.gate.divergence): p of "more
    # questions beyond the tolerance than a healthy cell has", the share beyond it, the mean
    # |delta log-probability| per token (nats) and the share of positions whose top-1 differs.
    divergence_p: float | None = None
    divergence_share: float | None = None
    divergence_nats: float | None = None
    divergence_top1: float | None = None
    divergence_high: float | None = None  # the 95th percentile of its questions' divergences (regress calibrate)
    divergence_n: int = 0
    error_kind: ErrorKind | None = None  # set when status is `error`
    launches: int = 1  # server launches the verdict rests on (harness.run.relaunch)
    launch_sd: float | None = None  # the launch spread (sd, a fraction) the paired tests added; null: none
    launch_sample: LaunchSample | None = None  # this cell's launches, for the run's launch-spread estimate
    decide: str | None = None  # `inconclusive`: what would decide it (another launch, more questions)
    # The tests that failed it: floor, reference, history, pinned, divergence, early stop,
    # self-check <name>, evidence <name>, model-wide, reference broken
    failed: list[str] = []
    # The cell's self-checks (harness.gate.self_checks): check ("co-batch", "cache", "decode", "replay") -> its p-value
    self_check_p: dict[str, float] = {}
    # co-batch, cache, decode -> the 95th percentile of the sampled questions' divergences (regress calibrate)
    self_check_high: dict[str, float] = {}
    # The evidence of a drop accumulated over the cell's nights since it last passed (harness.gate.evidence):
    # test ("reference", "history") -> [nights, log e-value]
    evidence: dict[str, tuple[int, float]] = {}
    # Those nights' drops, oldest first, each [drop - margin, its variance, the most another night may
    # share]: the next night's likelihood ratio reads them all (harness.gate.evidence.NightDrop)
    evidence_nights: dict[str, list[tuple[float, float, float]]] = {}


class CellResult(Verdict):
    """One line of cells.jsonl: a verdict and everything it was made from (the contract other tools read)."""

    cell_id: str
    model: str
    factors: dict[str, str]
    args: list[str]
    resolved: dict[str, Any]
    invalid_rate: float | None = None
    truncated_rate: float | None = None
    reference_cell: str | None = None
    threshold: float | None = None
    timings: Timings = Timings()
    throughput: Throughput = Throughput()
    mlflow_run_id: str | None = None
    log_path: str | None = None
    protocol_fingerprint: str | None = None
    server_version: str | None = None
    cuda_visible_devices: str | None = None
    node: str | None = None
    stopped_early: bool = False
    history_run_id: str | None = None  # the newest earlier run (the cell passed there) this cell was compared with
    history_runs: list[str] = []  # every earlier run whose answers the history test pooled, newest first
    predicted: dict[str, Any] = {}  # resolved fields the plan-time sglang check predicted (engine sglang)


class RunInfo(Record):
    """run.json: how a run was produced and how it ended."""

    schema_version: int = 1  # files written before the field existed; new runs write SCHEMA_VERSION
    run_id: str
    suite: str
    config_path: str
    config_sha256: str
    trigger: str = "manual"
    engine: str
    git_commit: str | None = None  # of the harness's own checkout, not of the working directory
    git_dirty: bool | None = None  # the harness's checkout had uncommitted changes
    sglang_version: str | None = None
    harness_version: str
    package_versions: dict[str, str] = {}  # the driver's python, ray, mlflow, ... (servers report sglang's)
    benchmark: str = "gsm8k"
    protocol: str
    extraction: str = "flexible"  # the answer extraction that gated (gate.extraction)
    gate_budget: str | None = None  # where the run's alpha went (harness.gate.budget.Budget.describe)
    protocol_fingerprint: str | None = None
    dataset_sha256: str | None = None
    started_at: str
    ended_at: str | None = None
    counts: dict[str, int] = {}
    exit_code: int | None = None
    mlflow_run_id: str | None = None
    mlflow_experiment_id: str | None = None
    tracking_uri: str | None = None
    tracking_error: str | None = None
    # Why some of the run could not be written to its results folder (a full or read-only disk), and
    # where it went instead; the process then exits 3, whatever `exit_code` (the verdicts') says.
    results_error: str | None = None
    attribution: str | None = None
    interrupted: bool = False
    tags: dict[str, str] = {}  # `regress run --tag KEY=VALUE`: a PR number, an sglang ref; MLflow tags too


def latest_per_cell(results: list[CellResult]) -> dict[str, CellResult]:
    """cells.jsonl as every reader takes it: a later line of a cell (after its extension, or a
    `--resume --retry-errors`) replaces the earlier one."""
    return {result.cell_id: result for result in results}


