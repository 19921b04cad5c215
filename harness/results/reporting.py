"""What people read: the plan of a suite, the console table, summary.md, junit.xml."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.codes import Status, status_counts
from harness.engine.launch import planned_argv
from harness.results.tracking import NIGHTS_VIEW, cells_view_url, view_url
from harness.suite.config import LoadedSuite
from harness.suite.matrix import Matrix

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from harness.records import CellResult, RunInfo


def plan_json(loaded: LoadedSuite, matrix: Matrix) -> str:
    """`regress plan --json`: every cell with its flags, exact server argv, expected server fields and
    reference, and what is excluded (with the rule's reason)."""
    return json.dumps({
        "suite": loaded.suite.suite, "engine": loaded.suite.engine,
        "cells": [{"cell_id": c.cell_id, "model": c.model.id, "model_path": c.model.path, "factors": c.factors,
                   "tp": c.model.tp, "reference_cell": c.reference_cell, "flags": list(c.flags),
                   "argv": planned_argv(loaded, c), "expected": c.expected}
                  for c in matrix.cells],
        "skipped": [{"cell_id": s.cell_id, "reason": s.reason} for s in matrix.skipped]}, indent=2)


def print_plan(loaded: LoadedSuite, matrix: Matrix) -> None:
    """`regress plan`: the cells a line each (id, tp, server flags), the GPU-slots they need, and the
    excluded cells by reason. Plain aligned lines, not a rich Table: measuring a 72-row table's
    columns took 0.14 s of the command's ~0.4 s of CPU, and a line per cell greps well in CI logs.
    Printed through typer's echo, not rich: rich's import alone is ~50 ms of CPU. Styles show on a
    terminal only, as with rich."""
    import typer

    def dim(text: str) -> None:
        typer.echo(typer.style(text, dim=True))

    typer.echo(typer.style(f"{loaded.suite.suite}: {len(matrix.cells)} cells ({loaded.suite.engine})", bold=True))
    names = [cell.cell_id + (" (reference)" if cell.is_reference else "") for cell in matrix.cells]
    width = max(map(len, names), default=4)
    lines = [f"{'cell':<{width}}  tp  server flags"]
    lines += [f"{name:<{width}}  {cell.model.tp:>2}  {' '.join(cell.flags) or '-'}"
              for name, cell in zip(names, matrix.cells, strict=True)]
    typer.echo("\n".join(lines))
    references = sorted({cell.reference_cell for cell in matrix.cells if cell.reference_cell})
    typer.echo("each cell is compared with its model's reference: " + ", ".join(references))
    gpus = sum(c.model.tp for c in matrix.cells)
    typer.echo(f"{len(matrix.cells)} cells, {gpus} GPU-slots in all; questions per cell: "
               f"{loaded.suite.num_questions or 'all 1319'}; protocol {loaded.suite.protocol}")
    if any("auto" in values for values in loaded.suite.axes.values() if isinstance(values, list)):
        dim("`auto` is shown as sglang's documented backends; `run` reads them from the installed sglang "
            "on a worker")
    by_reason: dict[str, list[str]] = {}
    for skipped in matrix.skipped:
        by_reason.setdefault(skipped.reason, []).append(skipped.cell_id)
    for reason, ids in by_reason.items():
        shown = ", ".join(ids[:3]) + (f", ... ({len(ids) - 3} more; --json lists all)" if len(ids) > 3 else "")
        dim(f"excluded {len(ids)}: {reason}: {shown}")
    for warning in loaded.suite.warnings():
        typer.echo(typer.style("warning", fg="yellow") + f": {warning}")


def _accuracy(result: CellResult) -> str:
    if result.accuracy is None:
        return "-"
    interval = f" [{result.ci_low:.2f}, {result.ci_high:.2f}]" if result.ci_low is not None else ""
    return f"{result.accuracy:.3f}{interval}"


def diverged_text(result: CellResult | None) -> str:
    """`3/20 0.93n`: questions beyond the divergence tolerance, and the mean nats per token."""
    if result is None or result.divergence_share is None or result.divergence_nats is None:
        return "-"
    return f"{round(result.divergence_share * result.divergence_n)}/{result.divergence_n} {result.divergence_nats:.2g}n"


def console_table(results: list[CellResult], title: str) -> Table:
    """Compact on purpose: the cell id already names the model and every factor value."""
    from rich.table import Table  # here: `regress plan` prints no table and does not pay its import

    table = Table(title=title, show_lines=False, header_style="bold")
    table.add_column("verdict")
    table.add_column("cell", no_wrap=True)
    table.add_column("accuracy [95% CI]", justify="right", no_wrap=True)
    table.add_column("n", justify="right")
    table.add_column("vs ref", justify="right", no_wrap=True)
    table.add_column("diverged", justify="right", no_wrap=True)
    for result in results:
        versus = "ref" if result.reference_cell is None and result.accuracy is not None else (
            "-" if result.mcnemar_p is None else f"p={result.mcnemar_p:.1g}")
        table.add_row(f"[{result.status.colour}]{result.status.value}[/]", result.cell_id, _accuracy(result),
                      str(result.n), versus, diverged_text(result))
    return table


def print_summary(console: Console, info: RunInfo, results: list[CellResult], results_path: str) -> None:
    console.print(console_table(results, f"{info.suite} · {info.run_id}"))
    tally = ", ".join(f"{count} {status}" for status, count in status_counts(results).items())
    console.print(f"[bold]{len(results)} cells[/]: {tally}")
    if info.attribution:
        console.print(f"[bold]failures share[/]: {info.attribution}")
    for result in results:
        if result.status in (Status.FAIL, Status.MISMATCH, Status.ERROR):
            console.print(f"  [{result.status.colour}]{result.status.value}[/] {result.cell_id}: {result.reason}")
    for result in results:
        if result.status is Status.INCONCLUSIVE:
            console.print(f"  [{result.status.colour}]undecided[/] {result.cell_id} after {result.launches} launch(es): "
                          f"would be decided by {result.decide or 'see its reason'}; {result.reason}")
    console.print(f"results: {results_path}")
    if info.results_error:
        from rich.markup import escape

        console.print(f"[bold red]results not all written[/]: {escape(info.results_error)}")
    if info.tracking_error:
        console.print(f"[yellow]MLflow not updated[/]: {info.tracking_error}")
    elif info.tracking_uri:
        console.print(f"MLflow: {info.tracking_uri} (parent run {info.mlflow_run_id}); "
                      f"open the UI with: {mlflow_ui_command(info.tracking_uri)}")
        if info.mlflow_experiment_id:
            ui = info.tracking_uri if info.tracking_uri.startswith("http") else "http://127.0.0.1:5000"
            console.print(f"  the cells, lowest accuracy first: {cells_view_url(ui, info.mlflow_experiment_id)}")
            console.print(f"  the suite's runs, newest first: {view_url(ui, info.mlflow_experiment_id, NIGHTS_VIEW)}")


def warner(console: Console) -> Callable[[str], None]:
    """A function that prints one warning line on `console` (the text is not read as rich markup)."""
    from rich.markup import escape

    return lambda message: console.print(f"[yellow]warning[/]: {escape(message)}")


def mlflow_ui_command(tracking_uri: str) -> str:
    """A command that opens this store's UI as it stands: the `mlflow` next to this interpreter (the
    virtual environment is rarely on PATH), or the server's own address."""
    if not tracking_uri.startswith("sqlite:"):
        return f"open {tracking_uri} in a browser"
    here = Path(sys.executable).parent / "mlflow"
    return f"{here if here.exists() else 'mlflow'} ui --backend-store-uri {tracking_uri}"


def inline_code(text: str) -> str:
    """Any text as one markdown inline code span, safe in a table cell: nothing in it renders (no
    link, image, emphasis, heading, HTML or @mention; a server's log tail or a PR's sglang may print
    any of them, and summary.md becomes the bot's PR comment). Whitespace runs become one space;
    pipes are escaped (GFM tables split on them even inside code); the fence is longer than any
    backtick run inside."""
    flat = " ".join(text.split()).replace("|", "\\|")
    if not flat:
        return ""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", flat)), default=0) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def summary_markdown(info: RunInfo, results: list[CellResult]) -> str:
    tally = ", ".join(f"{count} {status}" for status, count in status_counts(results).items())
    lines = [f"# {inline_code(info.suite)}: {tally}", "",
             f"Run {inline_code(info.run_id)} ({inline_code(info.trigger)}, engine {inline_code(info.engine)}, "
             f"protocol {inline_code(info.protocol)} {inline_code(info.protocol_fingerprint or '')}), started "
             f"{inline_code(info.started_at)}.", ""]
    if info.attribution:
        lines += [f"**Failures share:** {inline_code(info.attribution)}", ""]
    factor_names = list(results[0].factors) if results else []
    lines.append("| verdict | cell | model | " + " | ".join(inline_code(n) for n in factor_names)
                 + " | accuracy [95% CI] | n | reason |")
    lines.append("|---|---|---|" + "---|" * len(factor_names) + "---|---|---|")
    order = {Status.FAIL: 0, Status.MISMATCH: 1, Status.ERROR: 2, Status.INCONCLUSIVE: 3, Status.PASS: 4,
             Status.SKIPPED: 5}
    for result in sorted(results, key=lambda r: (order[r.status], r.cell_id)):
        lines.append(f"| **{result.status.value}** | {inline_code(result.cell_id)} | {inline_code(result.model)} | "
                     + " | ".join(inline_code(result.factors.get(n, "")) for n in factor_names)
                     + f" | {_accuracy(result)} | {result.n} | {inline_code(result.reason)} |")
    return "\n".join(lines) + "\n"


def junit_xml(info: RunInfo, results: list[CellResult]) -> str:
    import xml.etree.ElementTree as ElementTree

    suite = ElementTree.Element("testsuite", name=info.suite, tests=str(len(results)),
                                failures=str(sum(r.status.is_regression for r in results)),
                                errors=str(sum(r.status is Status.ERROR for r in results)),
                                skipped=str(sum(r.status in (Status.SKIPPED, Status.INCONCLUSIVE) for r in results)))
    for result in results:
        case = ElementTree.SubElement(suite, "testcase", classname=f"{info.suite}.{result.model}",
                                      name=result.cell_id, time=f"{result.timings.total_s:.1f}")
        if result.status.is_regression:
            ElementTree.SubElement(case, "failure", message=result.status.value).text = result.reason
        elif result.status is Status.ERROR:
            ElementTree.SubElement(case, "error", message="error").text = result.reason
        elif result.status in (Status.SKIPPED, Status.INCONCLUSIVE):
            ElementTree.SubElement(case, "skipped", message=result.status.value).text = result.reason
    ElementTree.indent(suite)
    return ElementTree.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
