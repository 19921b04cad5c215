"""`regress compare` between two nights, and `regress sync` after the tracking server was down."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from harness.cli import app
from tests.helpers import INCIDENT_WORLD, few_questions_suite
from tests.test_run_end_to_end import children_of, mlflow_runs

SELECT = "model=kimi-linear,radix_cache=on,attention_backend=fa3|triton"


def night(tmp_path, with_bug: bool, *extra: str):
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    if not with_bug:
        world["bugs"] = []
    world["path_noise"] = 0.02  # a server's own paths differ a little, as on real sglang
    (tmp_path / "world.yaml").write_text(yaml.safe_dump(world))
    suite = yaml.safe_load(open("configs/demo.yaml"))
    suite["sim_world"] = str(tmp_path / "world.yaml")
    few_questions_suite(suite)  # 60 questions: a gate they can meet
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return CliRunner().invoke(app, ["run", str(tmp_path / "demo.yaml"), "--results-dir", str(tmp_path / "results"),
                                    "--num-questions", "60", "--select", SELECT, "--quiet", *extra],
                              catch_exceptions=False)


def test_compare_names_the_newly_failing_cell(ray_local, tmp_path):
    assert night(tmp_path, False, "--no-tracking").exit_code == 0
    assert night(tmp_path, True, "--no-tracking").exit_code == 1
    markdown = tmp_path / "diff.md"
    result = CliRunner().invoke(app, ["compare", "previous:demo", "latest:demo", "--results-dir",
                                      str(tmp_path / "results"), "--markdown", str(markdown)])
    assert result.exit_code == 1
    rows = {line.split("|")[2].strip(" `"): line for line in markdown.read_text().splitlines()
            if line.startswith("| ") and "`" in line}
    assert "newly failing" in rows["kimi-linear.ab-fa3.um-on.rc-on"]
    assert "pass → fail" in rows["kimi-linear.ab-fa3.um-on.rc-on"]

    # Floors and the run to pin, from the two nights: the first is the one where every cell passed.
    first_night = sorted(path.name for path in (tmp_path / "results").glob("demo-*"))[0]
    calibrated = CliRunner().invoke(app, ["calibrate", str(tmp_path / "demo.yaml"), "--results-dir",
                                          str(tmp_path / "results"), "--num-questions", "60"])
    assert calibrated.exit_code == 0, calibrated.output
    assert f"pinned_run: {first_night}" in calibrated.output and "kimi-linear: accuracy: 0." in calibrated.output
    # The cells' own paths (batched or alone, warm or cold) moved each log-probability by up to 0.02
    # nats; the decode check's statistic is a mean over 8-24 tokens, not a whole answer, so its 95th
    # percentile is higher (times 1.5, rounded up: 0.035 in this world).
    proposed = next(line for line in calibrated.output.splitlines() if "gate.self_checks.tolerance: " in line)
    assert 0.01 < float(proposed.split(": ")[1].split()[0]) <= 0.04, proposed
    assert "still passing" in rows["kimi-linear.ab-triton.um-on.rc-on"]
    assert "+0.000" in rows["kimi-linear.ab-fa3.um-off.rc-on"]  # same world, same answers: no difference


def test_compare_refuses_different_protocols(tmp_path):
    """Two nights of 60 and 30 questions, as `regress run` writes them (the record types it writes)."""
    from harness.records import Status
    from harness.results.store import ResultsStore
    from tests.records import answers, result, run_info

    for run_id, started, fingerprint in (("demo-20261201-010000-aaaa", "2026-12-01T01:00:00+00:00", "clean-60q"),
                                         ("demo-20261202-010000-bbbb", "2026-12-02T01:00:00+00:00", "clean-30q")):
        store = ResultsStore(tmp_path / "results", run_id)
        store.write_run(run_info(run_id, suite="demo", started_at=started, ended_at=started,
                                 protocol_fingerprint=fingerprint))
        store.write_questions("kimi-linear.ab-fa3.um-on.rc-on", answers([True] * 30))
        store.append_cell(result("kimi-linear.ab-fa3.um-on.rc-on", Status.PASS, model="kimi-linear", accuracy=1.0,
                                 n=30, protocol_fingerprint=fingerprint))
    compared = CliRunner().invoke(app, ["compare", "previous:demo", "latest:demo", "--results-dir",
                                        str(tmp_path / "results")])
    assert compared.exit_code == 2 and "different protocols" in compared.output, compared.output
    assert "clean-60q vs clean-30q" in compared.output


def test_sync_uploads_a_run_made_while_tracking_was_down_and_twice_is_once(ray_local, tmp_path):
    result = night(tmp_path, True, "--tracking-uri", "http://127.0.0.1:9")
    assert result.exit_code == 1
    run_dir = next((tmp_path / "results").glob("demo-*"))
    assert json.loads((run_dir / "run.json").read_text())["tracking_error"]
    store_uri = f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    for _ in range(2):
        synced = CliRunner().invoke(app, ["sync", run_dir.name, "--results-dir", str(tmp_path / "results"),
                                          "--tracking-uri", store_uri], catch_exceptions=False)
        assert synced.exit_code == 0, synced.output
    assert "0 cell run(s) logged now" in synced.output
    runs = mlflow_runs(tmp_path / "results", "demo")
    assert len(runs) == 1 + 4 and len(children_of(runs)) == 4
    cells = [json.loads(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]
    assert all(c["mlflow_run_id"] for c in cells)
    assert json.loads((run_dir / "run.json").read_text())["tracking_error"] is None
    # A CI runner whose results/ starts empty reads the verdict from MLflow (`regress assess`, as `compare`).
    empty = tmp_path / "empty"
    empty.mkdir()
    assessed = CliRunner().invoke(app, ["assess", "latest:demo", "--results-dir", str(empty), "--tracking-uri",
                                        store_uri], catch_exceptions=False)
    assert assessed.exit_code == 1 and assessed.output.startswith("REGRESSIONS: "), assessed.output
