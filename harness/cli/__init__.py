"""`regress`: the command line. `app` (harness.cli.app) holds the shared pieces and the one error
handler; the commands live by what they work on: a suite's matrix, one server, finished runs."""

from __future__ import annotations

from harness.cli import matrix_commands, result_commands, server_commands  # noqa: F401 - they register commands
from harness.cli.app import app, print_error


def main() -> int:
    """The `regress` entry point: Ray's token authentication is set up before any command imports Ray."""
    import os

    from harness.errors import RegressError

    # Pydantic looks for plugins in every installed package's entry points when the first model is
    # validated, for plugins regress does not use (`regress plan`: 0.50 s -> 0.43 s of CPU, the least
    # of 8 runs on a loaded 2-core machine; docs/benchmarks.md). Set before
    # any suite is read; an explicit PYDANTIC_DISABLE_PLUGINS wins; servers inherit it (they use none).
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from harness.run.ray.auth import require_token_auth

    try:
        require_token_auth()
    except RegressError as error:
        print_error(error)
        return error.exit_code
    return app(prog_name="regress") or 0


__all__ = ["app", "main"]
