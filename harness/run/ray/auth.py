"""Token authentication for the Ray clusters `regress` starts or joins, set up before Ray is imported.

Ray 2.60 binds the GCS, the raylet and the workers' ports on every interface whatever the node
address (read with `ss -ltnp` on a local run), and its default auth mode is `disabled`: anyone who
can reach this machine could run code in a local cluster. Ray reads RAY_AUTH_MODE when it is first
imported (a process that sets it later starts a GCS its own driver cannot talk to), so `regress`
sets it as it starts, before any command imports Ray:

- RAY_AUTH_MODE=token, unless it is already `token`; any other value is refused (exit 2);
- the token: RAY_AUTH_TOKEN or Ray's token file when either is set up (a remote cluster's token
  goes there), else a fresh random token in this process's environment only (its children inherit
  it; no file is written). A cluster that checks no token ignores the one sent (tried on Ray 2.60).
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from harness.errors import ConfigError


def require_token_auth() -> None:
    """Set RAY_AUTH_MODE=token (and a token when none is set up) for this process and its children."""
    if "ray" in sys.modules:
        return  # too late to change what this process's Ray reads (an embedding program started it)
    mode = os.environ.get("RAY_AUTH_MODE", "")
    if mode and mode != "token":
        raise ConfigError(f"RAY_AUTH_MODE={mode}: Ray listens on every interface, so regress runs and joins it only "
                          "with token authentication; unset RAY_AUTH_MODE (regress sets it to token)")
    os.environ["RAY_AUTH_MODE"] = "token"
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if not os.environ.get("RAY_AUTH_TOKEN") and not token_file.is_file():
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
