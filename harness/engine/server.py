"""One server process: start, wait until ready, read what it resolved, watch it, stop it.

The server runs in its own process group, so stopping it reaches its workers too (sglang starts
tp workers, detokenizer, ...), and it carries a parent-death signal, so it dies with the Ray worker
that started it even when that worker is killed outright. It is never started in a new session,
which would escape Ray's cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from harness.engine.launch import LOOPBACK, LaunchSpec
from harness.engine.orphans import LAUNCHER_PID_VAR, group_members
from harness.engine.ports import free_port, listens_on
from harness.engine.server_info import read_server_info
from harness.errors import ErrorKind, ServerError

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1
STARTUP_PROBE_TIMEOUT_S = 5.0
_ADDRESS_IN_USE = ("address already in use", "errno 98", "address in use")


# The server inherits a parent-death signal from this one-line launcher, which sets it in its own
# (single-threaded) process and then becomes the server (execv keeps it). Setting it in a
# `preexec_fn` instead would run ctypes between fork and exec inside a threaded Ray worker, which
# Python documents as unsafe. The launcher runs under the server's own interpreter. A parent that
# died before the signal was armed (a worker killed while it launched: seen once, a simulated
# server orphaned at the end of a test session) would never send it, so the launcher checks that
# its parent is still the process that started it, and exits instead of serving for nobody.
_DEATH_SIGNAL_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    f"    ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGKILL)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('the process that launched this server is gone; not starting it')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _with_death_signal(argv: list[str]) -> list[str]:
    return [argv[0], "-c", _DEATH_SIGNAL_LAUNCHER, str(os.getpid()), *argv]


def health_probe_timeout_s(env: dict[str, str]) -> float:
    """How long a hang probe waits for /health_generate: sglang's own health check may take
    SGLANG_HEALTH_CHECK_TIMEOUT (20 s by default) before it answers, plus a margin."""
    try:
        configured = float(env.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
    except ValueError:
        configured = 20.0
    return configured + 5.0


def tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ServerProcess:
    """An async context manager around one server process.

    >>> # async with ServerProcess(spec, Path("cell.log")) as server:
    >>> #     info = await server.server_info(); ...
    """

    def __init__(self, spec: LaunchSpec, log_path: Path, port_attempts: int = 3) -> None:
        self.spec = spec
        self.log_path = log_path
        self.port_attempts = port_attempts
        self.process: subprocess.Popen[bytes] | None = None
        self.argv: list[str] = []
        self.port: int | None = None
        self.startup_s = 0.0
        self.leftover_pids: list[int] = []
        self._log_read = 0  # how far the log has been searched for crash markers

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def __aenter__(self) -> ServerProcess:
        try:
            await self.start()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.stop)

    def crash_line(self) -> str | None:
        """The first line the server logged since the last look that says a part of it died (the
        engine's `crash_markers`), or None. Reads only what was added to the log."""
        markers = self.spec.engine.crash_markers
        if not markers:
            return None
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(self._log_read)
                added = handle.read()
        except OSError:
            return None
        complete = added[:added.rfind(b"\n") + 1]  # a line still being written is read next time
        self._log_read += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            if any(marker in line for marker in markers):
                return line.strip()[:300]
        return None

    def _launch(self) -> None:
        self.port = free_port()
        self.argv = self.spec.argv(self.port, free_port())
        env = {**os.environ, **self.spec.environment(), LAUNCHER_PID_VAR: str(os.getpid())}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            # Its own process group (stopping it reaches its tp workers), never its own session
            # (which would escape Ray's cleanup). process_group is Python 3.11's fork-safe setpgid.
            group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
            self.process = subprocess.Popen(_with_death_signal(self.argv), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env, **group)

    async def start(self) -> None:
        started = time.monotonic()
        for attempt in range(1, self.port_attempts + 1):
            self._launch()
            try:
                await self._wait_ready(started)
                self.startup_s = time.monotonic() - started
                return
            except ServerError as error:
                in_use = isinstance(error, _PortTaken) or any(m in error.log_tail.lower() for m in _ADDRESS_IN_USE)
                if not in_use or attempt == self.port_attempts:
                    raise
                self.stop()

    def _startup_problem(self) -> ServerError | None:
        """The server exited, or logged that a part of it died: the error that says so, else None."""
        assert self.process is not None
        code = self.process.poll()
        if code is not None:
            return ServerError(f"server exited with code {code} during startup", process_exit_code=code,
                               log_tail=tail(self.log_path))
        crashed = self.crash_line()
        if crashed is not None:
            return ServerError(f"server crashed during startup (its launcher was still running): {crashed}",
                               log_tail=tail(self.log_path))
        return None

    async def _probe(self, session: aiohttp.ClientSession) -> bool:
        """One probe of the health route; False when refused, failed or timed out."""
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with session.get(self.base_url + self.spec.engine.health_route) as response:
                return response.status == 200
        return False

    async def _wait_ready(self, started: float) -> None:
        """Poll the engine's health route (sglang's /health_generate generates one token) until 200,
        the process exits, or the timeout."""
        assert self.process is not None
        delay = 0.1
        deadline = started + self.spec.startup_timeout_s
        # A probe may take a while (sglang's generates a token); the process is watched meanwhile,
        # so a port that accepts but never answers (another process's) cannot hide an exited server.
        timeout = aiohttp.ClientTimeout(total=STARTUP_PROBE_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                problem = self._startup_problem()
                if problem is not None:
                    raise problem
                probe = asyncio.ensure_future(self._probe(session))
                while not (await asyncio.wait({probe}, timeout=0.25))[0]:
                    problem = self._startup_problem()
                    if problem is not None:
                        probe.cancel()
                        raise problem
                if probe.result():
                    # Two servers on a node can pick the same free port; the one that binds
                    # second (sglang binds after loading the model) would be judged by the
                    # answers of the first. Only our own process group counts.
                    if listens_on(self.process.pid, self.port) is False:
                        raise _PortTaken(f"port {self.port} is answered by another process",
                                         log_tail=tail(self.log_path))
                    return
                if time.monotonic() > deadline:
                    raise ServerError(kind=ErrorKind.NOT_READY, message=f"server not ready after {self.spec.startup_timeout_s:.0f} s "
                                      "(startup_timeout_s); it is still running, so it was stopped",
                                      log_tail=tail(self.log_path))
                await asyncio.sleep(delay)
                # At most a quarter second between probes: the GPUs are held while we wait (half the
                # gap, on average, after the server is ready), and a probe of a server that is still
                # loading is a refused connection (it binds once loaded), which costs nothing.
                delay = min(delay * 1.5, 0.25)

    async def server_info(self) -> dict[str, Any]:
        """The resolved server arguments and version: the engine's info routes in turn (sglang's
        `/server_info`, else `/get_server_info`); {} for an engine that has none."""
        if not self.spec.engine.info_routes:
            return {}
        try:
            info = await read_server_info(self.base_url, self.spec.engine.info_routes)
        except ServerError as error:
            raise ServerError(str(error), kind=ErrorKind.SERVER_INFO, log_tail=tail(self.log_path)) from None
        if info is None:
            raise ServerError(f"the server answers none of {', '.join(self.spec.engine.info_routes)}",
                              kind=ErrorKind.SERVER_INFO, log_tail=tail(self.log_path))
        return info

    async def guard(self, work: Awaitable[T], progress: Callable[[], float] | None = None,
                    stall_timeout_s: float | None = None, poll_s: float = 0.25) -> T:
        """Run `work` while watching the server; cancel it and raise ServerError if the process dies,
        or if nothing progressed for `stall_timeout_s` and `/health_generate` does not answer either
        (a hung server: requests would otherwise sit out their whole timeouts and retries).
        `progress` returns the monotonic time of the last progress."""
        assert self.process is not None
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=poll_s)
                if done:
                    return task.result()
                code = self.process.poll()
                if code is not None:
                    raise ServerError(f"server exited with code {code} during evaluation", process_exit_code=code,
                                      kind=ErrorKind.CRASHED,
                                      log_tail=tail(self.log_path))
                crashed = self.crash_line()
                if crashed is not None:
                    raise ServerError(f"server crashed during evaluation (its launcher was still running): {crashed}",
                                      kind=ErrorKind.CRASHED, log_tail=tail(self.log_path))
                if progress is not None and stall_timeout_s is not None:
                    quiet_s = time.monotonic() - progress()
                    probe_s = health_probe_timeout_s({**os.environ, **self.spec.environment()})
                    if quiet_s > stall_timeout_s and not await self._answers_health(timeout_s=probe_s):
                        raise ServerError(kind=ErrorKind.HUNG, log_tail=tail(self.log_path),
                                          message=f"server hung: no answer for {quiet_s:.0f} s and /health_generate "
                                                  f"does not answer within {probe_s:.0f} s")
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _answers_health(self, timeout_s: float) -> bool:
        """One probe of the health route in a session of its own, waiting `timeout_s` at most."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            return await self._probe(session)

    def stop(self) -> None:
        """SIGTERM to the launcher alone, `stop_grace_s` for it to stop its children, then SIGKILL
        to the whole group; check nothing survives. (SIGTERM to the group would reach sglang's
        scheduler first: its launcher then logs the scheduler as crashed and waits 5 s more.)"""
        process = self.process
        if process is None:
            return
        group = process.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=self.spec.stop_grace_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + min(self.spec.stop_grace_s, 10.0)
        while process.poll() is not None and time.monotonic() < deadline and group_members(group):
            time.sleep(0.05)  # the launcher stopped; its children follow it: give them a moment
        # The group may outlive its leader (workers, a server that ignores SIGTERM): kill what is left.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and group_members(group):
            time.sleep(0.05)
        self.leftover_pids = group_members(group)
        self.process = None


class _PortTaken(ServerError):
    """Another process answers on the port this server was given."""


