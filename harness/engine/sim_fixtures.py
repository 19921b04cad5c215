"""Ad-hoc simulated servers without a suite file: one cell and its launch spec, and a world with a
fault. The benchmarks and the tests start servers through these."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from harness.engine.launch import EngineRoutes, LaunchSpec
from harness.suite.config import Suite
from harness.suite.matrix import Cell, expand

ROOT = Path(__file__).resolve().parents[2]
INCIDENT_WORLD = ROOT / "configs" / "sim" / "incident.yaml"
KIMI = "moonshotai/Kimi-Linear-48B-A3B-Instruct"
DEEPSEEK = "deepseek-ai/DeepSeek-V2-Lite-Chat"


def make_cell(flags_axes: dict, model_path: str = DEEPSEEK, tp: int = 1, extra_args: list[str] | None = None,
              env: dict[str, str] | None = None) -> Cell:
    """One cell of model `model_path` with one value per axis: `make_cell({"attention_backend": "fa3"})`."""
    suite = Suite.model_validate({
        "suite": "t", "engine": "sglang",
        "models": [{"id": "m", "path": model_path, "tp": tp, "extra_args": extra_args or [], "env": env or {}}],
        "axes": {axis: [value] for axis, value in flags_axes.items()}})
    return expand(suite).cells[0]


def sim_spec(cell: Cell, world: Path | None = INCIDENT_WORLD, gsm8k: Path | None = None, timeout_s: float = 30.0,
             grace_s: float = 5.0) -> LaunchSpec:
    """How to start `cell` on the simulator with `world` (and GSM8K from `gsm8k`, else the default)."""
    env = {"REGRESS_SIM_WORLD": str(world or INCIDENT_WORLD)}
    if gsm8k is not None:
        env["REGRESS_GSM8K_PATH"] = str(gsm8k)
    return LaunchSpec(engine=EngineRoutes.of("sim"), python=sys.executable, cell=cell, seed=0, startup_timeout_s=timeout_s,
                      env=env, stop_grace_s=grace_s)


def fault_world(folder: Path, **fault) -> Path:
    """The incident world plus one fault (see harness.sim.world.Fault), written into `folder`."""
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["faults"] = [{"name": "test-fault", **fault}]
    path = folder / f"world-{len(list(folder.glob('world-*')))}.yaml"
    path.write_text(yaml.safe_dump(world))
    return path
