"""The `regress` Typer app, its consoles, shared options, and the one place errors become exit codes.

Exit codes: 0 every cell passed (or was skipped); 1 a cell failed or ran another configuration than
requested (`fail`, `mismatch`); 3 no regression, but some cells are `error`/`inconclusive`, or the
infrastructure failed (Ray, MLflow, a bisect probe); 2 bad usage or configuration, in which case
nothing was launched; 130 interrupted.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from harness.errors import DISK_ERRNOS, ConfigError, ExitCode, RegressError
from harness.run.build import load_matrix

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["app", "console", "err_console", "load_matrix", "at_least_one", "print_error", "writable_folder"]

# Made at first use: `regress plan` prints through typer alone and never imports rich (~50 ms of CPU).
# CI logs are not terminals; rich would wrap tables at 80 columns there. No emoji codes: a reason
# or a log line quoting `:name:` is printed as written (and rich's emoji table is never imported).
@functools.cache
def console() -> Console:
    """rich's console on stdout."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160, emoji=False)


@functools.cache
def err_console() -> Console:
    """rich's console on stderr."""
    from rich.console import Console

    return Console(stderr=True, width=None if sys.stderr.isatty() else 160, emoji=False)


def writable_folder(path: Path, option: str) -> None:
    """A ConfigError, before anything is launched, when `path` cannot be created or written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".regress-write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise ConfigError(f"{option} {path}: cannot be written ({error.strerror or error}); "
                          "point it at a writable folder") from None


def print_error(error: RegressError) -> None:
    """The one line a RegressError ends a command with."""
    from rich.markup import escape

    # Escaped: messages quote patterns and values (`[a-z0-9]`, `models[0]`) that rich would read as markup.
    err_console().print(f"[bold red]error[/]: {escape(str(error))}", highlight=False, soft_wrap=True)


class RegressCommands(TyperGroup):
    """Every command runs through here: a RegressError ends it with one line and its exit code
    (`RegressError.exit_code`: 2 for configuration, 3 for infrastructure), never a traceback."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RegressError as error:
            print_error(error)
            raise typer.Exit(error.exit_code) from None
        except OSError as error:
            if error.errno not in DISK_ERRNOS:
                raise
            # The disk under results/ (or the tracking store) filled up or went read-only mid-run:
            # an infrastructure fault, never "regressions found"; the cells written so far stay.
            from rich.markup import escape

            where = f" ({error.filename})" if error.filename else ""
            err_console().print(f"[bold red]error[/]: could not write{escape(where)}: {error.strerror or error}; the cells "
                                "judged so far are kept: free space, then `regress run SUITE --resume RUN_ID` runs "
                                "the rest", highlight=False, soft_wrap=True)
            raise typer.Exit(ExitCode.UNDECIDED) from None


app = typer.Typer(cls=RegressCommands, add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
                  help="`regress`: plan and run sglang accuracy-regression matrices.\n\n" + __doc__.split("\n\n")[1],
                  context_settings={"help_option_names": ["-h", "--help"]})

SuiteArg = Annotated[Path, typer.Argument(help="Suite file, e.g. configs/demo.yaml", show_default=False)]
SelectOpt = Annotated[str | None, typer.Option(
    "--select", help="Only some cells: `model=kimi-linear,attention_backend=fa3|triton` or a cell-id glob "
                     "`'*.um-on.*'`. Reference cells of selected cells are kept.")]
ResultsDirOpt = Annotated[Path, typer.Option(help="Where results/<run_id>/ folders are.")]
TrackingOpt = Annotated[str | None, typer.Option(
    help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else a SQLite file: RESULTS_DIR/mlflow.db).")]


def at_least_one(option: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{option}: must be at least 1 (got {value})")
