"""How close does the evaluator keep a server to its capacity, and what does it cost?

A simulated server has 64 slots; a request holds one for 50 ms plus 2.5 ms per output token (about
200 ms on average, so roughly 320 requests/s). Utilisation is the share of slot-time the server spent
serving while the evaluation ran. For each client
(aiohttp, the default; the openai SDK) and for 64 and 256 requests in flight, this prints the achieved
share of capacity, the harness's CPU time per request, then the time from `regress eval` starting to
its first request and that process's peak memory.

    .venv/bin/python benchmarks/evaluator_throughput.py [--questions 640]
    .venv/bin/python benchmarks/evaluator_throughput.py --quick    # what the test suite runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.benchmark.evaluator import EvalSettings, Progress, evaluate  # noqa: E402
from harness.benchmark.gsm8k.dataset import load_gsm8k  # noqa: E402
from harness.benchmark.gsm8k.protocol import build_plan  # noqa: E402
from harness.engine.server import ServerProcess  # noqa: E402
from harness.engine.sim_fixtures import INCIDENT_WORLD, make_cell, sim_spec  # noqa: E402

SLOTS = 64
# FACTS.md's setting (every request 200 ms: answers finish in waves) and a per-token one.
SERVICE_MODELS = {"fixed 200 ms": {"base_s": 0.2},
                  "50 ms + 2.5 ms/token": {"base_s": 0.05, "decode_s_per_token": 0.0025}}


def capacity_world(folder: Path, name: str) -> Path:
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["latency"] = {"slots": SLOTS, "startup_s": 0.0, **SERVICE_MODELS[name]}
    path = folder / f"capacity-{len(list(folder.glob('capacity-*')))}.yaml"
    path.write_text(yaml.safe_dump(world))
    return path


def sim_stats(base_url: str) -> dict:
    with urllib.request.urlopen(base_url + "/sim/stats") as response:
        return json.loads(response.read())


async def measure(base_url: str, plan, settings: EvalSettings) -> tuple[float, float, float]:
    """(steady-state utilisation, requests/s, client CPU ms per request).

    Utilisation is measured between 10% and 80% of the answers: before, connections open; after,
    the last long answers drain with fewer requests than slots left, whatever the client does."""
    total = len(plan.prompts)
    marks: dict[str, dict] = {}
    loop = asyncio.get_running_loop()

    def on_progress(state: Progress) -> None:
        for name, share in (("start", 0.1), ("end", 0.8)):
            if name not in marks and state.done >= share * total:
                marks[name] = {}
                loop.run_in_executor(None, lambda n=name: marks[n].update(sim_stats(base_url)))

    cpu_before = time.process_time()
    score, _ = await evaluate(base_url, plan, settings, on_progress=on_progress)
    cpu = time.process_time() - cpu_before
    await asyncio.sleep(0.2)
    start, end = marks["start"], marks["end"]
    utilisation = (end["busy_slot_s"] - start["busy_slot_s"]) / (SLOTS * (end["at"] - start["at"]))
    return utilisation, total / score.eval_s, cpu / total * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=640)
    parser.add_argument("--quick", action="store_true",
                        help="64 questions, one service time, the aiohttp client at 64 in flight: that it runs")
    args = parser.parse_args()
    if args.quick:
        args.questions = 64
    data = load_gsm8k()
    # 640 distinct prompts: the test split twice would repeat, so use the train split's questions as well.
    plan = build_plan(data, "clean", min(args.questions, len(data.test)), 0)
    if args.questions > len(plan.prompts):
        extra = build_plan(data, "clean", args.questions - len(plan.prompts), 1)
        plan = replace(plan, prompts=plan.prompts + extra.prompts)
    print(f"server: {SLOTS} slots; {len(plan.prompts)} prompts; utilisation between 10% and 80% of the answers")
    print(f"{'service time':<22} {'client':<8} {'in flight':>9} {'utilisation':>12} {'req/s':>7} {'CPU ms/request':>15}")
    with tempfile.TemporaryDirectory() as folder:
        for service in list(SERVICE_MODELS)[:1] if args.quick else SERVICE_MODELS:
            spec = sim_spec(make_cell({"attention_backend": "triton"}), capacity_world(Path(folder), service))

            async def run_all(spec=spec, service=service, args=args) -> None:
                async with ServerProcess(spec, Path(folder) / "server.log") as server:
                    await measure(server.base_url, plan, EvalSettings(concurrency=SLOTS))  # warm-up
                    for client in ("aiohttp",) if args.quick else ("aiohttp", "openai"):
                        for in_flight in (SLOTS,) if args.quick else (SLOTS, 256):
                            settings = EvalSettings(concurrency=in_flight, client=client)
                            utilisation, rate, cpu_ms = await measure(server.base_url, plan, settings)
                            print(f"{service:<22} {client:<8} {in_flight:>9} {utilisation:>12.3f} {rate:>7.0f} "
                                  f"{cpu_ms:>15.2f}", flush=True)

            asyncio.run(run_all())
        first_request(Path(folder), spec)


def first_request(folder: Path, spec) -> None:
    """Start `regress eval` as a user would and time its first request at the server."""

    async def serve_and_run() -> tuple[float, float]:
        async with ServerProcess(spec, folder / "server2.log") as server:
            started = time.time()
            process = await asyncio.create_subprocess_exec(
                str(Path(sys.executable).parent / "regress"), "eval", "--base-url", server.base_url,
                "--num-questions", "200", "--no-tracking", "--results-dir", str(folder / "results"),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=os.environ.copy())
            await process.wait()
            stats = sim_stats(server.base_url)
            peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            return stats["first_request_at"] - started, peak_mib

    seconds, peak_mib = asyncio.run(serve_and_run())
    print(f"`regress eval` start to first request: {seconds:.2f} s; peak memory of a child process: {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
