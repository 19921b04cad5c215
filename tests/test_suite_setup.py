"""How `make test` spreads the suite over pytest-xdist workers (tests/conftest.py)."""

from __future__ import annotations

import os

from tests.conftest import LONGEST_FIRST, pytest_xdist_make_scheduler, usable_cores
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


class _Options:
    """What the scheduler reads of pytest's config: the --dist mode and two workers (--tx)."""

    def __init__(self, dist: str) -> None:
        self.values = {"dist": dist, "tx": ["2*popen"]}

    def getoption(self, name: str, default=None):
        return self.values.get(name, default)

    getvalue = getoption


def test_the_real_engine_modules_are_one_unit_of_work_and_the_rest_one_a_module():
    """Both real-engine modules go to one worker, one after the other (the comment on TOGETHER)."""
    scheduler = pytest_xdist_make_scheduler(_Options("loadscope"), None)
    scopes = {scheduler._split_scope(nodeid) for nodeid in (
        "tests/real_engine/test_real_sglang.py::test_regress_run_serves_a_cpu_matrix_on_real_sglang",
        "tests/real_engine/test_trained_model.py::test_a_trained_model_stays_inside_the_tolerances_on_every_path")}
    assert len(scopes) == 1
    assert scheduler._split_scope("tests/test_faults.py::test_a[x]") == "tests/test_faults.py"
    assert pytest_xdist_make_scheduler(_Options("load"), None) is None  # other modes keep xdist's own
