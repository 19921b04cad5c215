"""The exact command line and environment of a cell's server, as data a worker can run (pure, no I/O).

The cell's engine (harness.engine.engines) spells the command line, with its interpreter and ports
left as placeholders (PYTHON, PORT, NCCL_PORT) that the worker fills in; what else the worker needs
of the engine (readiness, configuration and flush routes, crash lines, whether it scores
teacher-forced text) is `EngineRoutes`. Nothing here knows an engine by name.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from harness.engine.engines import (
    ENGINES,
    FLUSH_ROUTE,
    HEALTH_ROUTE,
    INFO_ROUTES,
    LOOPBACK,
    NCCL_PORT,
    PORT,
    PYTHON,
    Engine,
    engine_of,
)
from harness.suite.config import LoadedSuite
from harness.suite.matrix import Cell

__all__ = ["LOOPBACK", "EngineRoutes", "LaunchSpec", "cell_launch_spec", "default_python", "planned_argv"]


@dataclass(frozen=True)
class EngineRoutes:
    """What a worker needs of the cell's engine, as plain data: the spec travels to Ray workers,
    which need not have the engine's registration (a plugin's, a test's) imported. No
    `info_routes`: the engine reports no resolved configuration (cells are judged; the verification
    says what it could not check)."""

    name: str
    launch_module: str
    health_route: str = HEALTH_ROUTE
    info_routes: tuple[str, ...] = INFO_ROUTES
    crash_markers: tuple[str, ...] = ()
    flush_route: str | None = FLUSH_ROUTE
    teacher_forcing: bool = True

    @classmethod
    def of(cls, name: str, engine: Engine | None = None) -> EngineRoutes:
        engine = engine or ENGINES.get(name)
        return cls(name, engine.launch_module, engine.health_route, engine.info_routes, engine.crash_markers,
                   engine.flush_route, engine.teacher_forcing)


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one server. `env` is added to the caller's environment; `command` is the engine's
    command line (None: asked of the registered engine `engine.name` when the spec is made)."""

    engine: EngineRoutes
    # The server's interpreter; None: the one running this code, resolved where `argv` is built, on
    # the worker (under a PR build, Ray's per-job virtualenv with the PR's sglang), never the driver's.
    python: str | None
    cell: Cell
    seed: int
    startup_timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    stop_grace_s: float = 30.0
    # The GPUs the scheduler gave the cell, as the node numbers them; None: whatever the caller's
    # CUDA_VISIBLE_DEVICES says (a single-cell `regress eval`).
    devices: tuple[str, ...] | None = None
    platform: str = "cuda"
    platform_flags: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None
    device_env: dict[str, str] | None = None  # the engine's platform environment for `devices`

    def __post_init__(self) -> None:
        if self.command is None or self.device_env is None:
            engine = ENGINES.get(self.engine.name)
            if self.command is None:
                object.__setattr__(self, "command", tuple(engine.command(self.cell, self.seed, self.platform_flags)))
            if self.device_env is None:
                object.__setattr__(self, "device_env", engine.platform_environment(self.platform, self.devices))

    def argv(self, port: int | str, nccl_port: int | str) -> list[str]:
        """The engine's command line with this worker's interpreter and the ports it picked, as a
        list (never a shell string)."""
        fill = {PYTHON: default_python(self.python), PORT: str(port), NCCL_PORT: str(nccl_port)}
        return [fill.get(part, part) for part in self.command or ()]

    def environment(self) -> dict[str, str]:
        """Variables added to the inherited environment: the suite's, then the model's, then the
        cell's (its custom axis values), then the devices the engine's platform needs (the
        scheduler's choice wins over anything inherited)."""
        return {**self.env, **self.cell.server_env, **(self.device_env or {})}


def default_python(configured: str | None) -> str:
    """The suite's interpreter, else the one running this code (call it where the server starts)."""
    return configured or sys.executable


def planned_argv(loaded: LoadedSuite, cell: Cell) -> list[str]:
    """The cell's exact server command line, as a worker would run it: `{python}` (the worker's
    interpreter unless the suite names one), `{port}` and `{nccl_port}` stand for what is chosen there."""
    return cell_launch_spec(loaded, cell, python=loaded.suite.python or PYTHON).argv(PORT, NCCL_PORT)


def cell_launch_spec(loaded: LoadedSuite, cell: Cell, data_source: str | None = None, python: str | None = None,
                     devices: tuple[str, ...] | None = None) -> LaunchSpec:
    """The spec of `cell`'s server under the suite: its engine's command line, interpreter, seed,
    timeouts and environment (the simulator's world and data; the platform's)."""
    suite = loaded.suite
    engine = engine_of(loaded)
    platform = suite.cluster.platform
    flags = engine.platform_flags(loaded)
    return LaunchSpec(engine=EngineRoutes.of(suite.engine, engine), python=python or suite.python, cell=cell,
                      seed=suite.seed, startup_timeout_s=cell.model.startup_timeout_s,
                      env=engine.environment(loaded, data_source), stop_grace_s=suite.stop_grace_s, devices=devices,
                      platform=platform, platform_flags=flags, command=tuple(engine.command(cell, suite.seed, flags)),
                      device_env=engine.platform_environment(platform, devices))
