"""A slot killed mid-cell leaves its cell's log folder behind; the next cell on the node removes it."""

from __future__ import annotations

import os
import subprocess
import sys

from harness.run.ray.slot_actor import LOG_FOLDER_PREFIX, sweep_orphaned_log_folders


def test_log_folders_of_slots_that_are_gone_are_removed_and_no_other(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    gone_pid = int(gone.stdout)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        orphan = tmp_path / f"{LOG_FOLDER_PREFIX}{gone_pid}-abc123"
        running = tmp_path / f"{LOG_FOLDER_PREFIX}{live.pid}-def456"
        own = tmp_path / f"{LOG_FOLDER_PREFIX}{os.getpid()}-ghi789"
        legacy = tmp_path / f"{LOG_FOLDER_PREFIX}sg8ebbub"  # before pids were in the name: left alone
        for folder in (orphan, running, own, legacy):
            folder.mkdir()
            (folder / "cell.log").write_text("server log\n")
        sweep_orphaned_log_folders(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for f in (running, own, legacy))
    finally:
        live.kill()
        live.wait()
