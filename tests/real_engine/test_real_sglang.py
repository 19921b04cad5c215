"""Real sglang 0.5.23 on this CPU, launched by `regress run` through Ray (`cluster.platform: cpu`),
in one run of one suite (a real server's scheduler process alone spends ~20 s of CPU importing
sglang here, so the tests share two runs):

- radix cache on and off and a tp-2 cell serve a tiny random-weight Llama built here, and healthy
  radix-on passes the teacher-forced divergence test against radix-off;
- a backend that sglang silently replaces is `mismatch` at plan time with no server started;
- a scheduler that crashes is an `error` at once;
- the incident's class of bug, planted by a custom axis value that sets the server's environment
  (wrong KV rows read on prefix-cache hits), fails its radix-on cell by teacher-forced divergence
  against the healthy radix-off reference while every cell scores 0 on GSM8K;
- two bugs a cold pass never meets (a wholly cached prompt computed wrong; a cache hit on rows a
  decode wrote read wrong) fail their radix-on cells by the decode self-check alone;
- nothing is left running, no stop logs a crash, no stand-in function runs;
- a second run whose reference (radix on, each axis's first value) carries the prefix-KV plant: the
  reference fails its own cache check and the healthy radix-off cell is held open ("reference
  broken"), never failed; a cell with cross-request contamination planted fails its co-batch check.

Needs the environment `make sglang-env` builds (part of `make test`)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from harness.records import CellResult, QuestionRecord, Status
from tests.helpers import ROOT, machine_s
from tests.test_run_end_to_end import invoke, only_run

SGLANG_PYTHON = ROOT / ".sglang-0.5.23" / "bin" / "python"
MODEL_CACHE = ROOT / ".cache" / "tiny-llama"
PLANTS = Path(__file__).resolve().parent / "plants"
pytestmark = [pytest.mark.real_engine]


@pytest.fixture(scope="module")
def tiny_model(_gsm8k_env: Path) -> Path:
    assert SGLANG_PYTHON.exists(), "the pinned sglang is missing: `make sglang-env` installs it (make test does)"
    subprocess.run([str(SGLANG_PYTHON), str(Path(__file__).with_name("tiny_model.py")), str(MODEL_CACHE),
                    str(_gsm8k_env)], check=True, capture_output=True, timeout=machine_s(300))
    return MODEL_CACHE


def cpu_suite(tmp_path: Path, model: Path, models: str, axes: str, extra: str = "", questions: int = 6,
              concurrency: int = 3, model_args: str = "[]") -> Path:
    """A suite of real sglang on this CPU; `models` is formatted with {model}, {startup}, {log},
    {plants} and {model_args} (a YAML list of the servers' extra arguments)."""
    path = tmp_path / "cpu.yaml"
    path.write_text(f"""
suite: real-cpu
engine: sglang
python: {SGLANG_PYTHON}
cluster: {{platform: cpu, gpus: 2}}
num_questions: {questions}
max_tokens: 12
concurrency: {concurrency}
request_timeout_s: {machine_s(120):.0f}
stop_grace_s: 20
gate: {{extend_to: null, tolerance: 0.2, min_effect: 0.5, self_checks: {{max_share: 1.0}}}}  # what 6 questions can bound (divergence does the work)
models:
{models.format(model=model, startup=f"{machine_s(300):.0f}", log=tmp_path / "stand-ins.log", plants=PLANTS,
               model_args=model_args)}
axes:
{axes}
{extra}
""")
    return path


def sglang_processes(model: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if str(model) in line and "sglang" in line]


@dataclass(frozen=True)
class RealRun:
    exit_code: int
    output: str
    run_dir: Path
    cells: dict[str, CellResult]
    stand_in_log: Path
    leftover: list[str]


CLEAN = ("tiny.ab-torch_native.rc-on.plant-none", "tiny.ab-torch_native.rc-off.plant-none",
         "tiny-tp2.ab-torch_native.rc-off.plant-none")
REPLACED = "tiny.ab-intel_amx.rc-on.plant-none", "tiny.ab-intel_amx.rc-off.plant-none"
PLANTED, PLANTED_REFERENCE = "tiny.ab-torch_native.rc-on.plant-prefix_kv", "tiny.ab-torch_native.rc-off.plant-none"
WARM_ONLY, DECODE_HIT = "tiny.ab-torch_native.rc-on.plant-warm_prompt", "tiny.ab-torch_native.rc-on.plant-decode_kv"
CRASHED = "tiny.ab-torch_native.rc-off.plant-scheduler_crash"


@pytest.fixture(scope="module")
def real_run(ray_local, tiny_model, tmp_path_factory) -> RealRun:
    """Seven real servers (radix on and off, one of tp 2, three planted with a cache bug each, one
    that crashes) and two cells decided at plan time, in one `regress run`; reference: radix cache off,
    no plant. The plants are values of a custom axis that sets the server's environment, as a suite
    would switch one of sglang's SGLANG_* variables."""
    tmp_path = tmp_path_factory.mktemp("real-run")
    models = """  - id: tiny
    path: {model}
    floor: 0.0
    startup_timeout_s: {startup}
    env: {{REGRESS_STAND_IN_LOG: "{log}", PYTHONPATH: "{plants}"}}
  - id: tiny-tp2
    path: {model}
    tp: 2
    floor: 0.0
    startup_timeout_s: {startup}
    env: {{REGRESS_STAND_IN_LOG: "{log}", PYTHONPATH: "{plants}"}}"""
    axes = ("  attention_backend: [torch_native, intel_amx]\n  radix_cache: [on, off]\n"
            "  plant: {none: [], prefix_kv: {env: {REGRESS_PLANT: prefix_kv}},"
            " scheduler_crash: {env: {REGRESS_PLANT: scheduler_crash}},"
            " warm_prompt: {env: {REGRESS_PLANT: warm_prompt}}, decode_kv: {env: {REGRESS_PLANT: decode_kv}}}")
    planted = "[prefix_kv, scheduler_crash, warm_prompt, decode_kv]"
    extra = (f"exclude:\n  - {{plant: {planted}, attention_backend: intel_amx}}\n"
             "  - {plant: [prefix_kv, warm_prompt, decode_kv], radix_cache: off}\n"
             "  - {plant: scheduler_crash, radix_cache: on}\n"
             "  - {model: tiny-tp2, attention_backend: intel_amx}\n  - {model: tiny-tp2, radix_cache: on}\n"
             f"  - {{model: tiny-tp2, plant: {planted}}}\n"
             "baseline: {attention_backend: torch_native, radix_cache: off}")
    results = tmp_path / "results"
    result = invoke("run", str(cpu_suite(tmp_path, tiny_model, models, axes, extra)), "--results-dir", str(results),
                    "--no-tracking")
    run_dir = only_run(results)
    cells = {c.cell_id: c for c in map(CellResult.model_validate_json, (run_dir / "cells.jsonl").read_text().splitlines())}
    return RealRun(result.exit_code, result.output, run_dir, cells, tmp_path / "stand-ins.log",
                   sglang_processes(tiny_model))


def test_the_run_judges_every_cell_leaves_nothing_running_and_calls_no_stand_in(real_run):
    assert {c for c, r in real_run.cells.items() if r.status is not Status.SKIPPED} == {
        *CLEAN, *REPLACED, PLANTED, WARM_ONLY, DECODE_HIT, CRASHED}  # the rest: excluded
    assert real_run.exit_code == 1, real_run.output  # the planted cell: a regression
    assert real_run.leftover == []
    assert not real_run.stand_in_log.exists()  # no stand-in function was ever called


def test_regress_run_serves_a_cpu_matrix_on_real_sglang(real_run):
    for cell_id in CLEAN:  # three real servers: they answered every question, as labelled
        cell = real_run.cells[cell_id]
        assert cell.status is Status.PASS, cell.reason
        assert cell.n == 6 and cell.server_version == "0.5.23" and cell.resolved["attention_backend"] == "torch_native"
        assert cell.resolved["disable_radix_cache"] is (".rc-off." in cell_id)
        assert cell.resolved["tp_size"] == (2 if cell_id.startswith("tiny-tp2") else 1)
        assert cell.args[cell.args.index("--device") + 1] == "cpu" and "--sleep-on-idle" in cell.args
        # The plan-time check described the CPU platform, so it predicted what the server resolved
        # (described as an H200 it said chunked_prefill_size 8192; a CPU server resolves 4096).
        assert cell.predicted["chunked_prefill_size"] == cell.resolved["chunked_prefill_size"] == 4096
        assert "the sglang check predicted" not in cell.reason
        log = Path(cell.log_path).read_text()
        assert "crashed with exit code" not in log  # the launcher was stopped first, gracefully
        cached = [q.cached_tokens for q in questions_of(real_run.run_dir, cell_id)]
        assert None not in cached  # sglang reported them (--enable-cache-report)
        if ".rc-on." in cell_id:  # the few-shot prefix was served from the radix cache
            assert sum(tokens > 0 for tokens in cached) >= 1, cached
        else:
            assert set(cached) == {0}, cached
    # Healthy radix-on against its radix-off reference: the teacher-forced test ran and found nothing.
    healthy = real_run.cells["tiny.ab-torch_native.rc-on.plant-none"]
    assert healthy.divergence_n == 6 and healthy.divergence_share <= 1 / 3, healthy.reason


def test_a_backend_sglang_replaces_is_a_mismatch_at_plan_time(real_run):
    for cell_id in REPLACED:  # sglang runs intel_amx as torch_native without the AMX kernels: said at plan time
        cell = real_run.cells[cell_id]
        assert cell.status is Status.MISMATCH
        assert "attention_backend: requested 'intel_amx', sglang resolves it to 'torch_native' (plan-time check" in cell.reason
        assert cell.node is None and cell.timings.startup_s == 0 and cell.log_path is None


def test_a_scheduler_that_crashes_is_an_error_at_once(real_run):
    """A planted scheduler crash in the server's first batch (its warmup): the cell is `error`
    as soon as sglang logs it and stopped within the stop grace, not after the launcher's own ~65 s."""
    cell = real_run.cells[CRASHED]
    assert cell.status is Status.ERROR and cell.error_kind.value == "server_exited"
    assert cell.reason.startswith("server crashed during startup (its launcher was still running): "), cell.reason
    assert "Scheduler hit an exception" in cell.reason.splitlines()[0]
    log = Path(cell.log_path).read_text()
    crash = next(line for line in log.splitlines() if "Scheduler hit an exception" in line)
    crashed_at = datetime.strptime(crash[1:20], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    # Detection takes seconds; the stop then waits up to the suite's stop_grace_s (20 s) for a launcher
    # that sleeps through SIGTERM. Stretched with the machine's load, and still short of the launcher's
    # own exit (5 s of diagnostics, then 60 s "for CUDA coredumps").
    assert cell.timings.ended_at - crashed_at < 20 + min(machine_s(10), 30.0), (crash, cell.timings)
    assert json.loads((real_run.run_dir / "run.json").read_text())["counts"]["error"] == 1


def questions_of(run_dir: Path, cell_id: str) -> list[QuestionRecord]:
    return [QuestionRecord.model_validate_json(line)
            for line in (run_dir / "questions" / f"{cell_id}.jsonl").read_text().splitlines()]


def test_the_planted_incident_fails_the_radix_on_cell_by_divergence_alone(real_run):
    """The incident's class of bug planted into the real sglang (tests/real_engine/plants,
    `prefix_kv`): a request that hits the radix cache reads the wrong KV rows for its cached prefix;
    nothing raises. A random-weight model scores 0 on GSM8K on every cell, so accuracy cannot see it;
    the teacher-forced divergence from the radix-off reference fails the radix-on cell."""
    for cell_id in (PLANTED, PLANTED_REFERENCE, *CLEAN):
        cell = real_run.cells[cell_id]
        assert cell.n == 6 and cell.correct == cell.accuracy == 0, cell.reason  # GSM8K sees nothing
    teacher = [q.teacher for q in questions_of(real_run.run_dir, PLANTED)]
    assert all(t is not None and t.error is None and len(t.logprobs) > 20 for t in teacher), teacher
    # The teacher-forced requests were served from the radix cache, which the plant corrupts.
    assert all(t.cached_tokens and t.cached_tokens >= t.start - 1 for t in teacher)
    cell = real_run.cells[PLANTED]
    assert cell.status is Status.FAIL, cell.reason
    assert cell.divergence_share == 1.0 and cell.divergence_nats > 0.5, cell.reason  # the gate's 0.1 tolerance
    assert "divergence vs reference: 6 of 6 questions beyond" in cell.reason
    reference = [q.teacher for q in questions_of(real_run.run_dir, PLANTED_REFERENCE)]
    assert all(t is not None and t.cached_tokens == 0 for t in reference)
    assert real_run.cells[PLANTED_REFERENCE].status is Status.PASS


def test_each_cell_checks_itself_healthy_cells_pass_and_the_planted_cache_fails_inside_itself(real_run):
    """Every served cell asked its 6 questions again inside itself (alone, replayed warm, cold after
    `/flush_cache`): on real sglang the healthy cells agree with themselves, and the planted radix-on
    cell fails its own cache check, with no reference involved (its warm numbers are the plant's,
    its cold ones the model's)."""
    for cell_id in CLEAN:
        cell = real_run.cells[cell_id]
        assert set(cell.self_check_p) == {"co-batch", "cache", "decode", "replay"}, cell.reason
        assert not any(name.startswith("self-check") for name in cell.failed), cell.reason
        checks = [q.checks for q in questions_of(real_run.run_dir, cell_id) if q.checks]
        assert len(checks) == 6 and all(c.cold.cached_tokens == 0 for c in checks)  # the flush emptied the cache
        assert all(c.decode.error is None and len(c.decode.token_ids) > c.decode.follow_start > 0 for c in checks)
        if ".rc-on." in cell_id:
            assert all(c.replay.cached_tokens for c in checks)  # replayed with the prompt cached
            # the follow-up read its answer's decoded rows from the cache (a decode-cache hit)
            assert all(c.decode.follow_cached > c.decode.prompt_tokens for c in checks)
        else:
            assert all(c.decode.follow_cached == 0 for c in checks)
    planted = real_run.cells[PLANTED]
    assert "self-check cache" in planted.failed and planted.self_check_p["cache"] < 1e-4, planted.reason


@pytest.mark.parametrize("cell_id", [WARM_ONLY, DECODE_HIT])
def test_a_cell_wrong_only_on_a_warm_prompt_or_a_decode_cache_hit_fails_its_decode_check_alone(real_run, cell_id):
    """Two bugs a cold pass never meets, planted in real sglang: a request whose whole prompt is
    cached computes its last token from the wrong rows (`warm_prompt`, sglang PR #16053's class), or
    a cache hit on rows a decode wrote reads the wrong ones (`decode_kv`, the decode-cache-hit
    class of sglang's kl_test_utils). Their evaluation and teacher-forced text never hit either, so
    divergence from the healthy reference passes; the decode check's follow-up hits both and fails
    the cell, and nothing else does."""
    cell = real_run.cells[cell_id]
    assert cell.status is Status.FAIL and cell.failed == ["self-check decode"], cell.reason
    assert cell.self_check_p["decode"] < 1e-4 and cell.divergence_share <= 1 / 3, cell.reason
    assert all(cell.self_check_p[name] > 0.01 for name in ("co-batch", "cache")), cell.reason
    checks = [q.checks.decode for q in questions_of(real_run.run_dir, cell_id) if q.checks]
    assert all(c.follow_cached > c.prompt_tokens for c in checks)  # the follow-ups hit the decoded rows


BROKEN_REFERENCE = "tiny.ab-torch_native.rc-on.plant-prefix_kv"
BLAMELESS = "tiny.ab-torch_native.rc-off.plant-prefix_kv"
CONTAMINATED = "tiny.ab-torch_native.rc-off.plant-co_batch"


@pytest.fixture(scope="module")
def broken_reference_run(ray_local, tiny_model, tmp_path_factory) -> RealRun:
    """A second run (issue 42's finding): the suite's baseline is radix cache on (each axis's first
    value, as a new suite has it) and that server carries the prefix-KV plant, which only a cache hit
    shows; radix off with the same plant never hits the cache (healthy). A third server mixes other
    requests' numbers into a prefill that shares the server with them (`co_batch`). 12 questions,
    4 at a time, so that most evaluation requests have company."""
    tmp_path = tmp_path_factory.mktemp("broken-reference")
    models = """  - id: tiny
    path: {model}
    floor: 0.0
    startup_timeout_s: {startup}
    env: {{REGRESS_STAND_IN_LOG: "{log}", PYTHONPATH: "{plants}"}}"""
    axes = ("  attention_backend: [torch_native]\n  radix_cache: [on, off]\n"
            "  plant: {prefix_kv: {env: {REGRESS_PLANT: prefix_kv}}, co_batch: {env: {REGRESS_PLANT: co_batch}}}")
    extra = "exclude:\n  - {plant: co_batch, radix_cache: on}"
    results = tmp_path / "results"
    suite = cpu_suite(tmp_path, tiny_model, models, axes, extra, questions=12, concurrency=4)
    result = invoke("run", str(suite), "--results-dir", str(results), "--no-tracking")
    run_dir = only_run(results)
    cells = {c.cell_id: c for c in map(CellResult.model_validate_json, (run_dir / "cells.jsonl").read_text().splitlines())}
    return RealRun(result.exit_code, result.output, run_dir, cells, tmp_path / "stand-ins.log",
                   sglang_processes(tiny_model))


def test_a_broken_reference_fails_its_own_cache_check_and_the_healthy_cell_is_not_blamed(broken_reference_run):
    """Before the self-checks the broken radix-on reference passed and the healthy radix-off cell
    failed on divergence from it. Now the reference fails inside itself (warm against cold after a
    flush), and the healthy cell is `inconclusive` ("reference broken"), never `fail`."""
    run = broken_reference_run
    served = {cell_id for cell_id, cell in run.cells.items() if cell.status is not Status.SKIPPED}
    assert served == {BROKEN_REFERENCE, BLAMELESS, CONTAMINATED} and run.leftover == []
    assert run.exit_code == 1, run.output  # the broken reference is a regression
    reference, healthy = run.cells[BROKEN_REFERENCE], run.cells[BLAMELESS]
    assert reference.status is Status.FAIL and "self-check cache" in reference.failed, reference.reason
    assert reference.self_check_p["cache"] < 1e-4, reference.reason
    assert healthy.status is Status.INCONCLUSIVE, healthy.reason
    assert f"reference broken: {BROKEN_REFERENCE} is fail" in healthy.reason
    assert not healthy.failed and set(healthy.self_check_p) == {"co-batch", "cache", "decode", "replay"}, healthy.reason
    attribution = json.loads((run.run_dir / "run.json").read_text())["attribution"]
    # Two failures of two causes: the healthy cell (held open by the reference) is the contrast.
    assert attribution == "radix_cache=on (covers 1 of 2 failing cells and 0 passing)", attribution


def test_a_cell_whose_prefill_reads_other_requests_fails_its_co_batch_check(broken_reference_run):
    """Cross-request contamination planted in real sglang: a prefill that shares the server with
    other requests is off, one alone is right. The cell fails its own co-batch check (its teacher text
    scored alone against the evaluation's, scored among the others), whatever its reference."""
    cell = broken_reference_run.cells[CONTAMINATED]
    assert cell.status is Status.FAIL and "self-check co-batch" in cell.failed, cell.reason
    assert cell.self_check_p["co-batch"] < 1e-4 and cell.self_check_p["cache"] > 0.01, cell.reason
