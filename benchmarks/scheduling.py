"""How close does a run come to the lower bound of its wall time, on a simulated 2-node x 8-GPU
Ray cluster (ray.cluster_utils.Cluster), with 48 cells of tp 1/2/4/8 whose startup and evaluation
times are drawn from realistic ranges scaled down to seconds?

Runs the suite twice (the second run learns durations from the first, as a nightly does) and
prints for each: makespan / lower bound (lower bound = the largest of GPU-seconds / the GPUs, the
longest cell, and `wide_cell_bound`: a node runs one cell wider than half of it at a time, and a
narrow cell runs beside one only if it fits the GPUs left), GPU utilisation, the evaluation
GPU-seconds early stop saves on each incident cell, and the makespan a static longest-first
partition across the nodes (the way sglang's CI splits suites) would have had with the cell
durations as measured in the run, planned both on what the scheduler knew before the run and, as
an oracle, on the durations as they turned out.

    .venv/bin/python benchmarks/scheduling.py [--seconds-per-minute 1.0] [--failed-first] [--keep FOLDER]
    .venv/bin/python benchmarks/scheduling.py --quick    # what the test suite runs: 2 models x 2 cells, 1 node
    .venv/bin/python benchmarks/scheduling.py --matrix-seed 7 --nodes 3   # a matrix the scheduler was not tuned on

The models are hybrid-linear (Kimi-Linear's kind): their servers run the HybridLinearAttnBackend
wrapper the incident's bug lives in, so the unified-memory, radix-on, MLA-backend cells are incident
cells and early stop plays.

`--matrix-seed N` draws another matrix from that seed instead, one the scheduler was not tuned on:
8-9 models of tp 1-8 (any width, not only powers of two), a 1-10 minute load and a 0.2-1.5 minute
request wave each, about half of them hybrid-linear (incident cells) and the rest MLA models the
bug does not reach; `--nodes` sets how many 8-GPU nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import logging
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from harness.cli import app  # noqa: E402
from harness.engine.sim_fixtures import INCIDENT_WORLD  # noqa: E402
from harness.errors import ClusterError  # noqa: E402
from harness.run.ray.cluster import start_local  # noqa: E402

TPS = [1, 1, 2, 2, 4, 4, 8, 8]
GPUS_PER_NODE, NODES = 8, 2
QUESTIONS = 320
BACKENDS, UNIFIED_MEMORY = ("triton", "fa3", "flashinfer"), ("off", "on")
# --quick: that every path runs (both runs, the early-stop rerun), not figures to quote.
QUICK = {"backends": ("triton", "fa3"), "unified_memory": ("on",), "questions": 160}


def generated_matrix(seed: int) -> list[tuple[int, str, tuple[float, float], tuple[float, float]]]:
    """(tp, kind, load minutes range, wave minutes range) per model of a matrix drawn from `seed`."""
    rng = random.Random(seed)
    models = []
    for _ in range(rng.randint(8, 9)):
        load = round(rng.uniform(1, 10), 2)
        wave = round(rng.uniform(0.2, 1.5), 2)
        models.append((rng.randint(1, 8), rng.choice(["hybrid-linear", "mla"]), (load, load), (wave, wave)))
    return models


def setup(folder: Path, seconds_per_minute: float, failed_first: bool = False, tps: list[int] = TPS,
          matrix_seed: int | None = None, backends: tuple[str, ...] = BACKENDS,
          unified_memory: tuple[str, ...] = UNIFIED_MEMORY, questions: int = QUESTIONS) -> tuple[Path, list[int]]:
    rng = random.Random(0)
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["models"] = {}
    models = []
    # Real nodes: a 2-8 minute model load, a 3-12 minute evaluation (1,319 questions, 128 in flight:
    # about 10 waves, the first 20 answers within the first). Scaled to seconds.
    drawn = generated_matrix(matrix_seed) if matrix_seed is not None else [
        (tp, "hybrid-linear", (2, 8), (0.3, 1.2)) for tp in tps]
    for number, (tp, kind, load, wave) in enumerate(drawn):
        path = f"example/model-{number}-tp{tp}"
        world["models"][path] = {"accuracy": 0.9, "kind": kind,
                                 "startup_s": round(rng.uniform(*load) * seconds_per_minute, 2),
                                 "base_s": round(rng.uniform(*wave) * seconds_per_minute, 2)}
        models.append({"id": f"m{number}-tp{tp}", "path": path, "tp": tp, "floor": 0.8})
    (folder / "world.yaml").write_text(yaml.safe_dump(world))
    suite = {"suite": "sched", "engine": "sim", "sim_world": str(folder / "world.yaml"), "num_questions": questions,
             "concurrency": questions // 10, "stop_grace_s": 1, "models": models,
             "axes": {"attention_backend": list(backends), "unified_memory": list(unified_memory),
                      "radix_cache": ["on"]}, "gate": {"min_effect": 0.3},
             "cluster": {"failed_first": failed_first}}  # off as in configs/nightly.yaml, on for PRs
    (folder / "sched.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return folder / "sched.yaml", [tp for tp, *_ in drawn]


def static_partition_makespan(cells: list[dict], planned: dict[str, float]) -> float:
    """Longest-first across nodes by GPU-seconds as `planned` (the way sglang's CI splits suites by
    estimated times), then each node runs its list greedily, in that order, taking the durations
    the cells actually had; no start-up or turnaround costs."""
    loads = [0.0] * NODES
    lists: list[list[dict]] = [[] for _ in range(NODES)]
    for cell in sorted(cells, key=lambda c: (-c["gpus"] * planned[c["cell_id"]], c["cell_id"])):
        node = loads.index(min(loads))
        loads[node] += cell["gpus"] * planned[cell["cell_id"]]
        lists[node].append(cell)
    makespans = []
    for queue in lists:
        free, now, running = GPUS_PER_NODE, 0.0, []  # running: heap of (end, gpus)
        for cell in queue:
            while free < cell["gpus"]:
                end, gpus = heapq.heappop(running)
                now, free = max(now, end), free + gpus
            heapq.heappush(running, (now + cell["duration"], cell["gpus"]))
            free -= cell["gpus"]
        makespans.append(max((end for end, _ in running), default=0.0))
    return max(makespans)


def idle_breakdown(cells: list[dict], start: float, end: float) -> dict[str, float]:
    """GPU-seconds each GPU sat idle: before its first cell, between cells (waiting for the next,
    wider cell to gather its GPUs, or plain turnaround), after its last."""
    per_gpu: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for cell in cells:
        for device in (cell["cuda_visible_devices"] or "").split(","):
            per_gpu.setdefault((cell["node"], device), []).append(
                (cell["timings"]["started_at"], cell["timings"]["ended_at"], cell["gpus"]))
    totals = {"before first": 0.0, "between cells (next one wider: gathering GPUs)": 0.0,
              "between cells (turnaround)": 0.0, "after last": 0.0}
    for spans in per_gpu.values():
        spans.sort()
        totals["before first"] += spans[0][0] - start
        totals["after last"] += end - spans[-1][1]
        for before, after in zip(spans, spans[1:], strict=False):
            kind = "between cells (next one wider: gathering GPUs)" if after[2] > before[2] else \
                "between cells (turnaround)"
            totals[kind] += max(0.0, after[0] - before[1])
    totals["GPUs never used"] = (GPUS_PER_NODE * NODES - len(per_gpu)) * (end - start)
    return totals


def run_once(suite: Path, results: Path, tps: list[int], *options: str) -> list[dict]:
    """One `regress run` of the suite; the cells of the run it wrote, with GPUs and durations."""
    before = set(results.glob("sched-*"))
    CliRunner().invoke(app, ["run", str(suite), "--results-dir", str(results), "--quiet", "--no-tracking", *options],
                       catch_exceptions=False)
    (run_dir,) = set(results.glob("sched-*")) - before
    cells = [json.loads(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]
    tp = {f"m{number}-tp{width}": width for number, width in enumerate(tps)}
    for cell in cells:
        cell["gpus"] = tp[cell["model"]]
        cell["duration"] = cell["timings"]["ended_at"] - cell["timings"]["started_at"]
    return cells


def wide_cell_bound(cells: list[dict]) -> float:
    """A lower bound on the makespan from cells wider than half a node (tp 5-8 on 8 GPUs).

    A node runs one such cell at a time, so their durations, shared out over the nodes, take at
    least that long. Beside a wide cell of width w only w' = GPUS - w GPUs are free, and only cells
    of width <= w' fit there; every other narrow GPU-second needs time when no wide cell runs, a
    whole node's worth at most per second. So the node-seconds are at least the wide cells'
    durations plus (narrow GPU-seconds - what fits beside wide cells) / GPUs. What fits beside them
    is counted generously (all free GPU-seconds, or all narrow GPU-seconds of a width that fits
    the largest free space, whichever is less), which keeps the bound a bound."""
    wide = [c for c in cells if c["gpus"] > GPUS_PER_NODE // 2]
    narrow = [c for c in cells if c["gpus"] <= GPUS_PER_NODE // 2]
    largest_free = max((GPUS_PER_NODE - c["gpus"] for c in wide), default=0)
    beside = min(sum((GPUS_PER_NODE - c["gpus"]) * c["duration"] for c in wide),
                 sum(c["gpus"] * c["duration"] for c in narrow if c["gpus"] <= largest_free))
    narrow_gpu_seconds = sum(c["gpus"] * c["duration"] for c in narrow)
    return (sum(c["duration"] for c in wide) + (narrow_gpu_seconds - beside) / GPUS_PER_NODE) / NODES


def report(title: str, cells: list[dict], known: list[dict] | None) -> None:
    """`known`: the run the scheduler learned durations from (None: it knew none)."""
    start = min(c["timings"]["started_at"] for c in cells)
    makespan = max(c["timings"]["ended_at"] for c in cells) - start
    gpu_seconds = sum(c["gpus"] * c["duration"] for c in cells)
    bound = max(gpu_seconds / (GPUS_PER_NODE * NODES), max(c["duration"] for c in cells), wide_cell_bound(cells))
    print(f"== {title}: {len(cells)} cells on {NODES} nodes x {GPUS_PER_NODE} GPUs; statuses: "
          f"{sorted({c['status'] for c in cells})}")
    print(f"makespan {makespan:.1f} s, lower bound {bound:.1f} s: makespan / lower bound = {makespan / bound:.2f}")
    print(f"GPU utilisation: {gpu_seconds / (GPUS_PER_NODE * NODES * makespan):.1%}")
    idle = idle_breakdown(cells, start, start + makespan)
    print("GPU-seconds idle: " + ", ".join(f"{name} {value:.0f}" for name, value in idle.items()))
    actual = {c["cell_id"]: c["duration"] for c in cells}
    # What the scheduler knew before the run: the previous run's durations, else nothing (every cell alike).
    planned = {c["cell_id"]: c["duration"] for c in known} if known else dict.fromkeys(actual, 1.0)
    fair, oracle = static_partition_makespan(cells, planned), static_partition_makespan(cells, actual)
    print(f"static longest-first partition across nodes, planned on what the scheduler knew: {fair:.1f} s "
          f"({fair / bound:.2f} x lower bound); planned on the durations as they turned out: {oracle:.1f} s "
          f"({oracle / bound:.2f} x)")
    failures = [c["timings"]["ended_at"] - start for c in cells if c["status"] == "fail"]
    if failures:
        print(f"first confirmed regression after {min(failures):.1f} s ({min(failures) / makespan:.0%} of the makespan); "
              f"all {len(failures)} after {max(failures):.1f} s")
    loaded: set[tuple[str, str]] = set()
    warm = 0
    for cell in sorted(cells, key=lambda c: c["timings"]["started_at"]):
        warm += (cell["node"], cell["model"]) in loaded
        loaded.add((cell["node"], cell["model"]))
    print(f"warm starts (the node had loaded the cell's model earlier in the run): {warm} of {len(cells)}; "
          f"load time per cell: {statistics.fmean(c['timings']['startup_s'] for c in cells):.1f} s mean")


def report_early_stop(stopped: list[dict], full: list[dict]) -> None:
    """Evaluation seconds of each incident cell stopped early, against the same cell run to the end
    with early stop off (a broken model rambles to max_tokens, so healthy cells' pace would flatter)."""
    if not stopped:
        print("== early stop: no cell stopped early (no incident cell in this matrix?)")
        return
    to_the_end = {cell["cell_id"]: cell["timings"]["eval_s"] for cell in full}
    savings = sorted((1 - cell["timings"]["eval_s"] / to_the_end[cell["cell_id"]], cell["cell_id"], cell["n"],
                      cell["timings"]["eval_s"], to_the_end[cell["cell_id"]]) for cell in stopped)
    print(f"== early stop: {len(savings)} incident cells, each also run to the end with early stop off")
    for saved, cell_id, n, eval_s, whole in savings:
        print(f"  {cell_id:38s} stopped after {n:3d} questions: {eval_s:5.1f} s instead of {whole:5.1f} s, "
              f"{saved:.0%} of its evaluation GPU-seconds saved")
    print(f"saved per incident cell: min {savings[0][0]:.0%}, median {savings[len(savings) // 2][0]:.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-minute", type=float, default=1.0,
                        help="how the real minutes of load and evaluation are scaled down (default 1 s per minute)")
    parser.add_argument("--failed-first", action="store_true",
                        help="run cells that failed last time first (cluster.failed_first, as PR jobs do)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the suite, world and results here instead of a temporary folder")
    parser.add_argument("--quick", action="store_true",
                        help="2 models (tp 1 and 4) x 2 backends, unified memory on, on 1 node, 160 questions, "
                             "0.04 s per real minute: that it runs, not figures to quote")
    parser.add_argument("--matrix-seed", type=int, default=None,
                        help="draw a matrix the scheduler was not tuned on from this seed (see the docstring)")
    parser.add_argument("--nodes", type=int, default=2, help="8-GPU nodes (default 2)")
    arguments = parser.parse_args()
    global NODES
    NODES = 1 if arguments.quick else arguments.nodes
    scale = 0.04 if arguments.quick else arguments.seconds_per_minute
    tps = [1, 4] if arguments.quick else TPS
    os.environ.setdefault("REGRESS_GSM8K_PATH", str(ROOT.parent / "shared" / "data" / "gsm8k"))
    print(f"durations scaled to {scale:g} s per real minute")
    if arguments.keep is not None:
        arguments.keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() if arguments.keep is None else contextlib.nullcontext(arguments.keep) as folder:
        suite, tps = setup(Path(folder), scale, arguments.failed_first, tps, arguments.matrix_seed,
                           **(QUICK if arguments.quick else {}))
        print(f"models (tp): {tps} on {NODES} nodes x {GPUS_PER_NODE} GPUs")
        cluster = start_local(simulated_cluster)  # tried again on a busy machine, as `regress run` starts its own
        try:
            first = run_once(suite, Path(folder) / "results", tps)
            second = run_once(suite, Path(folder) / "results", tps)
            stopped = [cell for cell in second if cell["stopped_early"]]
            (Path(folder) / "incident-cells.txt").write_text("".join(c["cell_id"] + "\n" for c in stopped))
            full_suite = yaml.safe_load(suite.read_text())
            full_suite["gate"]["early_stop_share"] = 0
            (Path(folder) / "full.yaml").write_text(yaml.safe_dump(full_suite, sort_keys=False))
            full = run_once(Path(folder) / "full.yaml", Path(folder) / "results", tps,
                            "--cells", str(Path(folder) / "incident-cells.txt")) if stopped else []
        finally:
            ray.shutdown()
            cluster.shutdown()
    report("first run (no durations known)", first, None)
    report("next run (durations learned from the first, as every nightly after the first)", second, first)
    report_early_stop(stopped, full)


def simulated_cluster() -> Cluster:
    """A head and NODES nodes of GPUS_PER_NODE declared GPUs, the driver connected; a failed start
    shuts down what it started (start_local then tries again)."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
    try:
        for _ in range(NODES):
            cluster.add_node(num_cpus=1, num_gpus=GPUS_PER_NODE)
        ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


if __name__ == "__main__":
    try:
        main()
    except ClusterError as error:  # one line, as `regress` says it (exit 3: infrastructure, not a figure)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(3)
