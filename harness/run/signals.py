"""Ctrl-C and SIGTERM during a run: a flag the scheduling loop checks, not an exception.

An exception raised inside a signal handler can surface inside Ray's C++ wait as a SystemError, so
the first signal only sets the flag (the loop checks it twice a second and stops every slot); a
second signal stops at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class StopRequest:
    """Set by SIGTERM or SIGINT; `requested` is what the scheduler polls."""

    def __init__(self) -> None:
        self.signal: int | None = None

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def handle(self, signum: int, frame: object) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signum


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Route SIGTERM and SIGINT to a StopRequest for the block (main thread only: signals reach only
    the main thread, so an embedding caller on another thread keeps its own handling)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, request.handle)
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
