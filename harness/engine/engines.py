"""Server engines behind one interface, and the registry that names them.

An `Engine` is everything that differs between server programs the matrix can launch: its command
line (model, port, tp, seed and the cell's configuration, in its own spelling) and the flags and
environment a platform needs, the environment its servers need, how to read which attention
backends it accepts, whether it has a plan-time check, its readiness, configuration (none: "not
reported") and cache-flush routes, whether it scores teacher-forced text, and, for `regress bisect`,
how to list and build commits. What a worker needs of it travels as data
(`harness.engine.launch.EngineRoutes`, and the command line in `LaunchSpec.command`), so a worker
runs an engine whose registration it never imported.

Two are built in: `sglang` (the real server) and `sim` (the simulator, `harness.sim`, which takes
sglang's flags and serves its routes). Adding one is one module with a subclass and
`ENGINES.add(name, instance)`; `tests/engine/test_engines.py` runs a toy engine of its own spelling,
with no configuration route and no teacher forcing, through `regress run` into MLflow.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from harness.errors import ConfigError
from harness.registry import Registry
from harness.suite.config import LoadedSuite
from harness.suite.matrix import Cell

LOOPBACK = "127.0.0.1"
# sglang's routes, every engine's defaults (written once: Engine, EngineRoutes and the readers take them)
HEALTH_ROUTE = "/health_generate"  # 200 once the server generates
INFO_ROUTES = ("/server_info", "/get_server_info")  # the resolved arguments (newer sglang, then older)
FLUSH_ROUTE = "/flush_cache"

_SGLANG_BACKENDS_PROBE = """
import argparse, json
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
action = next(a for a in parser._actions if "--attention-backend" in a.option_strings)
print(json.dumps(list(action.choices or [])))
"""
_SIM_BACKENDS_PROBE = """
import json, os
from harness.sim.args import build_parser
from harness.sim.world import load_world
parser = build_parser(load_world(os.environ["REGRESS_SIM_WORLD"]).attention_backends)
action = next(a for a in parser._actions if "--attention-backend" in a.option_strings)
print(json.dumps(list(action.choices)))
"""


PYTHON, PORT, NCCL_PORT = "{python}", "{port}", "{nccl_port}"  # what a worker fills in (LaunchSpec.argv)


class Engine:
    """A server program the matrix launches. Subclasses set the class attributes and override what
    differs; `command` has no default: an engine spells its own command line."""

    launch_module: ClassVar[str]
    # Python that prints `--attention-backend`'s choices as JSON (run under the servers' interpreter).
    backends_probe: ClassVar[str] = _SGLANG_BACKENDS_PROBE
    # Whether `regress run` asks this engine's own parser and resolution about every cell before any
    # GPU is held (`harness.engine.check`): only a real sglang has that resolution to ask.
    checks_at_plan_time: ClassVar[bool] = False
    health_route: ClassVar[str] = HEALTH_ROUTE
    info_routes: ClassVar[tuple[str, ...]] = INFO_ROUTES  # (): the engine reports no resolved configuration
    flush_route: ClassVar[str | None] = FLUSH_ROUTE  # empties the prefix cache (self-checks); None: none
    # Whether it scores a given continuation teacher-forced (sglang's /generate with return_logprob):
    # the divergence test and the self-checks need it; without, they are "not measured".
    teacher_forcing: ClassVar[bool] = True
    # Log lines that mean the server is dead even while its launcher still runs (sglang's launcher waits
    # ~60 s "for CUDA coredumps", even on a CPU, after a scheduler crashed): the cell fails at once.
    crash_markers: ClassVar[tuple[str, ...]] = ()

    def validate(self, loaded: LoadedSuite) -> None:
        """ConfigError for a suite this engine cannot run, before anything is launched."""

    def command(self, cell: Cell, seed: int, platform_flags: tuple[str, ...] = ()) -> list[str]:
        """The server's command line, with PYTHON, PORT and NCCL_PORT where the worker fills in its
        interpreter and the ports it picked."""
        raise NotImplementedError(f"{type(self).__name__} must spell its command line (Engine.command)")

    def platform_flags(self, loaded: LoadedSuite) -> tuple[str, ...]:
        """Flags the suite's platform (`cluster.platform`) needs, before the cell's own."""
        return ()

    def platform_environment(self, platform: str, devices: tuple[str, ...] | None) -> dict[str, str]:
        """Variables that give the server its devices (the scheduler's choice wins over anything inherited)."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(devices)} if devices is not None else {}

    def environment(self, loaded: LoadedSuite, data_source: str | None) -> dict[str, str]:
        """Variables every server of the suite gets (the model's and the cell's GPUs come after)."""
        return {}

    def commits(self, loaded: LoadedSuite, good: str, bad: str, repo: Path | None) -> list[str]:
        """`good`, then every first-parent commit up to `bad` (for `regress bisect`)."""
        if repo is None:
            raise ConfigError("--repo: the sglang checkout to list commits from is required with the sglang engine")
        try:
            out = subprocess.run(["git", "-C", str(repo), "rev-list", "--reverse", "--first-parent", f"{good}..{bad}"],
                                 capture_output=True, text=True, timeout=60, check=True)
        except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
            raise ConfigError(f"git rev-list {good}..{bad} failed in {repo}: {getattr(error, 'stderr', error)}") from None
        return [good, *out.stdout.split()]

    def at_commit(self, loaded: LoadedSuite, cell: Cell, commit: str, build: str) -> tuple[LoadedSuite, Cell]:
        """The suite and cell that run `cell` on `commit`'s build: the workers install `build`
        (a pip requirement with `{commit}`) in the suite's runtime env."""
        spec = loaded.suite
        runtime_env = {**spec.cluster.runtime_env, "pip": [build.format(commit=commit)]}
        cluster = spec.cluster.model_copy(update={"runtime_env": runtime_env})
        probe_loaded = loaded.model_copy(update={"suite": spec.model_copy(update={"cluster": cluster})})
        return probe_loaded, replace(cell, reference_cell=None)


class SglangCommandLine:
    """sglang's `launch_server` command line and its CPU platform, shared by the real server and the
    simulator (which takes the same flags)."""

    launch_module: ClassVar[str]

    def command(self, cell: Cell, seed: int, platform_flags: tuple[str, ...] = ()) -> list[str]:
        """`<python> -m <module> --model-path M --host 127.0.0.1 --port P --tp-size N --random-seed S
        --nccl-port Q --enable-cache-report [--trust-remote-code] <platform flags> <cell flags> <model extra args>`."""
        model = cell.model
        argv = [PYTHON, "-m", self.launch_module, "--model-path", model.path, "--host", LOOPBACK, "--port", PORT,
                "--tp-size", str(model.tp), "--random-seed", str(seed), "--nccl-port", NCCL_PORT,
                # the OpenAI routes then report the cached prompt tokens: the proof a radix cell used its cache
                "--enable-cache-report"]
        if model.trust_remote_code:
            argv.append("--trust-remote-code")
        return argv + list(platform_flags) + list(cell.flags) + list(model.extra_args)

    def platform_flags(self, loaded: LoadedSuite) -> tuple[str, ...]:
        """On `cpu`, what keeps a CPU machine alive under sglang's CPU backend (measured on 2-core
        machines, sglang 0.5.23): a KV cache sized for the suite's load instead of 0.716 of host RAM
        (`--max-total-tokens`: every request in flight at its longest, prompt budget 1,024 tokens),
        no busy-polling idle scheduler (`--sleep-on-idle`: an idle one took 20-80% of a core), and
        sglang's CPU docs' `--disable-overlap-schedule`."""
        suite = loaded.suite
        if suite.cluster.platform != "cpu":
            return ()
        tokens = min(suite.concurrency, 64) * (suite.max_tokens + 1024)
        return ("--device", "cpu", "--disable-overlap-schedule", "--sleep-on-idle", "--max-total-tokens", str(tokens))

    def platform_environment(self, platform: str, devices: tuple[str, ...] | None) -> dict[str, str]:
        """On `cpu`, sglang's CPU engine, each tp rank's threads bound to one of the cell's slots."""
        if platform != "cpu":
            return {"CUDA_VISIBLE_DEVICES": ",".join(devices)} if devices is not None else {}
        found = {"SGLANG_USE_CPU_ENGINE": "1"}
        if devices is not None:
            found["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(devices)
        return found


# What asyncio's create_server raises, and uvicorn logs, when the HTTP port is taken. sglang 0.5.23
# does not exit on it: its process lives on until its warmup thread gives up on its own port (124 s
# in the real-engine suite), so a start that waited for the exit would retry on another port that late.
PORT_BIND_FAILURE = "error while attempting to bind on address"


class SglangEngine(SglangCommandLine, Engine):
    """The real server: `python -m sglang.launch_server`."""

    launch_module = "sglang.launch_server"
    checks_at_plan_time = True
    # What sglang 0.5.23 logs when a child process fails (scheduler.py, tokenizer_manager.py,
    # detokenizer_manager.py, engine.py): each is followed by the launcher tearing the tree down.
    crash_markers = ("Scheduler hit an exception", "TokenizerManager hit an exception",
                     "DetokenizerManager hit an exception", "Received sigquit from a child process",
                     "SIGQUIT received.", "scheduler died during initialization", PORT_BIND_FAILURE)


class SimEngine(SglangCommandLine, Engine):
    """The simulator (`harness.sim`): sglang's flags and routes over a world file's decisions."""

    launch_module = "harness.sim"
    backends_probe = _SIM_BACKENDS_PROBE
    crash_markers = (PORT_BIND_FAILURE,)  # the simulator stays alive on a taken port, as sglang does

    def validate(self, loaded: LoadedSuite) -> None:
        from harness.sim.world import load_world

        if not loaded.suite.sim_world:
            raise ConfigError("sim_world: required with engine sim (a world file such as configs/sim/incident.yaml)")
        world = load_world(loaded.resolve_path(loaded.suite.sim_world))
        for model in loaded.suite.models:
            world.model(model.path)

    def environment(self, loaded: LoadedSuite, data_source: str | None) -> dict[str, str]:
        assert loaded.suite.sim_world is not None
        env = {"REGRESS_SIM_WORLD": str(loaded.resolve_path(loaded.suite.sim_world))}
        if data_source and Path(data_source).is_dir():  # GSM8K from a folder (the simulator knows its answers)
            env["REGRESS_GSM8K_PATH"] = data_source
        return env

    def commits(self, loaded: LoadedSuite, good: str, bad: str, repo: Path | None) -> list[str]:
        from harness.sim.world import load_world

        assert loaded.suite.sim_world is not None
        history = load_world(loaded.resolve_path(loaded.suite.sim_world)).history
        if good not in history or bad not in history:
            raise ConfigError(f"--good/--bad: both must be in the simulator world's history ({len(history)} commits)")
        return history[history.index(good):history.index(bad) + 1]

    def at_commit(self, loaded: LoadedSuite, cell: Cell, commit: str, build: str) -> tuple[LoadedSuite, Cell]:
        model = cell.model.model_copy(update={"env": {**cell.model.env, "REGRESS_SIM_COMMIT": commit}})
        return loaded, replace(cell, model=model, reference_cell=None)


ENGINES: Registry[Engine] = Registry("engine")
ENGINES.add("sglang", SglangEngine())
ENGINES.add("sim", SimEngine())


def engine_of(loaded: LoadedSuite) -> Engine:
    """The suite's engine; ConfigError naming the registered ones for an unknown name."""
    if loaded.suite.engine not in ENGINES:
        raise ConfigError(f"engine: {ENGINES.unknown(loaded.suite.engine)}")
    return ENGINES.get(loaded.suite.engine)
