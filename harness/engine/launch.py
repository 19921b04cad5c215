"""The exact command line and environment of a cell's server (pure, no I/O)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from harness.engine.engines import ENGINES, Engine, engine_of
from harness.suite.config import LoadedSuite
from harness.suite.matrix import Cell

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class EngineRoutes:
    """What a worker needs of the cell's engine, as plain data: the spec travels to Ray workers,
    which need not have the engine's registration (a plugin's, a test's) imported."""

    name: str
    launch_module: str
    health_route: str = "/health_generate"
    info_routes: tuple[str, ...] = ("/server_info", "/get_server_info")
    crash_markers: tuple[str, ...] = ()
    flush_route: str | None = "/flush_cache"

    @classmethod
    def of(cls, name: str, engine: Engine | None = None) -> EngineRoutes:
        engine = engine or ENGINES.get(name)
        return cls(name, engine.launch_module, engine.health_route, engine.info_routes, engine.crash_markers,
                   engine.flush_route)


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one server. `env` is added to the caller's environment."""

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
    # `cpu`: sglang's CPU backend; `platform_flags` (`cpu_flags`) come before the cell's own flags,
    # so a model's extra_args can override them.
    platform: str = "cuda"
    platform_flags: tuple[str, ...] = ()

    def argv(self, port: int | str, nccl_port: int | str) -> list[str]:
        """`<python> -m sglang.launch_server --model-path M --host 127.0.0.1 --port P --tp-size N
        --random-seed S <cell flags> <model extra args>`, as a list (never a shell string)."""
        model = self.cell.model
        argv = [default_python(self.python), "-m", self.engine.launch_module, "--model-path", model.path,
                "--host", LOOPBACK, "--port", str(port), "--tp-size", str(model.tp),
                "--random-seed", str(self.seed), "--nccl-port", str(nccl_port),
                # the OpenAI routes then report the cached prompt tokens: the proof a radix cell used its cache
                "--enable-cache-report"]
        if model.trust_remote_code:
            argv.append("--trust-remote-code")
        return argv + list(self.platform_flags) + list(self.cell.flags) + list(model.extra_args)

    def environment(self) -> dict[str, str]:
        """Variables added to the inherited environment: the suite's, then the model's, then the
        cell's (its custom axis values), then the cell's GPUs (the scheduler's choice wins over
        anything inherited). On `cpu`, sglang's CPU engine, each tp rank's threads bound to one of
        the cell's slots (core numbers)."""
        if self.platform == "cpu":
            devices = {"SGLANG_USE_CPU_ENGINE": "1"}
            if self.devices is not None:
                devices["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(self.devices)
        else:
            devices = {"CUDA_VISIBLE_DEVICES": ",".join(self.devices)} if self.devices is not None else {}
        return {**self.env, **self.cell.server_env, **devices}


def default_python(configured: str | None) -> str:
    """The suite's interpreter, else the one running this code (call it where the server starts)."""
    return configured or sys.executable


def planned_argv(loaded: LoadedSuite, cell: Cell) -> list[str]:
    """The cell's exact server command line, as a worker would run it: `{python}` (the worker's
    interpreter unless the suite names one), `{port}` and `{nccl_port}` stand for what is chosen there."""
    return cell_launch_spec(loaded, cell, python=loaded.suite.python or "{python}").argv("{port}", "{nccl_port}")


def cell_launch_spec(loaded: LoadedSuite, cell: Cell, data_source: str | None = None, python: str | None = None,
                     devices: tuple[str, ...] | None = None) -> LaunchSpec:
    """The spec of `cell`'s server under the suite: its engine, interpreter, seed, timeouts and the
    engine's environment (the simulator's world and data)."""
    suite = loaded.suite
    engine = engine_of(loaded)
    platform = suite.cluster.platform
    return LaunchSpec(engine=EngineRoutes.of(suite.engine, engine), python=python or suite.python, cell=cell,
                      seed=suite.seed, startup_timeout_s=cell.model.startup_timeout_s,
                      env=engine.environment(loaded, data_source), stop_grace_s=suite.stop_grace_s, devices=devices,
                      platform=platform, platform_flags=cpu_flags(loaded) if platform == "cpu" else ())


def cpu_flags(loaded: LoadedSuite) -> tuple[str, ...]:
    """What keeps a CPU machine alive under sglang's CPU backend (measured, ../shared/FACTS.md): a KV
    cache sized for the suite's load instead of 0.716 of host RAM (`--max-total-tokens`: every
    request in flight at its longest, prompt budget 1,024 tokens), no busy-polling idle scheduler
    (`--sleep-on-idle`), and sglang's CPU docs' `--disable-overlap-schedule`."""
    suite = loaded.suite
    tokens = min(suite.concurrency, 64) * (suite.max_tokens + 1024)
    return ("--device", "cpu", "--disable-overlap-schedule", "--sleep-on-idle", "--max-total-tokens", str(tokens))
