"""Finding a server's processes: those of its process group, and those whose launcher is gone (read from /proc)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

# Every process of a launched server (sglang's schedulers and detokenizer too) inherits the pid of
# the process that launched it, so that those the parent-death signal misses can be found. Seen once:
# sglang's detokenizer, which arms a parent-death signal of its own as it starts, still running (its
# parent pid 1) an hour after a test session was aborted while its server started.
LAUNCHER_PID_VAR = "REGRESS_LAUNCHER_PID"


def orphaned_server_pids() -> list[int]:
    """The processes whose environment this process may read (its user's; root: all) that carry
    LAUNCHER_PID_VAR naming a process that no longer exists."""
    needle = f"{LAUNCHER_PID_VAR}=".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone meanwhile, or another user's
            continue
        launcher = next((item[len(needle):] for item in environ.split(b"\0") if item.startswith(needle)), b"")
        if launcher.isdigit() and not process_exists(int(launcher)):
            found.append(int(entry))
    return found


def kill_orphaned_servers() -> list[int]:
    """SIGKILL the processes of servers whose launcher is gone (`orphaned_server_pids`); their pids."""
    killed = orphaned_server_pids()
    for pid in killed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return killed


def process_exists(pid: int) -> bool:
    """Whether a process has this pid (one this process may not signal counts: it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def group_members(group: int) -> list[int]:
    """Live (non-zombie) processes in a process group, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == group and state != "Z":
            members.append(int(entry))
    return members
