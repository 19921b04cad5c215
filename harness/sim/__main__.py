"""`python -m harness.sim ...`: start one simulated sglang server (see harness.sim)."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import ConfigError

if TYPE_CHECKING:
    from harness.sim.world import World

SGLANG_WARMUP_GIVES_UP_S = 124.0  # from a bind failure to sglang 0.5.23's own teardown (real-engine suite log)


def main(argv: list[str] | None = None) -> int:
    from harness.sim.args import build_parser, resolve
    from harness.sim.world import load_world

    world_path = os.environ.get("REGRESS_SIM_WORLD")
    if not world_path:
        print("error: set REGRESS_SIM_WORLD to a simulator world file, e.g. configs/sim/incident.yaml",
              file=sys.stderr)
        return 2
    try:
        world = load_world(world_path)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args = build_parser(world.attention_backends).parse_args(argv)
    try:
        resolved = resolve(args, world)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"[sim] server_args={resolved}", flush=True)
    faults = world.faults_for(args.model_path, resolved)
    code = _startup_faults(faults)
    if code is not None:
        return code
    from aiohttp import web

    from harness.benchmark.gsm8k.dataset import resolve_source
    from harness.sim.server import AnswerBook, SimState, build_app

    answers = AnswerBook(resolve_source(None))
    model = world.model(args.model_path)
    # Model loading: the port opens only afterwards, as in sglang.
    time.sleep(model.startup_s if model.startup_s is not None else world.latency.startup_s)
    if model.cold_load_s:
        node = os.environ.get("REGRESS_NODE_ID", "local")
        warm = _in_page_cache(world, Path(world_path), args.model_path)
        print(f"[sim] {'warm' if warm else 'cold'} load on node {node}", flush=True)
        if not warm:
            time.sleep(model.cold_load_s)
    state = SimState(world, resolved, answers, faults)
    print(f"[sim] The server is fired up and ready to roll! port={args.port}", flush=True)
    try:
        web.run_app(build_app(state), host=args.host, port=args.port, access_log=None, print=None,
                    handle_signals=not any(f.ignore_sigterm for f in faults))
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
        # As sglang 0.5.23 does: the bind failure is logged and the process stays until its warmup
        # thread gives up on its own port, then it tears itself down.
        print(f"ERROR:    {error}", flush=True)
        time.sleep(SGLANG_WARMUP_GIVES_UP_S)
        return 1
    return 0


def _startup_faults(faults: list) -> int | None:
    """Apply the faults that act at startup; the exit code when one ends the server right away."""
    for fault in faults:
        if fault.startup_exit_code is not None:
            print(fault.startup_message, file=sys.stderr, flush=True)
            return fault.startup_exit_code
        if fault.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if fault.spawn_grandchild:
            # A detached-looking helper in the same process group, as tp workers are for sglang.
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    return None


def _in_page_cache(world: World, world_path: Path, model_path: str) -> bool:
    """Whether this node loaded the model before (and remember that it now has)."""
    if world.page_cache_dir is None:
        return False
    node = os.environ.get("REGRESS_NODE_ID", "local")
    marker = world_path.parent / world.page_cache_dir / node / hashlib.sha1(model_path.encode()).hexdigest()
    if marker.exists():
        return True
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return False


if __name__ == "__main__":
    sys.exit(main())
