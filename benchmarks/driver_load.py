"""A 200-cell suite on 16 declared GPUs against simulated servers: does it complete, how long does it
take, and how much memory does the driver (this process, not Ray's workers) use at peak?

    .venv/bin/python benchmarks/driver_load.py [--questions 20]
    .venv/bin/python benchmarks/driver_load.py --quick    # what the test suite runs: 8 cells
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from typer.testing import CliRunner  # noqa: E402

from harness.cli import app  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="8 cells (2 excluded) instead of 200: that it runs")
    args = parser.parse_args()
    os.environ.setdefault("REGRESS_GSM8K_PATH", str(ROOT.parent / "shared" / "data" / "gsm8k"))
    suite = {
        "suite": "load", "engine": "sim", "sim_world": str(ROOT / "configs" / "sim" / "incident.yaml"),
        "num_questions": args.questions, "concurrency": 32, "stop_grace_s": 2, "cluster": {"gpus": 16},
        "models": [{"id": "kimi", "path": "moonshotai/Kimi-Linear-48B-A3B-Instruct", "tp": 2, "floor": 0.5,
                    "extra_args": ["--mamba-radix-cache-strategy", "extra_buffer"]},
                   {"id": "dsv2", "path": "deepseek-ai/DeepSeek-V2-Lite-Chat", "tp": 1, "floor": 0.5}],
        "axes": {"attention_backend": ["triton", "fa3", "flashinfer", "flashmla", "default"],
                 "unified_memory": ["off", "on"], "radix_cache": ["on", "off"],
                 "chunked_prefill": ["default", "off", 2048, 4096, 8192]},
        "gate": {"min_effect": 0.3},
    }
    if args.quick:
        suite["axes"] = {"attention_backend": ["triton", "fa3"], "unified_memory": ["off", "on"], "radix_cache": ["on"]}
        suite["exclude"] = [{"model": "dsv2", "unified_memory": "on"}]
    cells = 8 if args.quick else 200  # lines of cells.jsonl: quick has 6 cells run and 2 excluded
    with tempfile.TemporaryDirectory() as folder:
        suite_path = Path(folder) / "load.yaml"
        suite_path.write_text(yaml.safe_dump(suite))
        before_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        started = time.monotonic()
        result = CliRunner().invoke(app, ["run", str(suite_path), "--results-dir", str(Path(folder) / "results"),
                                          "--quiet"], catch_exceptions=False)
        elapsed = time.monotonic() - started
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        written = next((Path(folder) / "results").glob("load-*/cells.jsonl"), None)
        if written is None:
            sys.exit(f"the run wrote no cells (exit code {result.exit_code}):\n{result.output}")
        lines = written.read_text().splitlines()
    print(f"cells finished: {len(lines)} of {cells}; exit code {result.exit_code}; wall time {elapsed:.0f} s")
    print(f"driver peak memory: {peak_mib:.0f} MiB (at start {before_mib:.0f} MiB, so {peak_mib - before_mib:.0f} MiB "
          "for the run; Ray's own processes are not included)")


if __name__ == "__main__":
    main()
