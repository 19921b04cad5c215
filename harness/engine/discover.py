"""What the installed sglang accepts, read from its own argument parser on a worker node.

The axis value `auto` expands to every attention backend that `--attention-backend` accepts there,
so a backend added upstream is covered the day it appears (minus the suite's exclusions).
"""

from __future__ import annotations

import json
import os
import subprocess

from harness.errors import InfraError

_SGLANG_PROBE = """
import argparse, json
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
action = next(a for a in parser._actions if "--attention-backend" in a.option_strings)
print(json.dumps(list(action.choices or [])))
"""
_SIM_PROBE = """
import json, os
from harness.sim.args import build_parser
from harness.sim.world import load_world
parser = build_parser(load_world(os.environ["REGRESS_SIM_WORLD"]).attention_backends)
action = next(a for a in parser._actions if "--attention-backend" in a.option_strings)
print(json.dumps(list(action.choices)))
"""


def accepted_attention_backends(engine: str, python: str, env: dict[str, str], timeout_s: float = 300) -> tuple[str, ...]:
    """Run the engine's parser in `python` with `env` added and return `--attention-backend`'s choices."""
    probe = _SGLANG_PROBE if engine == "sglang" else _SIM_PROBE
    try:
        completed = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=timeout_s,
                                   env={**os.environ, **env}, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise InfraError(f"cannot read the attention backends {engine} accepts: {error}") from None
    if completed.returncode != 0:
        raise InfraError(f"cannot read the attention backends {engine} accepts (exit {completed.returncode}): "
                         f"{completed.stderr.strip()[-500:]}")
    return tuple(json.loads(completed.stdout.strip().splitlines()[-1]))
