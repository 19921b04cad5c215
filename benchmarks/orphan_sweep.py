"""What does the sweep for orphaned server processes cost a cell? Before each cell a slot reads the
environment of every process on its node (`harness.engine.orphans.orphaned_server_pids`) to find the
servers whose launcher is gone; a GPU node runs far more processes than this machine.

    .venv/bin/python benchmarks/orphan_sweep.py [--processes 500 2000] [--env-bytes 4096]
    .venv/bin/python benchmarks/orphan_sweep.py --quick    # what the test suite runs: 50 processes

It starts that many `sleep` processes (each with an environment of about --env-bytes, as a node's
processes carry their own), times the scan (the median of --repeats) at each count, and stops them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.engine.orphans import orphaned_server_pids  # noqa: E402


def process_count() -> int:
    return sum(1 for entry in os.listdir("/proc") if entry.isdigit())


def time_scan(repeats: int) -> tuple[float, float]:
    """The median wall and CPU seconds of one scan."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        orphaned_server_pids()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[500, 2000],
                        help="extra processes to start, in steps (default 500, then 2000)")
    parser.add_argument("--env-bytes", type=int, default=4096, help="environment size of each extra process")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="50 extra processes, 5 repeats: that it runs")
    args = parser.parse_args()
    steps, repeats = ([50], 5) if args.quick else (sorted(args.processes), args.repeats)
    env = {**os.environ, "PADDING": "x" * max(0, args.env_bytes - len(b"\0".join(
        f"{k}={v}".encode() for k, v in os.environ.items())))}
    print(f"the scan, median of {repeats}; extra processes carry ~{args.env_bytes} bytes of environment")
    print(f"{'processes':>10} {'wall ms':>8} {'CPU ms':>8} {'us a process':>13}")
    sleepers: list[subprocess.Popen] = []
    try:
        for target in [0, *steps]:
            while len(sleepers) < target:
                sleepers.append(subprocess.Popen(["sleep", "600"], env=env))
            count = process_count()
            wall, cpu = time_scan(repeats)
            print(f"{count:>10} {wall * 1e3:>8.2f} {cpu * 1e3:>8.2f} {wall * 1e6 / count:>13.1f}")
    finally:
        for sleeper in sleepers:
            sleeper.kill()
        for sleeper in sleepers:
            sleeper.wait()


if __name__ == "__main__":
    main()
