"""Helpers for tests: the simulator's ad-hoc cells (shared with the benchmarks), and timeouts sized
for the machine the tests run on."""

from __future__ import annotations

import os

from harness.engine.sim_fixtures import DEEPSEEK, INCIDENT_WORLD, KIMI, ROOT, fault_world, make_cell, sim_spec

__all__ = ["DEEPSEEK", "INCIDENT_WORLD", "KIMI", "ROOT", "fault_world", "few_questions_suite", "make_cell", "machine_s",
           "sim_spec"]


def machine_s(seconds: float) -> float:
    """`seconds` on an idle machine, stretched by how busy this one is (runnable processes per core
    over the last minute), so a timeout that holds on an idle laptop also holds on a loaded 2-core CI
    runner where several simulators import at once. At least `seconds`, at most 6x."""
    load_per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return seconds * min(6.0, max(1.0, load_per_core * 1.5))


def few_questions_suite(suite: dict) -> dict:
    """A suite (parsed YAML) whose gate a run of 20-60 questions can meet: no such run can bound a
    drop under the shipped 3 points, so a healthy cell would be `inconclusive`. For tests of what
    surrounds the gate (tracking, compare, sync), not of the gate."""
    suite["gate"] = {**suite.get("gate", {}), "tolerance": 0.1, "min_effect": 0.3}
    for model in suite["models"]:
        model["floor"] = 0.7
    return suite
