"""Picking the ports a server binds, and telling which process holds one (no I/O beyond /proc and bind)."""

from __future__ import annotations

import contextlib
import os
import random
import socket
from pathlib import Path

from harness.engine.launch import LOOPBACK

# Server ports are drawn from below the kernel's ephemeral range and above Ray's worker ports
# (10002-19999 by default). A port the kernel hands out (bind to port 0) comes from the ephemeral
# range, where every other process's port-0 listeners land meanwhile: a tp-2 CPU sglang's schedulers
# alone opened 32 listening sockets there as they started (`ss -tlnp`), before its HTTP bind, and
# twice a real-engine run's tp-2 server found its kernel-picked port taken at bind (Errno 98: it is
# stopped and relaunched, ~40 s lost). Picked here, a port can only be lost to an explicit bind.
PORTS_ABOVE = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PORT_DRAW = random.SystemRandom()  # from the OS: no seed set in a worker makes two workers draw alike


def _ephemeral_low() -> int | None:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port(host: str = LOOPBACK, attempts: int = 64) -> int:
    """A port that is free on this node now (the server binds it moments later; a lost race is
    detected from the log and retried on another port): a random one between PORTS_ABOVE and the
    ephemeral range, else (no such gap on this machine, or none free) one the kernel picks."""
    low = _ephemeral_low()
    candidates = range(PORTS_ABOVE, low) if low is not None and low - PORTS_ABOVE >= 1000 else range(0)
    for port in _PORT_DRAW.sample(candidates, min(attempts, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def listens_on(group: int, port: int) -> bool | None:
    """Whether a process of `group` holds the listening socket of TCP `port` (read from /proc);
    None when that cannot be told (no /proc, or the socket is not visible to us)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    from harness.engine.orphans import group_members

    for pid in group_members(group):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                        return True
    return False
