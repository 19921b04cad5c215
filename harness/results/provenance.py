"""How a run was produced: the harness's own commit and whether it was dirty, package versions, and
the run.json record that opens and closes every run (`regress run` and `regress eval` alike)."""

from __future__ import annotations

import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from harness import __version__
from harness.benchmark.base import ProtocolPlan
from harness.records import SCHEMA_VERSION, CellResult, RunInfo, status_counts

HARNESS_ROOT = Path(__file__).resolve().parents[2]
RECORDED_PACKAGES = ("ray", "mlflow", "aiohttp", "pydantic", "scipy", "datasets", "openai", "sglang")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(HARNESS_ROOT), *args], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def harness_checkout() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout the harness runs from; (None, None) for an installed package.
    Read where the package lives, never in the working directory (which may be any repository)."""
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != HARNESS_ROOT:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return _git("rev-parse", "HEAD"), None if status is None else bool(status)


def package_versions() -> dict[str, str]:
    """The driver's python and the versions of the packages a result may depend on."""
    versions = {"python": platform.python_version(), "sglang-regress": __version__}
    for name in RECORDED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_info(*, run_id: str, suite: str, config_path: str, config_sha256: str, trigger: str, engine: str,
                 plan: ProtocolPlan, extraction: str, tags: dict[str, str] | None = None) -> RunInfo:
    commit, dirty = harness_checkout()
    return RunInfo(schema_version=SCHEMA_VERSION, run_id=run_id, suite=suite, config_path=config_path,
                   config_sha256=config_sha256, trigger=trigger, engine=engine, git_commit=commit, git_dirty=dirty,
                   harness_version=__version__, package_versions=package_versions(), benchmark=plan.benchmark,
                   protocol=str(plan.name),
                   protocol_fingerprint=plan.fingerprint, dataset_sha256=plan.dataset_sha256,
                   extraction=extraction, started_at=now_iso(), tags=tags or {})


def closed_run_info(info: RunInfo, results: list[CellResult], exit_code: int, **updates: object) -> RunInfo:
    """run.json at the end of a run: when it ended, its counts, exit code and the sglang it tested."""
    versions = {r.server_version for r in results if r.server_version and r.server_version != "None"}
    return info.model_copy(update={"ended_at": now_iso(), "counts": status_counts(results), "exit_code": exit_code,
                                   "sglang_version": ", ".join(sorted(versions)) or None, **updates})
