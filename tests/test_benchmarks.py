"""Every benchmark with a quick mode runs here, so none can rot: it must finish and print its
figures (no timing or figure is asserted: the figures are the benchmark's to report)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT, machine_s


@pytest.mark.slow
def test_the_divergence_benchmark_runs_in_its_quick_mode(_gsm8k_env):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "divergence.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=machine_s(300))
    assert done.returncode == 0, done.stderr[-2000:]
    for title in ("incident cells: questions needed to decide", "a bug that changes no final answer",
                  "healthy nights (no bug)"):
        assert title in done.stdout, done.stdout[-2000:]
