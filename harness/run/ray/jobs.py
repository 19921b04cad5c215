"""`regress submit`: run a whole `regress run` as a Ray Job on a cluster (Jobs API), stream its
logs, and return its exit code. The job's driver then runs next to the cluster, so a laptop or CI
runner can go away without losing the run."""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, InfraError

# Uploaded with the job: the package, configs and jobs, not the environment or old results.
WORKING_DIR_EXCLUDES = [".venv", "results", ".git", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache"]


@dataclass(frozen=True)
class Submission:
    address: str
    suite_path: Path
    run_args: list[str]
    runtime_env: dict[str, Any]
    python: str = "python"
    working_dir: Path = Path(".")
    # Where the job writes results/ on the cluster. The job's working directory is a temporary copy
    # that Ray deletes, so results written there (the run's relative default) would be lost.
    results_dir: str = "/var/tmp/regress-results"


def entrypoint(submission: Submission) -> str:
    """The job's command. The Jobs API takes a shell string, so every part is quoted."""
    suite = submission.suite_path
    if suite.is_absolute():
        try:
            suite = suite.relative_to(submission.working_dir.resolve())
        except ValueError:
            raise ConfigError(f"{submission.suite_path}: the suite must be inside --working-dir "
                              f"({submission.working_dir}), which is what the job uploads") from None
    argv = [submission.python, "-m", "harness.cli", "run", str(suite), "--ray-address", "auto",
            *submission.run_args]
    if not any(arg == "--results-dir" or arg.startswith("--results-dir=") for arg in submission.run_args):
        argv += ["--results-dir", submission.results_dir]
    return shlex.join(argv)


def runtime_env_for(submission: Submission) -> dict[str, Any]:
    env = dict(submission.runtime_env)
    env.setdefault("working_dir", str(submission.working_dir.resolve()))
    env.setdefault("excludes", WORKING_DIR_EXCLUDES)
    return env


def submit(submission: Submission, follow: bool = True, poll_s: float = 1.0) -> int:
    """Submit, stream the job's log to stdout, and return the run's exit code (2 when the job
    could not start its driver)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    try:
        client = JobSubmissionClient(submission.address)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise InfraError(f"cannot reach the Ray Jobs API at {submission.address}: {error}. Is the dashboard "
                         "running there (ray[default]), and is RAY_AUTH_MODE=token set if the cluster uses tokens?") from None
    job_id = None
    deadline = time.monotonic() + 120
    while job_id is None:
        try:
            job_id = client.submit_job(entrypoint=entrypoint(submission), runtime_env=runtime_env_for(submission))
        except RuntimeError as error:
            # A cluster that just started has no job agent for a few seconds; anything else is final.
            if "No available agent" not in str(error) or time.monotonic() > deadline:
                raise InfraError(f"the cluster refused the job: {error}") from None
            time.sleep(2)
    print(f"submitted Ray job {job_id} to {submission.address}", flush=True)
    if not follow:
        return 0

    async def stream() -> None:
        async for lines in client.tail_job_logs(job_id):
            sys.stdout.write(lines)
            sys.stdout.flush()

    asyncio.run(stream())
    status = client.get_job_status(job_id)
    while not status.is_terminal():
        time.sleep(poll_s)
        status = client.get_job_status(job_id)
    info = client.get_job_info(job_id)
    code = getattr(info, "driver_exit_code", None)
    if code is not None:
        return int(code)
    return 0 if status == JobStatus.SUCCEEDED else 2
