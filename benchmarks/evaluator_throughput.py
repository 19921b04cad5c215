"""How close does the evaluator keep a server to its capacity, and what does it cost?

A simulated server has 64 slots; a request holds one for 50 ms plus 2.5 ms per output token (about
200 ms on average, so roughly 320 requests/s). Utilisation is the share of slot-time the server spent
serving while the evaluation ran. For each client
(aiohttp, the default; the openai SDK) and for 64 and 256 requests in flight, this prints the achieved
share of capacity, the harness's CPU time per request, then the time from `regress eval` starting to
its first request and that process's peak memory.

Then, side by side against the same server (fixed 200 ms, 64 in flight), two processes ask the same
questions: a lean aiohttp client (`LEAN_CLIENT`: post each prompt, read the JSON, nothing else) and
`regress eval` as a user runs it, tracking on (an existing SQLite store, as every night after the
first) or off. Each is one process from exec to exit: wall time, CPU (user + system, from wait4)
and peak RSS, and the server's utilisation between its first and last request of that process.

    .venv/bin/python benchmarks/evaluator_throughput.py [--questions 640] [--side-by-side 1319]
    .venv/bin/python benchmarks/evaluator_throughput.py --quick    # what the test suite runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.benchmark.evaluator import EvalSettings, Progress, evaluate, request_body  # noqa: E402
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


def sim_stats(base_url: str, since: float = 0.0) -> dict:
    with urllib.request.urlopen(f"{base_url}/sim/stats?since={since}") as response:
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
    parser.add_argument("--side-by-side", type=int, default=1319,
                        help="questions for the lean-client comparison (default: the whole test split)")
    parser.add_argument("--quick", action="store_true",
                        help="64 questions, one service time, the aiohttp client at 64 in flight: that it runs")
    args = parser.parse_args()
    if args.quick:
        args.questions, args.side_by_side = 64, 64
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
        spec = sim_spec(make_cell({"attention_backend": "triton"}), capacity_world(Path(folder), "fixed 200 ms"))
        side = build_plan(data, "clean", min(args.side_by_side, len(data.test)), 0)
        for tracking in (True,) if args.quick else (True, False):
            side_by_side(Path(folder), spec, side, tracking)


# What a client that does nothing else costs: the floor `regress eval` is compared with.
LEAN_CLIENT = """
import asyncio, json, sys, aiohttp
async def main(url, path, in_flight):
    bodies = json.load(open(path))
    gate = asyncio.Semaphore(in_flight)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def ask(body):
            async with gate, session.post(url + "/v1/completions", json=body) as response:
                return (await response.json())["choices"][0]["text"]
        answers = await asyncio.gather(*(ask(body) for body in bodies))
    print(len(answers))
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


# Runs the measured command from a process of its own, a few MiB large: Linux carries the peak RSS
# of the process that forks into the child's (exec folds the old memory's high-water mark into the
# child's maxrss), so a command forked from this benchmark, grown to ~120 MiB by its earlier
# sections, read ~120 MiB whatever it used.
MEASURER = """
import json, os, sys, time
started = time.time()
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.dup2(os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
print(json.dumps({"exit": os.waitstatus_to_exitcode(status), "wall_s": time.time() - started,
                  "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024}))
"""


def _measured(command: list[str], base_url: str) -> dict:
    """Run `command` to its end: wall s, CPU s (its own and its children's) and peak RSS MiB (of
    its largest process), and the server's utilisation while it asked."""
    before = sim_stats(base_url)
    with tempfile.NamedTemporaryFile() as errors:  # a file, not a pipe: nothing reads it until the process ends
        started = time.time()
        done = subprocess.run([sys.executable, "-S", "-c", MEASURER, errors.name, *command], capture_output=True,
                              text=True, env=os.environ.copy())
        figures = json.loads(done.stdout) if done.returncode == 0 else {
            "exit": -1, "wall_s": 0.0, "cpu_s": 0.0, "rss_mib": 0.0}
        stderr = Path(errors.name).read_text(errors="replace") + done.stderr
    after = sim_stats(base_url, since=started)
    # From this process's first request to the last answer: start-up and post-processing are not the
    # server's to fill; how long they take is the wall time.
    window = after["last_served_at"] - after["first_request_since"]
    busy = after["busy_slot_s"] - before["busy_slot_s"]
    return figures | {"utilisation": busy / (SLOTS * window) if window > 0 else 0.0, "stderr": stderr[-500:]}


def side_by_side(folder: Path, spec, plan, tracking: bool) -> None:
    """The lean client and `regress eval` on the same questions, one after the other, same server."""
    bodies = [request_body(plan, prompt, "default")[1] for prompt in plan.prompts]
    (folder / "bodies.json").write_text(json.dumps(bodies))
    regress = str(Path(sys.executable).parent / "regress")
    store = f"sqlite:///{folder / 'side-by-side.db'}"

    async def serve() -> tuple[dict, dict]:
        async with ServerProcess(spec, folder / "server3.log") as server:
            eval_command = [regress, "eval", "--base-url", server.base_url, "--num-questions", str(len(plan.prompts)),
                            "--concurrency", str(SLOTS), "--floor", "0.5", "--results-dir", str(folder / "results"),
                            *(["--tracking-uri", store] if tracking else ["--no-tracking"])]
            loop = asyncio.get_running_loop()
            # The store exists, as on every night after the first (its schema is created once).
            await loop.run_in_executor(None, _measured, [*eval_command[:4], "--num-questions", "8",
                                                          *eval_command[6:]], server.base_url)
            lean = await loop.run_in_executor(None, _measured, [sys.executable, "-c", LEAN_CLIENT, server.base_url,
                                                                str(folder / "bodies.json"), str(SLOTS)],
                                              server.base_url)
            ours = await loop.run_in_executor(None, _measured, eval_command, server.base_url)
            return lean, ours

    lean, ours = asyncio.run(serve())
    if ours["exit"] not in (0, 1):
        print(f"regress eval exited {ours['exit']}: {ours['stderr']}")
    print(f"{len(plan.prompts)} questions, {SLOTS} in flight, tracking {'on (SQLite)' if tracking else 'off'}:")
    print(f"  {'':<14} {'wall s':>7} {'CPU s':>7} {'peak RSS MiB':>13} {'utilisation':>12}")
    for name, figures in (("lean aiohttp", lean), ("regress eval", ours)):
        print(f"  {name:<14} {figures['wall_s']:>7.2f} {figures['cpu_s']:>7.2f} {figures['rss_mib']:>13.0f} "
              f"{figures['utilisation']:>12.3f}")
    print(f"  regress eval / lean: wall {ours['wall_s'] / lean['wall_s']:.2f} x, CPU {ours['cpu_s'] / lean['cpu_s']:.2f} x, "
          f"peak RSS {ours['rss_mib'] / lean['rss_mib']:.2f} x, utilisation "
          f"{ours['utilisation'] / lean['utilisation']:.3f} x", flush=True)


def first_request(folder: Path, spec) -> None:
    """Start `regress eval` as a user would and time its first request at the server."""

    async def serve_and_run() -> tuple[float, float]:
        async with ServerProcess(spec, folder / "server2.log") as server:
            started = time.time()
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-S", "-c", MEASURER, str(folder / "first-request.err"),
                str(Path(sys.executable).parent / "regress"), "eval", "--base-url", server.base_url,
                "--num-questions", "200", "--no-tracking", "--results-dir", str(folder / "results"),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=os.environ.copy())
            out, _ = await process.communicate()
            stats = sim_stats(server.base_url)
            return stats["first_request_at"] - started, json.loads(out)["rss_mib"]

    seconds, peak_mib = asyncio.run(serve_and_run())
    print(f"`regress eval` start to first request: {seconds:.2f} s; its peak memory (200 questions, no tracking): "
          f"{peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
