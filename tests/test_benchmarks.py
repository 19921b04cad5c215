"""Every benchmark runs here in its quick mode, so none can rot: it must finish and print its
figures (no timing or figure is asserted: the figures are the benchmark's to report)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import ROOT, machine_s

QUICK = {
    "divergence.py": ("incident cells: questions needed to decide", "a bug that changes no final answer",
                      "healthy nights (no bug)"),
    "gate_calibration.py": ("size at the margin", "early stop (pr", "healthy: red (first night)",
                            "3-pt drop: red (with history)", "red within 3 night(s)", "launch_sd, the gate",
                            "drift 0.5 pt/night (one cell): red by night 4", "drift 0.5 pt/night (model-wide)",
                            "drift bound (pr"),
    "self_checks.py": ("self-checks:", "kv on hits", "healthy cells failed"),
    "scheduling.py": ("== first run", "makespan / lower bound", "== next run", "== early stop"),
    "driver_load.py": ("cells finished: 8 of 8", "driver peak memory"),
    "orphan_sweep.py": ("the scan, median of", "us a process"),
    "evaluator_throughput.py": ("utilisation", "`regress eval` start to first request", "regress eval / lean: wall"),
}


@pytest.mark.slow
@pytest.mark.parametrize("benchmark", sorted(QUICK))
def test_every_benchmark_runs_in_its_quick_mode(_gsm8k_env, benchmark):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / benchmark), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=machine_s(900))
    assert done.returncode == 0, done.stderr[-2000:]
    for title in QUICK[benchmark]:
        assert title in done.stdout, done.stdout[-2000:]


def test_every_benchmark_has_a_quick_mode_here():
    assert sorted(path.name for path in (ROOT / "benchmarks").glob("*.py")) == sorted(QUICK)


def _gate_calibration(monkeypatch):
    spec = importlib.util.spec_from_file_location("gate_calibration", ROOT / "benchmarks" / "gate_calibration.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_gate_calibration_reports_its_progress_every_tenth_of_a_shards_trials(capsys, monkeypatch):
    """A nightly shard runs for an hour and prints its rows only at the end: its stderr says how far it is."""
    module = _gate_calibration(monkeypatch)
    progress = module.TrialProgress("nightly", 25)
    for _ in range(25):
        progress.step()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" trials in ")[0] for line in lines] == [f"nightly: {done}/25" for done in range(3, 25, 3)]
    assert all(line.endswith("min left") for line in lines)


def test_gate_calibration_merge_names_a_missing_shard_file_in_one_line(tmp_path):
    """Merging while a shard still runs (its --save file not yet written) is a usage error, not a traceback."""
    missing = tmp_path / "shard1.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gate_calibration.py"), "--merge", str(missing)],
                          cwd=ROOT, capture_output=True, text=True, timeout=machine_s(120))
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"--merge: no file {missing}" in done.stderr
    assert "Traceback" not in done.stderr


def test_gate_calibration_cells_sit_their_whole_offset_under_their_reference_on_every_launch(gsm8k, monkeypatch):
    """A least favourable cell is `tolerance` under its reference in expectation, launch after launch.
    With the offset applied before a launch's redraws (15% of answers drawn again from the model),
    the redrawn answers lost it and the cells sat at 85% of the tolerance: an easier boundary than
    the one whose false fails the row claims to count. Averaged over 100 worlds (a cell's own answers
    move its drop by ~0.3 point in one world: 0.03 point of standard error) and 4 launches of each,
    without launch spread."""
    module = _gate_calibration(monkeypatch)
    suite = module.Suite.load("pr", gsm8k)
    scenario = module.SCENARIOS["least favourable"]
    tolerance = suite.inputs.loaded.suite.gate.tolerance
    reference = next(cell for cell in suite.inputs.matrix.cells if cell.is_reference)
    cell = next(cell for cell in suite.inputs.matrix.cells if cell.model.id == reference.model.id and not cell.is_reference)
    drops = []
    for seed in range(100):
        world = module.World.draw(seed, suite.questions, suite.inputs, scenario, 0.0)
        assert world.offsets[cell.cell_id] == -tolerance
        drops += [world.answers(reference, 0, launch, 0.0).mean() - world.answers(cell, 0, launch, 0.0).mean()
                  for launch in range(4)]
    assert np.mean(drops) == pytest.approx(tolerance, abs=0.001)  # 0.85 x tolerance is 0.00225 away


def test_gate_calibration_least_favourable_floors_sit_at_the_drawn_worlds_accuracy(gsm8k, monkeypatch):
    """The least favourable scenario measures false fails at the boundary: each cell exactly `tolerance`
    under its reference, and its floor exactly at that accuracy. The world's accuracy is drawn around
    the shipped one (0.6-0.9 point of sd), so a floor from the shipped accuracy put some worlds' cells
    truly under their floor, and counted their right `fail`s as false ones."""
    module = _gate_calibration(monkeypatch)
    suite = module.Suite.load("pr", gsm8k)
    scenario = module.SCENARIOS["least favourable"]
    tolerance = suite.inputs.loaded.suite.gate.tolerance
    world = module.World.draw(23, suite.questions, suite.inputs, scenario, module.LAUNCH_SD)
    inputs = suite.configured(scenario, world)
    floors = {cell.model.id: cell.model.floor for cell in inputs.matrix.cells}
    assert floors == pytest.approx({model: found.accuracy - tolerance for model, found in world.models.items()},
                                   abs=1e-12)
    assert all(cell.model.floor == floors[cell.model.id] for cell in inputs.matrix.cells)
    healthy = module.SCENARIOS["healthy"]
    assert suite.configured(healthy, world) is suite.inputs  # every other scenario: the floors as shipped
