"""Commands over finished runs: compare two, build the dashboard, upload one to MLflow."""

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.cli.app import ResultsDirOpt, TrackingOpt, app, console, err_console
from harness.codes import ExitCode

if TYPE_CHECKING:
    from harness.results.archive import Archives

ArchiveOpt = Annotated[str | None, typer.Option(
    help="Also read runs from this MLflow store (default: MLFLOW_TRACKING_URI): a clean CI runner has no "
         "results/ of earlier nights, the tracking server has them.")]


def _archive(results_dir: Path, tracking_uri: str | None) -> "Archives":
    from harness.results.archive import archives

    return archives(results_dir, tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))


def suite_name(suite: str) -> str:
    """A suite's name, given its name or its file (what every other command takes)."""
    if suite.endswith((".yaml", ".yml")) or Path(suite).is_file():
        from harness.suite.config import load_suite

        return load_suite(suite).suite.suite
    return suite


@app.command()
def compare(
    before: Annotated[str, typer.Argument(help="Run id, results folder, latest:SUITE or previous:SUITE.")],
    after: Annotated[str, typer.Argument(help="The same kinds; usually the newer run.")],
    results_dir: ResultsDirOpt = Path("results"),
    markdown: Annotated[Path | None, typer.Option(help="Also write the table as markdown here.")] = None,
    allow_different_protocol: Annotated[bool, typer.Option(help="Compare runs whose protocols differ.")] = False,
    tracking_uri: ArchiveOpt = None,
) -> None:
    """Compare two runs cell by cell: accuracy in both, the paired difference on shared questions with
    its p-value, and what changed (newly failing, fixed, still failing). Exits 1 if a cell newly fails.

    Example: `regress compare previous:nightly latest:nightly --markdown diff.md`
    """
    from rich.markdown import Markdown

    from harness.analysis.compare import ChangeKind, changes_markdown, compare_runs
    from harness.results.archive import find_run

    archive = _archive(results_dir, tracking_uri)
    old, new = find_run(archive, before), find_run(archive, after)
    changes = compare_runs(old, new, allow_different_protocol)
    text = changes_markdown(old, new, changes)
    console().print(Markdown(text))
    if markdown is not None:
        markdown.write_text(text)
    raise typer.Exit(ExitCode.REGRESSIONS if any(c.change is ChangeKind.NEWLY_FAILING for c in changes) else ExitCode.GREEN)


@app.command()
def dashboard(
    suite: Annotated[str, typer.Argument(help="The suite: its name (demo, nightly) or its file (configs/demo.yaml).")],
    results_dir: ResultsDirOpt = Path("results"),
    output: Annotated[Path | None, typer.Option(help="The page to write (default dashboards/SUITE.html).")] = None,
    history: Annotated[int, typer.Option(help="How many recent runs the history shows.")] = 14,
    mlflow_ui: Annotated[str | None, typer.Option(help="MLflow UI base URL for links, e.g. http://127.0.0.1:5000")] = None,
    tracking_uri: Annotated[str | None, typer.Option(
        help="Also read runs from this MLflow store (default: MLFLOW_TRACKING_URI), and log the page on "
             "the latest parent run there.")] = None,
    serve: Annotated[int | None, typer.Option(help="Serve the page on 127.0.0.1:PORT, rebuilt on each load.")] = None,
) -> None:
    """Build the comparison dashboard: the latest matrix as a heatmap, what changed since the previous
    run, each cell's history, the failure attribution, and links into MLflow.

    Example: `regress dashboard demo --mlflow-ui http://127.0.0.1:5000 --serve 8080`
    """
    from harness.analysis.dashboard import build_html, load_input

    suite = suite_name(suite)
    target = output or Path("dashboards") / f"{suite}.html"
    tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    archive = _archive(results_dir, tracking_uri)

    def build() -> str:
        page = build_html(load_input(archive, suite, history, mlflow_ui))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(page)
        return page

    build()
    console().print(f"dashboard: {target}")
    if tracking_uri:
        from harness.analysis.dashboard import log_on_latest_run

        console().print(log_on_latest_run(archive, suite, target, tracking_uri))
    if serve:
        from harness.analysis.serve import serve_page

        console().print(f"serving on http://127.0.0.1:{serve}/ (Ctrl-C to stop)")
        serve_page(build, serve)


@app.command()
def sync(
    run_id: Annotated[str, typer.Argument(help="The run to upload (a run id or results folder).")],
    results_dir: ResultsDirOpt = Path("results"),
    tracking_uri: TrackingOpt = None,
) -> None:
    """Upload a finished run's results/ folder to MLflow, e.g. after the tracking server was down.
    Syncing twice creates no duplicates.

    Example: `regress sync demo-20261129-220317-03ad --tracking-uri http://mlflow:5000`
    """
    from harness.analysis.sync import sync_run
    from harness.results.catalog import resolve_run
    from harness.results.tracking import default_tracking_uri

    store = resolve_run(results_dir, run_id)
    info, logged = sync_run(store, tracking_uri or default_tracking_uri(store.root))
    console().print(f"synced {info.run_id}: {logged} cell run(s) logged now; parent run {info.mlflow_run_id} "
                    f"in {info.tracking_uri}")


@app.command()
def assess(
    run_id: Annotated[str, typer.Argument(help="Run id, results folder, latest:SUITE or previous:SUITE.")],
    results_dir: ResultsDirOpt = Path("results"),
    max_error_share: Annotated[float, typer.Option(
        help="Above this share of `error` cells the run is broken (exit 4), not green.")] = 0.1,
    markdown: Annotated[bool, typer.Option(
        "--markdown", help="The headline as markdown for a report or PR comment: the verdict in bold, the rest as "
                           "code (cell ids and a server's error text never render as links or mentions).")] = False,
    tracking_uri: ArchiveOpt = None,
) -> None:
    """The CI verdict of a finished run: prints one headline and exits 0 (green), 1 (regressions),
    3 (undecided: cells still inconclusive, named with what would decide each) or 4 (broken: too
    many cells, or a reference cell, could not be measured). The run is read from the results
    folder, else from MLflow (a CI runner whose results/ starts empty).

    Example: `regress assess latest:nightly` (what jobs/run_and_report.sh ends with)
    """
    from harness.analysis.assess import assess as assess_run
    from harness.results.archive import find_run
    from harness.results.store import ResultsStore

    run = find_run(_archive(results_dir, tracking_uri), run_id)
    verdict = assess_run(list(run.cells.values()), max_error_share)
    folder = Path(run_id) if (Path(run_id) / "run.json").is_file() else results_dir / run.info.run_id
    if (folder / "run.json").is_file():  # read from a folder: a torn last line there is said
        torn = ResultsStore(folder.parent, folder.name).torn_note()
        if torn:
            from harness.results.reporting import warner

            warner(err_console())(torn)
    if markdown:
        from harness.results.reporting import inline_code

        word, _, rest = verdict.headline.partition(": ")
        print(f"**{word}**: {inline_code(rest)}")
    else:
        print(verdict.headline)
    raise typer.Exit(verdict.exit_code)


@app.command()
def calibrate(
    suite: Annotated[Path, typer.Argument(help="The suite file (configs/nightly.yaml).")],
    results_dir: ResultsDirOpt = Path("results"),
    runs: Annotated[int, typer.Option(help="Read the last N finished runs of the suite with its protocol.")] = 10,
    gsm8k_path: Annotated[Path | None, typer.Option(help="GSM8K folder (to know the suite's protocol).")] = None,
    num_questions: Annotated[int | None, typer.Option(
        help="The runs' questions per cell, if they ran with --num-questions (the floor is the protocol's).")] = None,
    tracking_uri: ArchiveOpt = None,
) -> None:
    """Propose each model's accuracy on this protocol (the mean of its cells that were not a
    regression) and so its floor (that minus gate.floor_margin), its launch spread (launch_sd: what
    moves a cell between consecutive runs beyond its questions' sampling), its divergence tolerance
    (1.5 x the highest 95th percentile of a passing cell's teacher-forced divergence, per backend
    pair), the self-checks' tolerance (the same rule over the cells' own co-batch, cache and decode
    checks), and a run to pin (the newest run in which every cell passed). Prints tables and the YAML
    to paste; changes no file.

    Example: `regress calibrate configs/nightly.yaml --runs 14 --tracking-uri http://mlflow:5000`
    """
    from rich.table import Table

    from harness.analysis.calibrate import (
        night_to_night_pairs,
        pinnable_run,
        propose_divergence,
        propose_floors,
        propose_launch_spread,
        propose_launch_spread_within,
        propose_self_check_tolerance,
    )
    from harness.errors import ConfigError
    from harness.records import latest_per_cell
    from harness.run.build import RunRequest, prepare

    inputs = prepare(RunRequest(suite, num_questions=num_questions, gsm8k_path=gsm8k_path))
    spec = inputs.loaded.suite
    fingerprint = inputs.plan.fingerprint
    archive = _archive(results_dir, tracking_uri)
    infos = [info for info in archive.runs(spec.suite) if info.protocol_fingerprint == fingerprint][-runs:]
    if not infos:
        raise ConfigError(f"no finished run of suite {spec.suite!r} with its protocol ({fingerprint}) in "
                          f"{results_dir} or MLflow: run it first (`regress run {suite}`), then calibrate")
    measured = [(info, list(latest_per_cell(archive.cells(info.run_id)).values())) for info in infos]
    proposals = propose_floors(measured, {model.id: model.floor for model in spec.models}, spec.gate.floor_margin)
    table = Table(title=f"accuracies and floors of {spec.suite} from {len(infos)} run(s), protocol {fingerprint} "
                        f"(floor = accuracy - gate.floor_margin {spec.gate.floor_margin:g})")
    for column in ("model", "runs", "cells", "accuracy (mean)", "lowest", "lowest 95% bound", "floor now",
                   "proposed"):
        table.add_column(column)
    for p in proposals:
        table.add_row(p.model, str(p.runs), str(p.cells), f"{p.mean:.3f}", f"{p.lowest:.3f}", f"{p.lowest_bound:.3f}",
                      f"{p.current:.3f}", f"{p.proposed:.3f} ({p.change})")
    console().print(table)
    within = {found.model: found.estimate for found in propose_launch_spread_within(measured)}
    spreads = propose_launch_spread(night_to_night_pairs(archive, measured, spec.gate.extraction))
    if spreads or within:
        now = {model.id: model.launch_sd for model in spec.models}
        night = {spread.model: spread for spread in spreads}
        table = Table(title="launch spread (sd): within runs (second launches, relaunches: the same build), and night "
                            "to night (consecutive runs; also counts what new builds move)")
        for column in ("model", "launch_sd now", "within runs (90% CI, df)", "night to night (cell pairs)"):
            table.add_column(column)
        for model in sorted(now):
            if model not in within and model not in night:
                continue
            inside = within.get(model)
            table.add_row(model, f"{now[model]:.4f}",
                          f"{inside.sd:.4f} ({inside.low:.4f}-{inside.high:.4f}, {inside.df})" if inside else "-",
                          f"{night[model].launch_sd:.4f} ({night[model].pairs})" if model in night else "-")
        console().print(table)
    tolerances = propose_divergence(measured, {model.id: model.divergence_tolerance or spec.gate.divergence.tolerance
                                               for model in spec.models})
    if tolerances:
        table = Table(title="divergence tolerances (nats/token): the highest 95th percentile of a passing cell")
        for column in ("model", "backend pair", "highest p95", "tolerance now", "proposed"):
            table.add_column(column)
        for t in tolerances:
            for pair, high in t.pairs.items():
                table.add_row(t.model, pair, f"{high:.3g}", f"{t.current:.3g}", f"{t.proposed:.3g}")
        console().print(table)
    checks = propose_self_check_tolerance(measured, spec.gate.self_checks.tolerance)
    if checks is not None:
        now = f"{checks.current:.3g}" if checks.current else "each model's divergence tolerance"
        table = Table(title=f"self-check tolerance (nats/token): the highest 95th percentile of {checks.cells} passing "
                            "cells' own questions")
        for column in ("check", "highest p95", "tolerance now", "proposed"):
            table.add_column(column)
        for name, high in checks.checks.items():
            table.add_row(name, f"{high:.3g}", now, f"{checks.proposed:.3g}")
        console().print(table)
    pinned = pinnable_run(measured)
    lines = [f"# to paste into {suite}: each model's accuracy, launch spread and divergence tolerance, the "
             "self-checks' tolerance, and the run to pin"]
    lines += [f"#   {p.model}: accuracy: {p.mean:.3f}   (floor {p.proposed:.3f}; now {p.current:.3f})" for p in proposals]
    lines += [f"#   {model}: launch_sd: {estimate.sd:.4f}   (within runs, {estimate.df} df)"
              for model, estimate in sorted(within.items())]
    lines += [f"#   {spread.model}: launch_sd: {spread.launch_sd:.4f}   (night to night, from {spread.pairs} cell pairs; "
              "no run of this model relaunched anything)" for spread in spreads if spread.model not in within]
    lines += [f"#   {t.model}: divergence_tolerance: {t.proposed:.3g}   (now {t.current:.3g})" for t in tolerances]
    if checks is not None:
        lines.append(f"#   gate.self_checks.tolerance: {checks.proposed:.3g}   (now {checks.current or 'unset'})")
    if pinned is not None:
        lines.append(f"gate: {{pinned_run: {pinned.run_id}}}  # every cell passed; started {pinned.started_at}")
    else:
        lines.append("# no run in which every cell passed: nothing to pin yet")
    console().print("\n".join(lines), markup=False, highlight=False)
