"""What the installed engine accepts, read from its own argument parser on a worker node.

The axis value `auto` expands to every attention backend that `--attention-backend` accepts there,
so a backend added upstream is covered the day it appears (minus the suite's exclusions).
"""

from __future__ import annotations

import json
import os
import subprocess

from harness.errors import InfraError
from harness.suite.config import AXIS_VALUE


def accepted_attention_backends(probe: str, python: str, env: dict[str, str], timeout_s: float = 300,
                                engine: str = "the engine") -> tuple[str, ...]:
    """Run the engine's `backends_probe` (harness.engine.engines) in `python` with `env` added and
    return `--attention-backend`'s choices."""
    try:
        completed = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=timeout_s,
                                   env={**os.environ, **env}, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise InfraError(f"cannot read the attention backends {engine} accepts: {error}") from None
    if completed.returncode != 0:
        raise InfraError(f"cannot read the attention backends {engine} accepts (exit {completed.returncode}): "
                         f"{completed.stderr.strip()[-500:]}")
    names = tuple(json.loads(completed.stdout.strip().splitlines()[-1]))
    odd = [name for name in names if not isinstance(name, str) or not AXIS_VALUE.fullmatch(name)]
    if odd:  # they become cell ids (file names, MLflow runs, markdown): a PR's build could print anything
        raise InfraError(f"{engine} lists an attention backend that cannot name a cell: {str(odd[0])[:80]!r} "
                         f"(allowed: letters, digits, '.', '_', '-'); name the backends in the suite instead of auto")
    return names
