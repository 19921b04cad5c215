"""Commands over a suite's matrix: plan it, run it, pick a PR's cells, submit it to a cluster."""

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.app import (
    ResultsDirOpt,
    SelectOpt,
    SuiteArg,
    TrackingOpt,
    app,
    console,
    load_matrix,
    writable_folder,
)
from harness.errors import ConfigError, ExitCode


@app.command()
def plan(suite: SuiteArg, selection: SelectOpt = None,
         as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """Show the cells a suite expands to, their flags and reference cells, and what is excluded.

    Example: `regress plan configs/nightly.yaml --select model=kimi-linear`
    """
    from harness.results.reporting import plan_json, print_plan

    loaded, matrix = load_matrix(suite, selection)
    if as_json:
        print(plan_json(loaded, matrix))
    else:
        print_plan(loaded, matrix)


@app.command()
def run(
    suite: SuiteArg,
    results_dir: ResultsDirOpt = Path("results"),
    tracking_uri: TrackingOpt = None,
    no_tracking: Annotated[bool, typer.Option("--no-tracking", help="Do not log to MLflow.")] = False,
    ray_address: Annotated[str | None, typer.Option(
        help="Ray cluster address (default: the suite's cluster.address, else a new local Ray).")] = None,
    num_questions: Annotated[int | None, typer.Option(
        help="Questions per cell (overrides the suite); a quick look: undecided cells are not extended "
             "unless --extend-to says so.")] = None,
    extend_to: Annotated[int | None, typer.Option(
        help="Ask undecided cells more questions, up to this many in all (overrides gate.extend_to; 0: never).")] = None,
    gsm8k_path: Annotated[Path | None, typer.Option(
        help="Folder with GSM8K test.jsonl and train.jsonl (else the suite's dataset.path, REGRESS_GSM8K_PATH, "
             "then the Hugging Face hub).")] = None,
    resume: Annotated[str | None, typer.Option(help="Finish an interrupted run: only cells without a result run.")] = None,
    selection: SelectOpt = None,
    cells_file: Annotated[Path | None, typer.Option(
        "--cells", help="Only the cell ids listed in this file (from `regress select --write`).")] = None,
    retry_errors: Annotated[bool, typer.Option(help="With --resume: run `error` cells again too.")] = False,
    fail_fast: Annotated[bool, typer.Option(help="Stop at the first confirmed regression (PR use); "
                                                 "--resume runs the rest.")] = False,
    trigger: Annotated[str, typer.Option(help="Recorded as the run's trigger: manual, nightly, pr.")] = "manual",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress or table; exit code only.")] = False,
    tag: Annotated[list[str] | None, typer.Option(
        help="KEY=VALUE recorded in run.json and on the MLflow run (repeatable), e.g. pr=1234.")] = None,
) -> None:
    """Run every cell of a suite on Ray, gate it, and write results/ and MLflow.

    Example: `regress run configs/demo.yaml` (the incident demo: 32 cells, 3 fail, exit 1).
    """
    from harness.results.reporting import warner
    from harness.results.store import ResultsStore
    from harness.results.tracking import default_tracking_uri
    from harness.run.build import RunRequest, on_cluster, prepare
    from harness.run.pipeline import RunOptions, run_suite
    from harness.run.ray.cluster import ray_cluster

    request = RunRequest(suite, selection, cells_file, num_questions, extend_to, gsm8k_path)
    inputs = prepare(request)
    options = RunOptions(results_dir=results_dir, trigger=trigger, resume=resume, quiet=quiet,
                         retry_errors=retry_errors, fail_fast=fail_fast, tags=parse_tags(tag or []),
                         tracking_uri=None if no_tracking else tracking_uri or default_tracking_uri(results_dir))
    writable_folder(results_dir, "--results-dir")
    if resume:  # before Ray starts: a bad id or a corrupt cells.jsonl is a configuration error
        ResultsStore.existing(results_dir, resume).cells()
    warn = warner(console())
    with ray_cluster(inputs.loaded, ray_address):
        inputs = on_cluster(inputs, request, warn)
        report = run_suite(inputs, options, console())
    raise typer.Exit(report.exit_code)


def parse_tags(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    """`--tag pr=1234` -> (("pr", "1234"),); ConfigError for a pair without `=`."""
    tags = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--tag {pair!r}: expected KEY=VALUE, e.g. --tag pr=1234")
        tags.append((key.strip(), value))
    return tuple(tags)


@app.command("select")
def select_for_change(
    suite: SuiteArg,
    changed_files: Annotated[Path | None, typer.Option(help="A file listing changed paths, one per line.")] = None,
    git_diff: Annotated[str | None, typer.Option(help="BASE..HEAD, read with git in --repo (an sglang checkout).")] = None,
    repo: Annotated[Path, typer.Option(help="The sglang checkout for --git-diff.")] = Path("."),
    rules: Annotated[Path, typer.Option(help="Path-to-factor rules.")] = Path("configs/selection.yaml"),
    write: Annotated[Path | None, typer.Option(help="Write the selected cell ids here (for `run --cells`).")] = None,
) -> None:
    """Which cells of a suite a PR must run, from the files it changes, and why.

    Example: `regress select configs/pr.yaml --git-diff origin/main..HEAD --repo ../sglang --write cells.txt`
    """
    from harness.suite.selection import changed_files_from_git, load_selection, select_cells

    _, matrix = load_matrix(suite, None)
    if (changed_files is None) == (git_diff is None):
        raise ConfigError("give exactly one of --changed-files FILE or --git-diff BASE..HEAD")
    if changed_files is not None:
        from harness.suite.files import read_lines

        files = read_lines(changed_files, "--changed-files file")
    else:
        files = changed_files_from_git(repo, git_diff or "")
    selected = select_cells(matrix, load_selection(rules), files)
    scope = "the full matrix (shared machinery changed)" if selected.full else f"{len(selected.cells)} cells"
    console().print(f"{len(files)} changed file(s) select {scope} of {len(matrix.cells)}:")
    for cell_id, why in selected.cells.items():
        console().print(f"  {cell_id}  [dim]{'; '.join(dict.fromkeys(why))}[/]", highlight=False)
    if write is not None:
        write.write_text("".join(f"{cell_id}\n" for cell_id in selected.cells))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(
    ctx: typer.Context,
    suite: SuiteArg,
    address: Annotated[str, typer.Option(help="The cluster's Jobs API, e.g. http://head:8265")],
    python: Annotated[str, typer.Option(help="Interpreter on the cluster that has this package's dependencies.")] = "python",
    working_dir: Annotated[Path, typer.Option(help="Uploaded as the job's working dir (must hold the suite).")] = Path("."),
    no_follow: Annotated[bool, typer.Option("--no-follow", help="Return once submitted; do not stream logs.")] = False,
    cluster_results_dir: Annotated[str, typer.Option(
        help="Where the job writes results/ on the cluster unless the run options name --results-dir "
             "(not the job's working directory, which Ray deletes).")] = "/var/tmp/regress-results",
) -> None:
    """Run a suite as a Ray Job on a cluster, stream its logs and exit with its exit code.

    Options after the suite that `submit` does not know are passed to `regress run` on the cluster.

    Example: `RAY_AUTH_MODE=token regress submit configs/nightly.yaml --address http://head:8265
    --trigger nightly --tracking-uri http://mlflow:5000`
    """
    from harness.run.ray.jobs import Submission
    from harness.run.ray.jobs import submit as submit_job

    loaded, _ = load_matrix(suite, None)
    submission = Submission(address=address, suite_path=suite.resolve(), run_args=list(ctx.args),
                            runtime_env=loaded.suite.cluster.runtime_env, python=python, working_dir=working_dir,
                            results_dir=cluster_results_dir)
    raise typer.Exit(submit_job(submission, follow=not no_follow))


@app.command()
def check(
    suite: SuiteArg,
    selection: SelectOpt = None,
    python: Annotated[str | None, typer.Option(
        help="The interpreter whose sglang to ask (default: this one; `make sglang-env` builds .sglang-0.5.23).")] = None,
    models_dir: Annotated[Path | None, typer.Option(
        help="Folders of <model path>/config.json for the resolution (default: configs/models of this checkout).",
        show_default=False)] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU kind to describe to sglang (default: the suite's, else H200).")] = None,
) -> None:
    """Ask the installed sglang whether it would start each cell: its own argparse, then (sglang
    0.5.23+) its whole resolution and checks, with the GPU described and each model's config.json.
    Refused cells are listed with sglang's own message; exit 1 if any is refused.

    Example: `regress check configs/nightly.yaml --python .sglang-0.5.23/bin/python`
    """
    import sys
    import time

    from rich.table import Table

    from harness.engine.check import MODELS_DIR, check_cells, check_groups

    loaded, matrix = load_matrix(suite, selection)
    started = time.monotonic()
    checked = [item for env, cells in check_groups(list(matrix.cells), {})
               for item in check_cells(python or sys.executable, loaded, cells, models_dir or MODELS_DIR, gpu, env)]
    table = Table(title=f"{loaded.suite.suite}: {len(checked)} cells against sglang "
                        f"{checked[0].sglang_version if checked else '?'}", header_style="bold")
    table.add_column("cell", no_wrap=True)
    table.add_column("sglang says", overflow="fold")
    for item in checked:
        if item.refused:
            said = f"[red]refused[/] ({item.stage}): {item.refused}"
        else:
            said = f"[green]ok[/] ({item.stage})" + (f": {item.problem}" if item.problem else "")
            if item.predicted:
                said += " · " + ", ".join(f"{k}={v}" for k, v in item.predicted.items() if v is not None)
        table.add_row(item.cell_id, said)
    console().print(table)
    refused = [item for item in checked if item.refused]
    console().print(f"{len(checked) - len(refused)} of {len(checked)} cells accepted, {len(refused)} refused, "
                    f"in {time.monotonic() - started:.1f} s"
                    + (f" (stand-ins for {', '.join(checked[0].stand_ins)})" if checked and checked[0].stand_ins else ""))
    raise typer.Exit(ExitCode.REGRESSIONS if refused else ExitCode.GREEN)
