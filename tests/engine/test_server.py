"""Server lifetime: readiness, early exit, timeouts, crashes, and a stop that leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.benchmark.evaluator import EvalSettings, evaluate
from harness.benchmark.gsm8k.protocol import build_plan
from harness.engine.orphans import group_members, kill_orphaned_servers, orphaned_server_pids
from harness.engine.server import ServerProcess
from harness.errors import ServerError
from tests.helpers import ROOT, fault_world, machine_s, make_cell, sim_spec

CELL = make_cell({"attention_backend": "triton"})


def run(coroutine):
    return asyncio.run(coroutine)


def test_exit_during_startup_reports_code_and_log_tail(tmp_path):
    world = fault_world(tmp_path, startup_exit_code=3, startup_message="torch.OutOfMemoryError: CUDA out of memory")

    async def scenario():
        async with ServerProcess(sim_spec(CELL, world), tmp_path / "s.log"):
            pass

    with pytest.raises(ServerError) as caught:
        run(scenario())
    assert caught.value.process_exit_code == 3 and "during startup" in str(caught.value)
    assert "CUDA out of memory" in caught.value.log_tail


def test_never_ready_times_out_and_is_stopped(tmp_path):
    world = fault_world(tmp_path, never_ready=True)
    server = ServerProcess(sim_spec(CELL, world, timeout_s=3), tmp_path / "s.log")

    async def scenario():
        async with server:
            pass

    with pytest.raises(ServerError, match="not ready after 3 s"):
        run(scenario())
    assert server.process is None and server.leftover_pids == []


def test_crash_during_evaluation_is_a_server_error(tmp_path, gsm8k):
    world = fault_world(tmp_path, crash_after_requests=20)

    async def scenario():
        async with ServerProcess(sim_spec(CELL, world), tmp_path / "s.log") as server:
            await server.guard(evaluate(server.base_url, build_plan(gsm8k, "clean", 100, 0),
                                        EvalSettings(concurrency=4, max_attempts=2, backoff_initial_s=0.5)))

    with pytest.raises(ServerError, match="exited with code 139 during evaluation") as caught:
        run(scenario())
    assert "simulated crash" in caught.value.log_tail


@pytest.mark.parametrize("fault", [{"ignore_sigterm": True}, {"spawn_grandchild": True},
                                   {"ignore_sigterm": True, "spawn_grandchild": True}])
def test_stop_leaves_no_process_of_the_group(tmp_path, fault):
    world = fault_world(tmp_path, **fault)
    server = ServerProcess(sim_spec(CELL, world, grace_s=1.0), tmp_path / "s.log")

    async def scenario():
        async with server:
            group = server.process.pid
            if fault.get("spawn_grandchild"):
                deadline = time.monotonic() + machine_s(5)
                while len(group_members(group)) < 2 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert len(group_members(group)) >= 2
            return group

    group = run(scenario())
    assert group_members(group) == [] and server.leftover_pids == []


def server_in_a_parent(tmp_path: Path, world: Path | None = None) -> tuple[subprocess.Popen, int]:
    """A process (as a Ray worker would be) that starts a simulated server of `world` and sleeps: it,
    and its server's pid, which is also the server's process group."""
    script = tmp_path / "parent.py"
    script.write_text(f"""
import asyncio, json, sys, time
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from harness.engine.server import ServerProcess
from tests.helpers import make_cell, sim_spec
async def main():
    spec = sim_spec(make_cell({{"attention_backend": "triton"}}), world={str(world) if world else None!r})
    server = ServerProcess(spec, Path({str(tmp_path / 's.log')!r}))
    await server.start()
    print(json.dumps({{"group": server.process.pid}}), flush=True)
    time.sleep(600)
asyncio.run(main())
""")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    return parent, json.loads(parent.stdout.readline())["group"]


def test_server_dies_with_the_process_that_started_it(tmp_path):
    """A Ray worker killed outright takes its server along (parent-death signal)."""
    parent, group = server_in_a_parent(tmp_path)
    assert group_members(group)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + machine_s(10)
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(group) == []


def test_a_server_process_that_outlives_its_launcher_is_killed_by_the_next_sweep(tmp_path):
    """A process of the server that its parent's death does not take along (the simulator's helper;
    sglang's detokenizer was once seen to outlive its server) lives on when the slot is killed
    outright: the sweep a slot runs before each cell finds it by the launcher pid it carries and kills
    it. A server whose launcher lives is left alone."""
    parent, group = server_in_a_parent(tmp_path, fault_world(tmp_path, spawn_grandchild=True))
    living = ServerProcess(sim_spec(CELL), tmp_path / "living.log")
    try:
        asyncio.run(living.start())
        assert len(group_members(group)) == 2  # the server and its helper, while their launcher lives
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + machine_s(10)
        while group in group_members(group) and time.monotonic() < deadline:  # the server: its death signal
            time.sleep(0.1)
        assert group not in group_members(group)
        assert living.process.pid not in orphaned_server_pids()
        # The helper lived on. A sweep finds it by its launcher's pid and kills it: this one, or one of
        # another pytest-xdist worker's slots meanwhile (the same code).
        while group_members(group) and time.monotonic() < deadline:
            kill_orphaned_servers()
            time.sleep(0.1)
        assert group_members(group) == [] and living.process.poll() is None
    finally:
        parent.kill()
        living.stop()
        for pid in group_members(group):
            os.kill(pid, signal.SIGKILL)


def test_address_in_use_retries_on_another_port(tmp_path, monkeypatch):
    """Another process took the port between our pick and the server's bind. The server logs the
    bind failure and lives on (sglang does, ~2 min, until its warmup gives up; so does the
    simulator): the line is enough to stop it and start again on another port, while the health
    probe to the taken port (a socket that accepts and never answers) would wait 10 minutes."""
    import socket

    from harness.engine import server as server_module

    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    ports = iter([taken, taken + 0])  # first launch gets the taken port (its nccl port too)
    real = server_module.free_port
    monkeypatch.setattr(server_module, "free_port", lambda host="127.0.0.1": next(ports, None) or real())
    monkeypatch.setattr(server_module, "STARTUP_PROBE_TIMEOUT_S", 600.0)
    server = ServerProcess(sim_spec(CELL), tmp_path / "s.log")

    async def scenario():
        async with server:
            return server.port

    try:
        assert run(asyncio.wait_for(scenario(), machine_s(60))) != taken
    finally:
        blocker.close()
    assert "error while attempting to bind on address" in (tmp_path / "s.log").read_text()


def test_a_server_that_exits_while_a_probe_hangs_is_seen_at_once(tmp_path, monkeypatch):
    """The server exits at once while its port is answered by a socket that accepts and never
    answers: the start says so while the health probe still waits (it would wait its whole
    timeout, here 10 min)."""
    import socket

    from harness.engine import server as server_module

    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    monkeypatch.setattr(server_module, "free_port", lambda host="127.0.0.1": blocker.getsockname()[1])
    monkeypatch.setattr(server_module, "STARTUP_PROBE_TIMEOUT_S", 600.0)
    world = fault_world(tmp_path, startup_exit_code=3, startup_message="torch.OutOfMemoryError: CUDA out of memory")
    server = ServerProcess(sim_spec(CELL, world), tmp_path / "s.log", port_attempts=1)

    async def scenario():
        async with server:
            pass

    try:
        with pytest.raises(ServerError, match="exited with code"):
            run(asyncio.wait_for(scenario(), machine_s(60)))
    finally:
        blocker.close()


def test_a_port_answered_by_another_server_is_not_taken_for_ours(tmp_path, monkeypatch):
    """Two servers on a node picked the same port: ours (still loading, like sglang, which binds
    after the model is loaded) must not be judged by the other's answers."""
    import http.server
    import threading

    import yaml

    from harness.engine import server as server_module

    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server name
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    taken = other.server_address[1]
    world = yaml.safe_load((ROOT / "configs" / "sim" / "incident.yaml").read_text())
    world["models"][CELL.model.path]["startup_s"] = 1.0
    (tmp_path / "world.yaml").write_text(yaml.safe_dump(world))
    ports = iter([taken])
    real = server_module.free_port
    monkeypatch.setattr(server_module, "free_port", lambda host="127.0.0.1": next(ports, None) or real())
    server = ServerProcess(sim_spec(CELL, tmp_path / "world.yaml"), tmp_path / "s.log")

    async def scenario():
        async with server:
            assert server_module.listens_on(server.process.pid, server.port) is True
            return server.port, await server.server_info()

    try:
        port, info = run(scenario())
    finally:
        other.shutdown()
    assert port != taken and info["attention_backend"] == "triton"


def test_the_hang_probe_waits_as_long_as_sglangs_own_health_check_may_take():
    from harness.engine.server import health_probe_timeout_s

    assert health_probe_timeout_s({}) == 25.0  # SGLANG_HEALTH_CHECK_TIMEOUT defaults to 20 s
    assert health_probe_timeout_s({"SGLANG_HEALTH_CHECK_TIMEOUT": "60"}) == 65.0


def test_the_server_is_started_without_a_preexec_hook_and_in_its_own_process_group(tmp_path):
    """Python documents preexec_fn as unsafe in threaded programs (a Ray worker is one)."""
    from unittest import mock

    started = {}
    real_popen = subprocess.Popen

    def spy(argv, **kwargs):
        started.update(kwargs, argv=argv)
        return real_popen(argv, **kwargs)

    with mock.patch("harness.engine.server.subprocess.Popen", spy):
        server = ServerProcess(sim_spec(CELL), tmp_path / "s.log")
        asyncio.run(server.start())
        try:
            assert os.getpgid(server.process.pid) == server.process.pid  # a group of its own
        finally:
            server.stop()
    assert "preexec_fn" not in started and started["process_group"] == 0
    # The launcher, the pid it must still be the child of, then the server.
    assert started["argv"][1] == "-c" and started["argv"][3] == str(os.getpid()) and started["argv"][4:] == server.argv


def test_a_launcher_whose_parent_died_before_arming_the_death_signal_never_starts_the_server(tmp_path):
    """The worker died between fork and prctl: the signal would never come, so nothing is served."""
    from harness.engine.server import _with_death_signal

    marker = tmp_path / "served"
    argv = _with_death_signal([sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    argv[3] = "1"  # as if launched by a process that is gone (its orphan now belongs to pid 1)
    launched = subprocess.run(argv, capture_output=True, text=True, timeout=machine_s(60))
    assert launched.returncode == 1 and "is gone" in launched.stderr and not marker.exists()
    argv[3] = str(os.getpid())  # the real parent: the server runs
    assert subprocess.run(argv, timeout=machine_s(60)).returncode == 0 and marker.exists()


def test_ports_are_picked_below_the_ephemeral_range_where_kernel_picked_ports_never_land(tmp_path, monkeypatch):
    from harness.engine import ports as server_module

    ports_file = tmp_path / "ip_local_port_range"
    ports_file.write_text("32768\t60999\n")
    monkeypatch.setattr(server_module, "EPHEMERAL_RANGE", ports_file)
    picked = {server_module.free_port() for _ in range(20)}
    assert all(server_module.PORTS_ABOVE <= port < 32768 for port in picked) and len(picked) > 1, picked
    # No gap below the ephemeral range (a machine that hands out every port): the kernel picks.
    ports_file.write_text("1024 65535\n")
    assert server_module.free_port() >= 1024
    ports_file.unlink()  # no /proc: the kernel picks
    assert server_module.free_port() > 0
