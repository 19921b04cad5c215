"""The error tree. Every error the harness raises on purpose is one of these, and each knows the
exit code a command ends with when it escapes (`harness.cli` maps them in one place).

    RegressError                     exit 3 unless a child says otherwise
    ├── ConfigError                  bad suite, world, flag or dataset: exit 2, nothing launched
    │   └── DatasetError             GSM8K files missing, unreadable or malformed
    ├── InfraError                   the machinery failed, not the model (exit 3; a cell becomes `error`)
    │   ├── ServerError              the server process: exited, never ready, crashed, hung (has a kind)
    │   ├── ClusterError             Ray could not be started or reached
    │   └── ProbeError               a bisect probe could not be measured (servers ran: not exit 2)
    └── TrackingError                MLflow unreachable or refusing; results/ is still written

`ErrorKind` names why a cell is `error`; it is recorded on outcomes and in cells.jsonl.
Messages say what happened and what to do about it.
"""

from __future__ import annotations

from enum import Enum


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


class RegressError(Exception):
    """Root of every error the harness raises deliberately."""

    exit_code = 3


class ConfigError(RegressError):
    """A suite, world file, command-line value or dataset is invalid. Exit code 2."""

    exit_code = 2


class DatasetError(ConfigError):
    """The GSM8K data cannot be found, read or parsed."""


class InfraError(RegressError):
    """Infrastructure failed (server, network, node): never a score, the cell is `error`."""


class ServerError(InfraError):
    """The server process did not start, did not become ready, or died.

    `kind` says which; `log_tail` carries the last lines of the server's log so the reason is
    visible in results.
    """

    def __init__(self, message: str, *, kind: ErrorKind = ErrorKind.SERVER_EXITED,
                 process_exit_code: int | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.process_exit_code = process_exit_code
        self.log_tail = log_tail


class ClusterError(InfraError):
    """Ray could not be started (a local cluster) or reached (an address)."""


class ProbeError(InfraError):
    """A bisect probe could not be measured; servers ran, so this is not a configuration error."""


class TrackingError(RegressError):
    """The MLflow tracking store is unreachable or refused a write."""
