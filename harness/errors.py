"""The error tree. Every error the harness raises on purpose is one of these, and each knows the
exit code a command ends with when it escapes (`harness.cli` maps them in one place).

    RegressError                     exit 3 unless a child says otherwise
    ├── ConfigError                  bad suite, world, flag or dataset: exit 2, nothing launched
    │   └── DatasetError             a benchmark's data missing, unreadable or malformed
    ├── InfraError                   the machinery failed, not the model (exit 3; a cell becomes `error`)
    │   ├── ServerError              the server process: exited, never ready, crashed, hung (has a kind)
    │   ├── ClusterError             Ray could not be started or reached
    │   └── ProbeError               a bisect probe could not be measured (servers ran: not exit 2)
    └── TrackingError                MLflow unreachable or refusing; results/ is still written

`ErrorKind` (in the contract, harness.records) names why a cell is `error`; it is recorded on outcomes
and in cells.jsonl.
Messages say what happened and what to do about it.
"""

from __future__ import annotations

import errno

from harness.codes import ErrorKind, ExitCode

__all__ = ["ErrorKind", "ExitCode", "RegressError", "ConfigError", "DatasetError", "InfraError",
           "ServerError", "ClusterError", "ProbeError", "TrackingError", "DISK_ERRNOS"]


# OSErrors that mean the disk, not the code: full, over quota, remounted read-only, failing. Writing
# results hits them as infrastructure faults (exit 3), never as a verdict.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)


class RegressError(Exception):
    """Root of every error the harness raises deliberately."""

    exit_code = ExitCode.UNDECIDED


class ConfigError(RegressError):
    """A suite, world file, command-line value or dataset is invalid. Exit code 2."""

    exit_code = ExitCode.CONFIG


class DatasetError(ConfigError):
    """A benchmark's data cannot be found, read or parsed (its message names the file and what to do)."""


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
