"""`regress`: plan and run sglang accuracy-regression matrices.

Exit codes: 0 every cell passed (or was skipped); 1 a cell failed or ran another configuration
than requested (`fail`, `mismatch`); 3 no regression but some cells are `error`/`inconclusive`;
2 bad usage or configuration, in which case nothing was launched.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from harness.errors import ConfigError
from harness.results.reporting import plan_json, print_plan
from harness.suite.config import LoadedSuite, load_suite
from harness.suite.matrix import Matrix, expand, select, select_listed

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
                  help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
# CI logs are not terminals; rich would wrap tables at 80 columns there.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)

SuiteArg = Annotated[Path, typer.Argument(help="Suite file, e.g. configs/demo.yaml", show_default=False)]
SelectOpt = Annotated[str | None, typer.Option(
    "--select", help="Only some cells: `model=kimi-linear,attention_backend=fa3|triton` or a cell-id glob "
                     "`'*.um-on.*'`. Reference cells of selected cells are kept.")]


def _fail(error: ConfigError) -> None:
    err_console.print(f"[bold red]error[/]: {error}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _load(path: Path, selection: str | None) -> tuple[LoadedSuite, Matrix]:
    loaded = load_suite(path)
    matrix = select(expand(loaded.suite), selection)
    if not matrix.cells:
        raise ConfigError(f"{path}: the include/exclude rules leave no cell to run")
    return loaded, matrix


@app.command()
def plan(suite: SuiteArg, selection: SelectOpt = None,
         as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """Show the cells a suite expands to, their flags and reference cells, and what is excluded.

    Example: `regress plan configs/nightly.yaml --select model=kimi-linear`
    """
    try:
        loaded, matrix = _load(suite, selection)
    except ConfigError as error:
        _fail(error)
    if as_json:
        print(plan_json(loaded, matrix))
    else:
        print_plan(console, loaded, matrix)


@app.command()
def run(
    suite: SuiteArg,
    results_dir: Annotated[Path, typer.Option(help="Where results/<run_id>/ folders go.")] = Path("results"),
    tracking_uri: Annotated[str | None, typer.Option(
        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else a SQLite file: RESULTS_DIR/mlflow.db).")] = None,
    no_tracking: Annotated[bool, typer.Option("--no-tracking", help="Do not log to MLflow.")] = False,
    ray_address: Annotated[str | None, typer.Option(
        help="Ray cluster address (default: the suite's cluster.address, else a new local Ray).")] = None,
    num_questions: Annotated[int | None, typer.Option(help="Questions per cell (overrides the suite).")] = None,
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
) -> None:
    """Run every cell of a suite on Ray, gate it, and write results/ and MLflow.

    Example: `regress run configs/demo.yaml` (the incident demo: 32 cells, 6 fail, exit 1).
    """
    from harness.gsm8k.dataset import load_gsm8k
    from harness.gsm8k.protocol import build_plan
    from harness.results.tracking import default_tracking_uri
    from harness.run.pipeline import Driver, RunOptions
    from harness.run.ray.cluster import check_fits, expand_auto, ray_cluster
    from harness.sim.world import load_world

    try:
        if num_questions is not None and num_questions < 1:
            raise ConfigError(f"--num-questions: must be at least 1 (got {num_questions})")
        loaded, matrix = _load(suite, selection)
        if cells_file is not None:
            matrix = select_listed(matrix, cells_file)
        updates = {} if num_questions is None else {"num_questions": num_questions}
        loaded = loaded.model_copy(update={"suite": loaded.suite.model_copy(update=updates)})
        spec = loaded.suite
        if spec.engine == "sim":
            assert spec.sim_world is not None
            world = load_world(loaded.resolve_path(spec.sim_world))
            for model in spec.models:
                world.model(model.path)
        data_path = gsm8k_path or (loaded.resolve_path(spec.dataset.path) if spec.dataset.path else None)
        data = load_gsm8k(data_path)
        protocol_plan = build_plan(data, spec.protocol, spec.num_questions, spec.seed, spec.max_tokens)
        options = RunOptions(results_dir=results_dir, trigger=trigger, resume=resume, quiet=quiet,
                             retry_errors=retry_errors, fail_fast=fail_fast,
                             tracking_uri=None if no_tracking else tracking_uri or default_tracking_uri(results_dir),
                             ray_address=ray_address)
        if resume:
            from harness.results.store import ResultsStore

            ResultsStore.existing(results_dir, resume)
        with ray_cluster(loaded, ray_address):
            matrix = expand_auto(loaded, selection, data.source) or matrix
            if cells_file is not None:
                matrix = select_listed(matrix, cells_file)
            check_fits(matrix)
            _, _, code = Driver(loaded, matrix, data, protocol_plan, options, console).run()
    except ConfigError as error:
        _fail(error)
    raise typer.Exit(code)


@app.command("eval")
def eval_server(
    base_url: Annotated[str, typer.Option(help="The running server, e.g. http://127.0.0.1:30000")],
    protocol: Annotated[str, typer.Option(help="clean, sglang-fewshot (sglang's CI test) or chat.")] = "clean",
    num_questions: Annotated[int | None, typer.Option(help="Questions (default: all 1319).")] = None,
    seed: Annotated[int, typer.Option(help="Question subset and order.")] = 0,
    max_tokens: Annotated[int, typer.Option(help="Tokens per answer.")] = 512,
    concurrency: Annotated[int, typer.Option(help="Requests in flight.")] = 256,
    floor: Annotated[float, typer.Option(help="Accuracy floor: significantly below it is `fail`.")] = 0.0,
    name: Annotated[str, typer.Option(help="Names the run and its single cell.")] = "eval",
    model: Annotated[str | None, typer.Option(help="Model name in OpenAI requests (default: /v1/models).")] = None,
    results_dir: Annotated[Path, typer.Option(help="Where results/<run_id>/ goes.")] = Path("results"),
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI (default as for run).")] = None,
    no_tracking: Annotated[bool, typer.Option("--no-tracking", help="Do not log to MLflow.")] = False,
    gsm8k_path: Annotated[Path | None, typer.Option(help="Folder with GSM8K test.jsonl and train.jsonl.")] = None,
) -> None:
    """Evaluate one already-running server (sglang, vLLM, any OpenAI-compatible one) with a protocol.

    Example: `regress eval --base-url http://127.0.0.1:30000 --protocol sglang-fewshot --num-questions 200 --floor 0.88`
    """
    from harness.gsm8k.dataset import load_gsm8k
    from harness.gsm8k.evaluator import EvalSettings
    from harness.gsm8k.protocol import build_plan
    from harness.results.tracking import default_tracking_uri
    from harness.run.external import EvalRequest, run_eval
    from harness.suite.config import GateSpec

    try:
        if protocol not in ("clean", "sglang-fewshot", "chat"):
            raise ConfigError(f"--protocol: unknown protocol {protocol!r}; allowed: clean, sglang-fewshot, chat")
        for option, value in (("--num-questions", num_questions or 1), ("--concurrency", concurrency)):
            if value < 1:
                raise ConfigError(f"{option}: must be at least 1 (got {value})")
        if not 0.0 <= floor <= 1.0:
            raise ConfigError(f"--floor: must be within [0, 1] (got {floor})")
        data = load_gsm8k(gsm8k_path)
        plan_ = build_plan(data, protocol, num_questions, seed, max_tokens)
        request = EvalRequest(base_url=base_url, name=name, floor=floor, results_dir=results_dir, model_name=model,
                              tracking_uri=None if no_tracking else tracking_uri or default_tracking_uri(results_dir))
        code = run_eval(request, data, plan_, EvalSettings(concurrency=concurrency), GateSpec(), console)
    except ConfigError as error:
        _fail(error)
    raise typer.Exit(code)


@app.command()
def compare(
    before: Annotated[str, typer.Argument(help="Run id, results folder, latest:SUITE or previous:SUITE.")],
    after: Annotated[str, typer.Argument(help="The same kinds; usually the newer run.")],
    results_dir: Annotated[Path, typer.Option(help="Where run ids are looked up.")] = Path("results"),
    markdown: Annotated[Path | None, typer.Option(help="Also write the table as markdown here.")] = None,
    allow_different_protocol: Annotated[bool, typer.Option(help="Compare runs whose protocols differ.")] = False,
) -> None:
    """Compare two runs cell by cell: accuracy in both, the paired difference on shared questions with
    its p-value, and what changed (newly failing, fixed, still failing). Exits 1 if a cell newly fails.

    Example: `regress compare previous:nightly latest:nightly --markdown diff.md`
    """
    from rich.markdown import Markdown

    from harness.analysis.compare import changes_markdown, compare_runs, load_run, resolve_run

    try:
        old = load_run(resolve_run(results_dir, before))
        new = load_run(resolve_run(results_dir, after))
        changes = compare_runs(old, new, allow_different_protocol)
    except ConfigError as error:
        _fail(error)
    text = changes_markdown(old, new, changes)
    console.print(Markdown(text))
    if markdown is not None:
        markdown.write_text(text)
    raise typer.Exit(1 if any(c.change == "newly failing" for c in changes) else 0)


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

    try:
        loaded, matrix = _load(suite, None)
        if (changed_files is None) == (git_diff is None):
            raise ConfigError("give exactly one of --changed-files FILE or --git-diff BASE..HEAD")
        if changed_files is not None:
            try:
                files = [line.strip() for line in changed_files.read_text().splitlines() if line.strip()]
            except OSError as error:
                raise ConfigError(f"--changed-files {changed_files}: {error.strerror}") from None
        else:
            files = changed_files_from_git(repo, git_diff or "")
        selected = select_cells(matrix, load_selection(rules), files)
    except ConfigError as error:
        _fail(error)
    scope = "the full matrix (shared machinery changed)" if selected.full else f"{len(selected.cells)} cells"
    console.print(f"{len(files)} changed file(s) select {scope} of {len(matrix.cells)}:")
    for cell_id, why in selected.cells.items():
        console.print(f"  {cell_id}  [dim]{'; '.join(dict.fromkeys(why))}[/]", highlight=False)
    if write is not None:
        write.write_text("".join(f"{cell_id}\n" for cell_id in selected.cells))


@app.command()
def bisect(
    suite: Annotated[Path, typer.Option(help="The suite the cell belongs to.")],
    cell: Annotated[str, typer.Option(help="The cell id to bisect (see `regress plan`).")],
    good: Annotated[str, typer.Option(help="A commit where the cell passes.")],
    bad: Annotated[str, typer.Option(help="A later commit where it fails.")],
    repo: Annotated[Path | None, typer.Option(help="sglang checkout for the commit list (sglang engine).")] = None,
    build: Annotated[str, typer.Option(help="pip requirement of one commit's build; {commit} is replaced.")] =
        "sglang[all] @ git+https://github.com/sgl-project/sglang@{commit}#subdirectory=python",
    num_questions: Annotated[int | None, typer.Option(help="Questions per probe (default: the suite's).")] = None,
    results_dir: Annotated[Path, typer.Option(help="Where each probe's run is written.")] = Path("results"),
) -> None:
    """Find the first bad commit for one cell by binary search; each probe runs the cell on that
    commit's build and is judged by the paired test against the good commit.

    Example: `regress bisect --suite configs/nightly.yaml --cell kimi-linear.ab-fa3.um-on.rc-on.cp-default.wrapper-none
    --good v0.5.5 --bad main --repo ../sglang`
    """
    from harness.bisect.search.probes import run_bisect

    try:
        result = run_bisect(suite, cell, good, bad, repo, build, num_questions, results_dir, console)
    except ConfigError as error:
        _fail(error)
    console.print(f"first bad commit: [bold]{result.first_bad}[/] (last good {result.last_good}; "
                  f"{len(result.probes)} probes)")


@app.command()
def dashboard(
    suite: Annotated[str, typer.Argument(help="The suite's name (e.g. demo, nightly).")],
    results_dir: Annotated[Path, typer.Option(help="Where the suite's runs are.")] = Path("results"),
    output: Annotated[Path | None, typer.Option(help="The page to write (default dashboards/SUITE.html).")] = None,
    history: Annotated[int, typer.Option(help="How many recent runs the history shows.")] = 14,
    mlflow_ui: Annotated[str | None, typer.Option(help="MLflow UI base URL for links, e.g. http://127.0.0.1:5000")] = None,
    tracking_uri: Annotated[str | None, typer.Option(help="Also log the page on the latest parent run here.")] = None,
    serve: Annotated[int | None, typer.Option(help="Serve the page on 127.0.0.1:PORT, rebuilt on each load.")] = None,
) -> None:
    """Build the comparison dashboard: the latest matrix as a heatmap, what changed since the previous
    run, each cell's history, the failure attribution, and links into MLflow.

    Example: `regress dashboard demo --mlflow-ui http://127.0.0.1:5000 --serve 8080`
    """
    from harness.analysis.dashboard import build_html, load_input

    target = output or Path("dashboards") / f"{suite}.html"

    def build() -> str:
        page = build_html(load_input(results_dir, suite, history, mlflow_ui))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(page)
        return page

    try:
        build()
    except ConfigError as error:
        _fail(error)
    console.print(f"dashboard: {target}")
    if tracking_uri:
        from harness.analysis.dashboard import log_on_latest_run

        console.print(log_on_latest_run(results_dir, suite, target, tracking_uri))
    if serve:
        from harness.analysis.serve import serve_page

        console.print(f"serving on http://127.0.0.1:{serve}/ (Ctrl-C to stop)")
        serve_page(build, serve)


@app.command()
def sync(
    run_id: Annotated[str, typer.Argument(help="The run to upload (a run id or results folder).")],
    results_dir: Annotated[Path, typer.Option(help="Where run ids are looked up.")] = Path("results"),
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI (default as for run).")] = None,
) -> None:
    """Upload a finished run's results/ folder to MLflow, e.g. after the tracking server was down.
    Syncing twice creates no duplicates.

    Example: `regress sync demo-20261129-220317-03ad --tracking-uri http://mlflow:5000`
    """
    from harness.analysis.compare import resolve_run
    from harness.analysis.sync import sync_run
    from harness.errors import TrackingError
    from harness.results.tracking import default_tracking_uri

    try:
        store = resolve_run(results_dir, run_id)
        info, logged = sync_run(store, tracking_uri or default_tracking_uri(store.root))
    except ConfigError as error:
        _fail(error)
    except TrackingError as error:
        err_console.print(f"[bold red]error[/]: {error}", highlight=False, soft_wrap=True)
        raise typer.Exit(3) from None
    console.print(f"synced {info.run_id}: {logged} cell run(s) logged now; parent run {info.mlflow_run_id} "
                  f"in {info.tracking_uri}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(
    ctx: typer.Context,
    suite: SuiteArg,
    address: Annotated[str, typer.Option(help="The cluster's Jobs API, e.g. http://head:8265")],
    python: Annotated[str, typer.Option(help="Interpreter on the cluster that has this package's dependencies.")] = "python",
    working_dir: Annotated[Path, typer.Option(help="Uploaded as the job's working dir (must hold the suite).")] = Path("."),
    no_follow: Annotated[bool, typer.Option("--no-follow", help="Return once submitted; do not stream logs.")] = False,
) -> None:
    """Run a suite as a Ray Job on a cluster, stream its logs and exit with its exit code.

    Options after the suite that `submit` does not know are passed to `regress run` on the cluster.

    Example: `RAY_AUTH_MODE=token regress submit configs/nightly.yaml --address http://head:8265
    --trigger nightly --tracking-uri http://mlflow:5000`
    """
    from harness.errors import InfraError
    from harness.run.ray.jobs import Submission
    from harness.run.ray.jobs import submit as submit_job

    try:
        loaded, _ = _load(suite, None)
        submission = Submission(address=address, suite_path=suite.resolve(), run_args=list(ctx.args),
                                runtime_env=loaded.suite.cluster.runtime_env, python=python, working_dir=working_dir)
        code = submit_job(submission, follow=not no_follow)
    except ConfigError as error:
        _fail(error)
    except InfraError as error:
        err_console.print(f"[bold red]error[/]: {error}", highlight=False, soft_wrap=True)
        raise typer.Exit(3) from None
    raise typer.Exit(code)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sim(ctx: typer.Context) -> None:
    """Start one simulated sglang server (same flags as `sglang.launch_server`; world in REGRESS_SIM_WORLD).

    Example: `REGRESS_SIM_WORLD=configs/sim/incident.yaml regress sim --model-path
    moonshotai/Kimi-Linear-48B-A3B-Instruct --port 30000 --attention-backend fa3`
    """
    from harness.sim.__main__ import main as sim_main

    raise typer.Exit(sim_main(list(ctx.args)))


def main() -> None:
    app(prog_name="regress")


if __name__ == "__main__":
    sys.exit(main())
