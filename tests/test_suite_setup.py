"""How `make test` spreads the suite over pytest-xdist workers (tests/conftest.py)."""

from __future__ import annotations

import os

from tests.conftest import LONGEST_FIRST, usable_cores
from tests.helpers import ROOT


def test_every_module_sent_out_first_exists():
    """LONGEST_FIRST orders the modules the workers are handed; a renamed module would silently go
    back to its collected place (and could start last and run alone)."""
    assert [module for module in LONGEST_FIRST if not (ROOT / module).is_file()] == []


def test_workers_follow_the_cores_a_cgroup_quota_leaves(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    assert usable_cores(tmp_path / "absent") == affinity
    cpu_max.write_text("max 100000\n")
    assert usable_cores(cpu_max) == affinity
    cpu_max.write_text("150000 100000\n")  # one and a half cores: one worker
    assert usable_cores(cpu_max) == 1
    cpu_max.write_text("50000 100000\n")  # half a core: still one
    assert usable_cores(cpu_max) == 1
    cpu_max.write_text(f"{(affinity + 8) * 100000} 100000\n")  # a quota above the affinity: the affinity
    assert usable_cores(cpu_max) == affinity
