"""`regress`: the command line. `app` (harness.cli.app) holds the shared pieces and the one error
handler; the commands live by what they work on: a suite's matrix, one server, finished runs."""

from __future__ import annotations

import os

# Pydantic looks for plugins in every installed package's entry points when it builds its first
# validator, for plugins regress does not use (~10 ms of CPU with this venv's ~150 packages,
# docs/benchmarks.md). That first build happens while the commands below are imported (the suite's
# default sections), so this comes first. An explicit PYDANTIC_DISABLE_PLUGINS wins; the processes
# regress starts inherit it (Ray workers, servers: they use no pydantic plugin).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from harness.cli import matrix_commands, result_commands, server_commands  # noqa: F401 - they register commands
from harness.cli.app import app, print_error


def main() -> int:
    """The `regress` entry point: Ray's token authentication is set up before any command imports Ray."""
    from harness.errors import RegressError
    from harness.run.ray.auth import require_token_auth

    try:
        require_token_auth()
    except RegressError as error:
        print_error(error)
        return error.exit_code
    return app(prog_name="regress") or 0


__all__ = ["app", "main"]
