"""The codes every layer shares: why a cell is `error` (`ErrorKind`), a cell's verdict (`Status`) and
what commands exit with (`ExitCode`). Plain enums, below `harness.records`, so that commands which
only read a suite (`regress plan`) or print an error need not import pydantic's models to name them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from enum import Enum, IntEnum
from typing import Protocol


class ErrorKind(str, Enum):
    """Why a cell could not be measured (never a score)."""

    SERVER_EXITED = "server_exited"  # during startup: bad flag, import error, OOM
    NOT_READY = "not_ready"  # startup_timeout_s passed
    SERVER_INFO = "server_info"  # /server_info unreadable
    CRASHED = "crashed"  # exited during evaluation
    HUNG = "hung"  # no answers and a silent /health_generate
    TRANSPORT = "transport"  # too many questions failed in transport
    NO_ANSWERS = "no_answers"  # nothing was asked
    LEFTOVER_PROCESSES = "leftover_processes"  # server processes survived the stop
    WORKER_DIED = "worker_died"  # the Ray worker (or its node) died twice
    WORKER_FAILED = "worker_failed"  # Ray raised for the cell's task
    NO_NODE = "no_node"  # no node could hold the cell for cluster.wait_for_nodes_s

    def __str__(self) -> str:
        return self.value


class ExitCode(IntEnum):
    """What `regress` commands and the CI job exit with; the one place these numbers are defined."""

    GREEN = 0  # every cell passed or was skipped (assess: also UNDECIDED, naming the cells)
    REGRESSIONS = 1  # some cell is `fail` or `mismatch`
    CONFIG = 2  # bad usage or configuration: nothing was launched
    UNDECIDED = 3  # no regression, but some cell is `error`/`inconclusive`, or the infrastructure failed
    BROKEN = 4  # `regress assess`: too many cells (or a reference) could not be measured
    INTERRUPTED = 130  # Ctrl-C or SIGTERM: `--resume` finishes the run

    @property
    def verdict(self) -> str:
        """The word for it, as the MLflow parent run's `verdict` tag says it."""
        return {0: "pass", 1: "regressions", 2: "config", 3: "undecided", 4: "broken", 130: "interrupted"}[self.value]

    @classmethod
    def word(cls, code: int | None) -> str:
        """`verdict` of a recorded exit code; `unknown` for None or a number that is not one of these."""
        try:
            return cls(code).verdict if code is not None else "unknown"
        except ValueError:
            return "unknown"


class Status(str, Enum):
    """A cell's verdict; `run_exit_code` turns a run's verdicts into its exit code."""

    PASS = "pass"
    FAIL = "fail"
    MISMATCH = "mismatch"
    ERROR = "error"
    INCONCLUSIVE = "inconclusive"
    SKIPPED = "skipped"

    @property
    def is_regression(self) -> bool:
        """The server ran and answered wrongly, or ran another configuration than labelled."""
        return self in (Status.FAIL, Status.MISMATCH)

    @property
    def is_undecided(self) -> bool:
        return self in (Status.ERROR, Status.INCONCLUSIVE)

    def __str__(self) -> str:
        return self.value

    @property
    def colour(self) -> str:
        return {"pass": "green", "fail": "red", "mismatch": "magenta", "error": "yellow",
                "inconclusive": "cyan", "skipped": "dim"}[self.value]


def run_exit_code(statuses: list[Status]) -> ExitCode:
    """GREEN all passed or skipped; REGRESSIONS any fail/mismatch; UNDECIDED otherwise some error/inconclusive."""
    if any(status.is_regression for status in statuses):
        return ExitCode.REGRESSIONS
    if any(status.is_undecided for status in statuses):
        return ExitCode.UNDECIDED
    return ExitCode.GREEN


class HasStatus(Protocol):
    @property
    def status(self) -> Status: ...


def status_counts(results: Iterable[HasStatus]) -> dict[str, int]:
    """Cells per verdict, in Status order, leaving out verdicts no cell has."""
    tally = Counter(r.status.value for r in results)
    return {status.value: tally[status.value] for status in Status if tally.get(status.value)}
