"""A `Tracker` that lives in a child process: MLflow's import, the store's opening and every call to
it run there, so the process that sends the questions keeps its core and its GIL.

Measured (docs/benchmarks.md, "`regress eval` beside a lean client"): with MLflow imported in a
thread of the evaluating process, the server's utilisation fell from 0.95 to 0.86 while the import
ran; the import alone is ~2.7 s of CPU and ~170 MiB. In a child the import runs on another core.

The parent's object has the part of `Tracker`'s interface a sink uses (`connect`, `start`,
`log_cell`, `finish`, `error`, `experiment_id`, `parent_run_id`, `logged_cells`). `connect` returns
at once (the child starts on it); every other call waits for the child's answer, so the order of
calls and what a sink sees are those of an in-process Tracker. Tracking stays a sink, never a
dependency: a child that dies or cannot start turns tracking off with the reason in `error`, as a
failed MLflow call does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from typing import Any

from harness.results.tracking import Tracker


class TrackerProcess:
    """The parent's side: forwards each call to a `Tracker` in `python -m harness.results.tracker_process`."""

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self.error: str | None = None
        self.parent_run_id: str | None = None
        self.experiment_id: str | None = None
        self._logged: set[str] = set()
        self._child: subprocess.Popen[bytes] | None = None
        self._pipe: Connection | None = None
        self._pending = 0  # calls sent whose answers have not been read yet

    # ---- the Tracker interface ---------------------------------------------------------------------
    def connect(self, experiment: str) -> None:
        """Start the child and have it import MLflow and open the store; returns without waiting."""
        self._send("connect", experiment)

    def start(self, info: Any, params: dict[str, Any]) -> str | None:
        return self._call("start", info, params)

    def log_cell(self, result: Any, questions: list[Any], server_info: dict[str, Any], log_text: str) -> str | None:
        return self._call("log_cell", result, questions, server_info, log_text)

    def finish(self, info: Any, artifacts: dict[str, str]) -> None:
        self._call("finish", info, artifacts)

    def logged_cells(self) -> set[str]:
        return set(self._logged)

    def close(self) -> None:
        """Let the child exit (end of input) and reap it."""
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        if self._child is not None:
            try:
                self._child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
            self._child = None

    # ---- the channel ---------------------------------------------------------------------------------
    def _spawn(self) -> None:
        parent_end, child_end = os.pipe(), os.pipe()  # parent -> child, child -> parent
        self._child = subprocess.Popen(
            [sys.executable, "-m", "harness.results.tracker_process", str(parent_end[0]), str(child_end[1]),
             self.tracking_uri], pass_fds=(parent_end[0], child_end[1]), stdin=subprocess.DEVNULL)
        os.close(parent_end[0])
        os.close(child_end[1])
        self._pipe = _Duplex(child_end[0], parent_end[1])

    def _send(self, method: str, *args: Any) -> bool:
        if self.error is not None:
            return False
        try:
            if self._child is None:
                self._spawn()
            self._pipe.send((method, args))
        except OSError as error:  # could not start, or it is gone (a broken pipe)
            self._lost(method, error)
            return False
        self._pending += 1
        return True

    def _call(self, method: str, *args: Any) -> Any:
        if not self._send(method, *args):
            return None
        answer = None
        while self._pending:
            try:
                answer, state = self._pipe.recv()
            except (EOFError, OSError) as error:
                self._lost(method, error)
                return None
            self._pending -= 1
            self.error, self.parent_run_id, self.experiment_id, logged = state
            self._logged = set(logged)
        return answer

    def _lost(self, method: str, error: BaseException) -> None:
        """Tracking off for the rest of the run, saying why; the child, if any, is reaped."""
        code = None
        if self._child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._child.wait(timeout=5)
        why = (f"the MLflow logger process ended (exit code {code}) before answering {method}" if code is not None
               else f"the MLflow logger process could not be started or reached for {method} ({error})")
        self.error = self.error or why
        self._pending = 0
        self.close()


class _Duplex:
    """Two one-way pipes as one `Connection`-like object (pickled messages, length-prefixed)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._reader = Connection(read_fd, writable=False)
        self._writer = Connection(write_fd, readable=False)

    def send(self, message: Any) -> None:
        self._writer.send(message)

    def recv(self) -> Any:
        return self._reader.recv()

    def close(self) -> None:
        self._writer.close()
        self._reader.close()


def serve(read_fd: int, write_fd: int, tracking_uri: str) -> None:
    """The child: answer each (method, args) with (result, state) until the parent closes its end."""
    pipe = _Duplex(read_fd, write_fd)
    tracker = Tracker(tracking_uri)
    while True:
        try:
            method, args = pipe.recv()
        except EOFError:
            return
        try:
            result = getattr(tracker, method)(*args)  # MLflow's own errors Tracker turns into tracker.error
        except Exception as error:  # noqa: BLE001 - anything else still only turns tracking off
            result, tracker.error = None, tracker.error or f"{method} failed ({type(error).__name__}: {str(error)[:300]})"
        pipe.send((result, (tracker.error, tracker.parent_run_id, tracker.experiment_id,
                            sorted(tracker.logged_cells()))))


if __name__ == "__main__":
    # Ctrl-C reaches the whole process group, and so does SIGTERM when a CI job is cancelled; the
    # parent decides what an interrupt means (it closes the pipe when it is done with tracking: the
    # child ends at that end of input, or when the parent dies), so the logger finishes its call
    # and the parent's last calls (the run marked interrupted) instead of dying mid-write.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
