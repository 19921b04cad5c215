"""The error tree. Every error the harness raises on purpose is one of these.

    RegressError
    ├── ConfigError          bad suite, world, flag or dataset: exit 2, nothing launched
    │   └── DatasetError     GSM8K files missing, unreadable or malformed
    ├── InfraError           the machinery failed, not the model: the cell becomes `error`
    │   ├── ServerError      the server process: exited, never ready, crashed, hung
    │   └── EvalTransportError  too many requests failed in transport (timeouts, 5xx, bad JSON)
    └── TrackingError        MLflow unreachable or refusing; results/ is still written

Messages say what happened and what to do about it.
"""

from __future__ import annotations


class RegressError(Exception):
    """Root of every error the harness raises deliberately."""


class ConfigError(RegressError):
    """A suite, world file, command-line value or dataset is invalid. Exit code 2."""


class DatasetError(ConfigError):
    """The GSM8K data cannot be found, read or parsed."""


class InfraError(RegressError):
    """Infrastructure failed (server, network, node): never a score, the cell is `error`."""


class ServerError(InfraError):
    """The server process did not start, did not become ready, or died.

    `log_tail` carries the last lines of the server's log so the reason is visible in results.
    """

    def __init__(self, message: str, *, exit_code: int | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.log_tail = log_tail


class EvalTransportError(InfraError):
    """Too many questions could not be answered because of transport failures."""


class TrackingError(RegressError):
    """The MLflow tracking store is unreachable or refused a write."""
