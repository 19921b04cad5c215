"""Commands around one server: score a running one, start a simulated one, bisect a cell's history."""

import os
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.app import ResultsDirOpt, TrackingOpt, app, at_least_one, console
from harness.errors import ConfigError


@app.command("eval")
def eval_server(
    base_url: Annotated[str, typer.Option(help="The running server, e.g. http://127.0.0.1:30000")],
    benchmark: Annotated[str, typer.Option(help="A registered benchmark (gsm8k).")] = "gsm8k",
    protocol: Annotated[str | None, typer.Option(
        help="One of the benchmark's protocols; GSM8K's: clean (its default), sglang-run-eval (sglang CI's "
             "GSM8KEval), sglang-fewshot (its older test), chat, mixed-prefix (radix cells), sgl-eval.")] = None,
    num_questions: Annotated[int | None, typer.Option(help="Questions (default: all 1319).")] = None,
    seed: Annotated[int, typer.Option(help="Question subset and order.")] = 0,
    max_tokens: Annotated[int, typer.Option(help="Tokens per answer.")] = 512,
    concurrency: Annotated[int, typer.Option(help="Requests in flight.")] = 256,
    request_timeout_s: Annotated[float, typer.Option(
        help="Seconds one request may take, time queued in the server included.")] = 600.0,
    question_deadline_s: Annotated[float, typer.Option(
        help="Seconds all attempts at one question may take together (a server that trickles bytes).")] = 900.0,
    client: Annotated[str, typer.Option(
        help="HTTP client for OpenAI routes: aiohttp (lean) or openai (the SDK, for servers that need its "
             "auth or quirks; reads OPENAI_API_KEY).")] = "aiohttp",
    floor: Annotated[float, typer.Option(
        help="Accuracy floor: significantly below it is `fail`. Without one nothing is tested: `inconclusive`.")] = 0.0,
    name: Annotated[str, typer.Option(help="Names the run and its single cell.")] = "eval",
    model: Annotated[str | None, typer.Option(help="Model name in OpenAI requests (default: /v1/models).")] = None,
    results_dir: ResultsDirOpt = Path("results"),
    tracking_uri: TrackingOpt = None,
    no_tracking: Annotated[bool, typer.Option("--no-tracking", help="Do not log to MLflow.")] = False,
    data_path: Annotated[Path | None, typer.Option(
        "--data-path", "--gsm8k-path", help="The benchmark's data folder (GSM8K: test.jsonl and train.jsonl).")] = None,
) -> None:
    """Evaluate one already-running server (sglang, vLLM, any OpenAI-compatible one) with a benchmark's protocol.

    Example: `regress eval --base-url http://127.0.0.1:30000 --protocol sglang-fewshot --num-questions 200 --floor 0.88`
    """
    from harness.benchmark.evaluator import EvalSettings
    from harness.results.tracking import default_tracking_uri
    from harness.run.build import QuestionsRequest, questions
    from harness.run.eval_server import EvalRequest, run_eval
    from harness.suite.config import GateSpec

    at_least_one("--num-questions", num_questions)
    at_least_one("--concurrency", concurrency)
    if not 0.0 <= floor <= 1.0:
        raise ConfigError(f"--floor: must be within [0, 1] (got {floor})")
    try:
        data, protocol_plan = questions(QuestionsRequest(benchmark, protocol, num_questions, seed, max_tokens, data_path))
    except ConfigError as error:  # name the options, not the suite keys
        text = str(error)
        for key, option in (("benchmark:", "--benchmark:"), ("protocol:", "--protocol:"),
                            ("num_questions:", "--num-questions:")):
            if text.startswith(key):
                text = option + text[len(key):]
        raise ConfigError(text) from None
    request = EvalRequest(base_url=base_url, name=name, floor=floor, results_dir=results_dir, model_name=model,
                          tracking_uri=None if no_tracking else tracking_uri or default_tracking_uri(results_dir))
    for option, value in (("--request-timeout-s", request_timeout_s), ("--question-deadline-s", question_deadline_s)):
        if value <= 0:
            raise ConfigError(f"{option}: must be positive (got {value})")
    if client not in ("aiohttp", "openai"):
        raise ConfigError(f"--client: {client!r} is not a client; allowed: aiohttp, openai")
    # One server, no reference: nothing to compare teacher-forced log-probabilities with.
    settings = EvalSettings(concurrency=concurrency, request_timeout_s=request_timeout_s,
                            question_deadline_s=question_deadline_s, client=client,
                            api_key=os.environ.get("OPENAI_API_KEY"), teacher_forcing=False)
    raise typer.Exit(run_eval(request, data, protocol_plan, settings, GateSpec(), console()))


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
    gsm8k_path: Annotated[Path | None, typer.Option(
        help="Folder with GSM8K test.jsonl and train.jsonl (else the suite's dataset.path, REGRESS_GSM8K_PATH, "
             "then the Hugging Face hub).")] = None,
) -> None:
    """Find the first bad commit for one cell by binary search; each probe runs the cell on that
    commit's build and is judged by the paired test against the good commit.

    Example: `regress bisect --suite configs/nightly.yaml --cell kimi-linear.ab-fa3.um-on.rc-on.cp-default.wrapper-none
    --good v0.5.5 --bad main --repo ../sglang`
    """
    from harness.bisect.probes import BisectRequest, run_bisect
    from harness.run.build import RunRequest

    # A probe is judged against the good commit's answers on the planned questions: never extended.
    run = RunRequest(suite, num_questions=num_questions, extend_to=0, gsm8k_path=gsm8k_path)
    result = run_bisect(BisectRequest(run, cell, good, bad, repo, build), results_dir, console())
    console().print(f"first bad commit: [bold]{result.first_bad}[/] (last good {result.last_good}; "
                    f"{len(result.probes)} probes)")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sim(ctx: typer.Context) -> None:
    """Start one simulated sglang server (same flags as `sglang.launch_server`; world in REGRESS_SIM_WORLD).

    Example: `REGRESS_SIM_WORLD=configs/sim/incident.yaml regress sim --model-path
    moonshotai/Kimi-Linear-48B-A3B-Instruct --port 30000 --attention-backend fa3`
    """
    from harness.sim.__main__ import main as sim_main

    raise typer.Exit(sim_main(list(ctx.args)))
