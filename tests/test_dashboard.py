"""The dashboard from results/: content, and a real render in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from harness.analysis.dashboard import build_html, load_input
from harness.records import RunInfo, Status
from harness.results.archive import archives
from harness.results.store import ResultsStore
from tests import records
from tests.helpers import machine_s

BACKENDS = ("fa3", "triton")


def fake_run(root: Path, number: int, broken: bool) -> None:
    run_id = f"demo-2026112{number}-000000-abcd"
    started = (datetime(2026, 11, 20, tzinfo=timezone.utc) + timedelta(days=number)).isoformat()
    store = ResultsStore(root, run_id)
    counts = {"pass": 3, "fail": 1} if broken else {"pass": 4}
    store.write_run(RunInfo(run_id=run_id, suite="demo", config_path="x", config_sha256="0", engine="sim",
                            harness_version="t", protocol="clean", protocol_fingerprint="fp", started_at=started,
                            counts=counts, attribution="attention_backend=fa3 & unified_memory=on" if broken else None,
                            mlflow_run_id="parent", mlflow_experiment_id="7"))
    for backend in BACKENDS:
        for um in ("off", "on"):
            cell_id = f"m.ab-{backend}.um-{um}"
            bad = broken and backend == "fa3" and um == "on"
            answers = [i % (2 if bad else 10) != 0 for i in range(50)]
            store.write_questions(cell_id, records.answers(answers))
            store.append_cell(records.result(cell_id, Status.FAIL if bad else Status.PASS, reason="r",
                                             factors={"attention_backend": backend, "unified_memory": um},
                                             accuracy=sum(answers) / 50, n=50, mlflow_run_id=f"run-{cell_id}"))


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    for number, broken in ((1, False), (2, False), (3, True)):
        fake_run(tmp_path, number, broken)
    return tmp_path


def test_page_has_heatmap_diff_history_attribution_and_links(results):
    page = build_html(load_input(archives(results, None), "demo", mlflow_ui="http://mlflow:5000"))
    assert 'id="heatmap-plot"' in page and 'id="history-plot"' in page
    assert '<tr class="newly-failing"><td>newly failing</td>' in page and "m.ab-fa3.um-on" in page
    assert "attention_backend=fa3 &amp; unified_memory=on" in page
    assert 'href="http://mlflow:5000/#/experiments/7/runs/run-m.ab-fa3.um-on"' in page
    assert "last 3 runs" in page


@pytest.mark.browser
def test_chromium_renders_the_dashboard_without_console_errors(results, tmp_path):
    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: `make test` installs it (apt-get install chromium)"
    page = tmp_path / "dashboard.html"
    page.write_text(build_html(load_input(archives(results, None), "demo")))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--enable-logging=stderr",
             "--v=0", "--window-size=1400,1600"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=machine_s(120))
    assert dom.returncode == 0, dom.stderr[-2000:]
    console_errors = [line for line in dom.stderr.splitlines() if "CONSOLE" in line and
                      ("Uncaught" in line or "Error" in line)]
    assert console_errors == []
    heatmap = dom.stdout.split('id="heatmap-plot"', 1)[1]
    assert 'class="main-svg"' in heatmap.split('id="diff"', 1)[0]  # plotly drew the heatmap
    assert dom.stdout.count('class="newly-failing"') == 1
    shot = tmp_path / "dashboard.png"
    subprocess.run([chromium, *flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=machine_s(120))
    assert shot.stat().st_size > 10_000
