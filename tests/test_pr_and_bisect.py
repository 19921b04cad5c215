"""The PR job: change-aware selection, workflows, a PR played end to end; and bisection."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.benchmark.gsm8k.dataset import load_gsm8k
from harness.bisect.search import bisect_commits
from harness.cli import app
from harness.engine.engines import ENGINES, SglangEngine, SimEngine
from harness.records import CellOutcome, CellResult, RunInfo
from harness.suite.config import load_suite
from harness.suite.matrix import expand
from harness.suite.selection import load_selection, select_cells
from tests.helpers import INCIDENT_WORLD, ROOT, machine_s
from tests.records import scored

FAKE_SGLANG = ROOT / "tests" / "fixtures" / "fake_sglang"

RULES = load_selection(ROOT / "configs" / "selection.yaml")
NIGHTLY = expand(load_suite(ROOT / "configs" / "nightly.yaml").suite)
DEMO = expand(load_suite(ROOT / "configs" / "demo.yaml").suite)


def test_a_backend_change_selects_that_backend_and_the_references():
    selected = select_cells(DEMO, RULES, ["python/sglang/srt/layers/attention/flashinfer_backend.py"])
    assert not selected.full
    chosen = set(selected.cells)
    assert {c for c in chosen if "flashinfer" in c} == {c.cell_id for c in DEMO.cells if "ab-flashinfer" in c.cell_id}
    assert chosen - {c.cell_id for c in DEMO.cells if "ab-flashinfer" in c.cell_id} == {
        "kimi-linear.ab-triton.um-off.rc-on", "deepseek-v2-lite.ab-triton.um-off.rc-on"}
    assert "flashinfer attention backend" in selected.cells["kimi-linear.ab-flashinfer.um-on.rc-on"][0]


def test_shared_machinery_selects_everything_and_unknown_paths_the_default():
    assert select_cells(NIGHTLY, RULES, ["python/sglang/srt/model_executor/model_runner.py"]).full
    assert len(select_cells(NIGHTLY, RULES, ["python/sglang/srt/server_args.py"]).cells) == len(NIGHTLY.cells)
    fallback = select_cells(DEMO, RULES, ["docs/index.md"])
    assert set(fallback.cells) == {"kimi-linear.ab-triton.um-off.rc-on", "kimi-linear.ab-triton.um-off.rc-off",
                                   "deepseek-v2-lite.ab-triton.um-off.rc-on", "deepseek-v2-lite.ab-triton.um-off.rc-off"}


def test_a_mem_cache_change_selects_radix_on_cells_of_both_memory_modes():
    cells = select_cells(DEMO, RULES, ["python/sglang/srt/mem_cache/radix_cache.py"]).cells
    assert all(".rc-on" in c for c in cells) and any(".um-on." in c for c in cells)


def test_workflows_validate_against_the_github_schema(tmp_path):
    checker = str(Path(sys.executable).parent / "check-jsonschema")
    workflows = sorted(str(p) for p in (ROOT / "jobs" / "github").glob("*.yml"))
    ok = subprocess.run([checker, "--builtin-schema", "vendor.github-workflows", *workflows], capture_output=True,
                        text=True, timeout=machine_s(120))
    assert len(workflows) == 2 and ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text((ROOT / "jobs" / "github" / "pr.yml").read_text().replace("runs-on:", "run-on:"))
    bad = subprocess.run([checker, "--builtin-schema", "vendor.github-workflows", str(broken)], capture_output=True,
                         text=True, timeout=machine_s(120))
    assert bad.returncode != 0


def test_pr_workflow_never_checks_out_pr_code():
    workflow = yaml.safe_load((ROOT / "jobs" / "github" / "pr.yml").read_text())
    assert "pull_request_target" in workflow[True] and workflow["permissions"] == {
        "contents": "read", "pull-requests": "write", "checks": "write"}
    steps = workflow["jobs"]["matrix"]["steps"]
    # An UNDECIDED matrix (exit 3) is a neutral check on the labelled commit, never a plain success.
    run = next(step for step in steps if step.get("id") == "matrix")["run"]
    assert 'if [ "$code" -eq 3 ]; then exit 0; fi' in run
    neutral = next(step for step in steps if step.get("if") == "steps.matrix.outputs.code == '3'")["run"]
    assert "conclusion=neutral" in neutral and "::warning" in neutral
    for step in steps:
        assert "head.sha" not in str(step.get("with", {})) and "head.ref" not in str(step.get("with", {}))
    assert "run-accuracy-matrix" in workflow["jobs"]["matrix"]["if"]


def github_if(expression: str, event: dict) -> bool:
    """The subset of GitHub's expression syntax the PR workflow uses: `==`, `&&`, `contains()`,
    and `github.event...` paths (with `.*.` over lists)."""
    def lookup(path: str):
        value: object = {"github": {"event": event}}
        parts = path.split(".")
        for index, part in enumerate(parts):
            if part == "*":
                return [item[parts[index + 1]] for item in value]  # type: ignore[union-attr]
            value = value[part]  # type: ignore[index]
        return value

    python = re.sub(r"github(?:\.[\w*]+)+", lambda m: f"lookup({m.group(0)!r})", expression)
    python = python.replace("&&", " and ").replace("||", " or ").replace("'", '"')
    return bool(eval(python, {"lookup": lookup, "contains": lambda items, item: item in items}))


LABEL = "run-accuracy-matrix"


@pytest.mark.parametrize(("action", "labels", "added", "runs", "unlabels"), [
    ("labeled", [LABEL], LABEL, True, False),  # a maintainer's approval runs the PR's current code
    ("labeled", [LABEL, "bug"], "bug", False, False),  # another label is no approval
    ("synchronize", [LABEL], None, False, True),  # new commits after approval: label removed, nothing runs
    ("synchronize", [], None, False, False),
])
def test_pr_workflow_runs_only_on_a_maintainers_label_and_never_on_a_push(action, labels, added, runs, unlabels):
    workflow = yaml.safe_load((ROOT / "jobs" / "github" / "pr.yml").read_text())
    event = {"action": action, "pull_request": {"number": 7, "labels": [{"name": n} for n in labels]}}
    if added:
        event["label"] = {"name": added}
    assert github_if(workflow["jobs"]["matrix"]["if"], event) is runs
    assert github_if(workflow["jobs"]["unlabel"]["if"], event) is unlabels
    assert "--remove-label run-accuracy-matrix" in str(workflow["jobs"]["unlabel"]["steps"])


def test_pr_build_installs_the_commit_the_maintainer_labelled_and_keeps_no_credentials():
    """Not refs/pull/N/head: a push between labelling and the workers' install would run unreviewed
    code tagged with the reviewed SHA."""
    workflow = yaml.safe_load((ROOT / "jobs" / "github" / "pr.yml").read_text())
    steps = workflow["jobs"]["matrix"]["steps"]
    run_step = next(s for s in steps if "build_suite.py" in s.get("run", ""))
    assert "@$PR_SHA#subdirectory=python" in run_step["run"] and "refs/pull" not in run_step["run"]
    assert run_step["env"]["PR_SHA"] == "${{ github.event.pull_request.head.sha }}"
    for name in ("pr.yml", "nightly.yml"):
        flow = yaml.safe_load((ROOT / "jobs" / "github" / name).read_text())
        checkouts = [s for job in flow["jobs"].values() for s in job["steps"] if "checkout" in s.get("uses", "")]
        assert checkouts and all(s["with"]["persist-credentials"] is False for s in checkouts)


def test_build_suite_points_the_workers_at_one_build(tmp_path):
    out = tmp_path / "build.yaml"
    subprocess.run([sys.executable, "jobs/build_suite.py", "configs/nightly.yaml", str(out), "sglang @ git+x@v1"],
                   cwd=ROOT, check=True, capture_output=True, timeout=machine_s(60))
    suite = yaml.safe_load(out.read_text())
    assert suite["suite"] == "nightly" and suite["cluster"]["runtime_env"]["pip"] == ["sglang @ git+x@v1"]


def outcome(accuracy: float) -> CellOutcome:
    return scored(accuracy)


@pytest.mark.parametrize("first_bad", [1, 2, 31, 37, 62, 63])
def test_bisection_of_64_commits_takes_at_most_7_probes(first_bad):
    commits = [f"c{i:02d}" for i in range(64)]
    probed = []

    def run_probe(commit: str) -> CellOutcome:
        probed.append(commit)
        return outcome(0.1 if commits.index(commit) >= first_bad else 0.9)

    result = bisect_commits(commits, run_probe, lambda o, ref: (o.score.accuracy < 0.5, "", o.score.accuracy))
    assert result.first_bad == commits[first_bad] and len(probed) <= 7


def test_bisect_finds_the_first_bad_commit_through_real_probes(ray_local, tmp_path):
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["history"] = [f"c{i:02d}" for i in range(64)]
    world["bugs"][0]["since_commit"] = "c37"
    (tmp_path / "world.yaml").write_text(yaml.safe_dump(world))
    suite = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    suite["sim_world"] = str(tmp_path / "world.yaml")
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    result = CliRunner().invoke(app, ["bisect", "--suite", str(tmp_path / "demo.yaml"), "--cell",
                                      "kimi-linear.ab-fa3.um-on.rc-on", "--good", "c00", "--bad", "c63",
                                      "--num-questions", "40", "--results-dir", str(tmp_path / "results")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "first bad commit: c37" in result.output and "7 probes" in result.output


@pytest.mark.slow
def test_a_pr_played_end_to_end(tmp_path):
    """Changed files -> selected cells -> run -> summary, JUnit XML, comment body, exit code."""
    changed = tmp_path / "changed.txt"
    changed.write_text("python/sglang/srt/layers/attention/flashmla_backend.py\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "RESULTS_DIR": str(tmp_path / "results")}
    select = subprocess.run(["regress", "select", "configs/demo.yaml", "--changed-files", str(changed), "--write",
                             str(tmp_path / "cells.txt")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=machine_s(120))
    assert select.returncode == 0, select.stderr
    cells = (tmp_path / "cells.txt").read_text().split()
    assert len(cells) == 16 + 2  # the flashmla and fa3 cells of both models, plus the two reference cells
    job = subprocess.run(["bash", "jobs/run_and_report.sh", "configs/demo.yaml", "pr", "--cells",
                          str(tmp_path / "cells.txt"), "--num-questions", "60", "--no-tracking"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=machine_s(600))
    assert job.returncode == 1, job.stdout[-2000:] + job.stderr[-2000:]  # the incident cells are selected
    run_dir = next((tmp_path / "results").glob("demo-*"))
    junit = ElementTree.parse(run_dir / "junit.xml").getroot()
    assert len(junit.findall("testcase")) == 18 and len(junit.findall("testcase/failure")) == 2
    comment = (run_dir / "comment.md").read_text()
    assert "**fail**" in comment and "kimi-linear.ab-flashmla.um-on.rc-on" in comment


class _HistoryFakeSglang(SglangEngine):
    """The real sglang path (fake sglang package: its parser and resolution, the simulator behind
    it) with the simulator world's commit history, so a bisect needs no sglang checkout or build."""

    def commits(self, loaded, good, bad, repo):
        history = yaml.safe_load(Path(loaded.suite.models[0].env["REGRESS_SIM_WORLD"]).read_text())["history"]
        return history[history.index(good):history.index(bad) + 1]

    def at_commit(self, loaded, cell, commit, build):
        return SimEngine.at_commit(self, loaded, cell, commit, build)


def test_a_bisect_probe_is_built_as_a_run_is(ray_local, _gsm8k_env, tmp_path):
    """An `auto` suite on the sglang path with --gsm8k-path: every probe runs the plan-time sglang
    check (its predictions are in cells.jsonl), expands `auto` with the workers' parser, and reads
    the data from that path (its hash in run.json)."""
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["history"] = [f"c{i}" for i in range(4)]
    world["bugs"][0]["since_commit"] = "c2"
    (tmp_path / "world.yaml").write_text(yaml.safe_dump(world))
    data = tmp_path / "gsm8k"
    data.mkdir()
    for split, count in (("test", 80), ("train", 40)):
        lines = (_gsm8k_env / f"{split}.jsonl").read_text().splitlines()[:count]
        (data / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    env = {"PYTHONPATH": f"{FAKE_SGLANG}:{ROOT}", "REGRESS_SIM_WORLD": str(tmp_path / "world.yaml")}
    suite = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    suite.update(engine="history-fake-sglang", stop_grace_s=2,
                 axes={"attention_backend": ["triton", "auto"], "unified_memory": ["on"], "radix_cache": ["on"]},
                 baseline={"attention_backend": "triton"})
    suite.pop("sim_world")
    suite["models"] = [{**suite["models"][0], "env": env}]
    (tmp_path / "auto.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    with ENGINES.registered("history-fake-sglang", _HistoryFakeSglang()):
        result = CliRunner().invoke(app, ["bisect", "--suite", str(tmp_path / "auto.yaml"), "--cell",
                                          "kimi-linear.ab-fa3.um-on.rc-on", "--good", "c0", "--bad", "c3",
                                          "--num-questions", "40", "--gsm8k-path", str(data),
                                          "--results-dir", str(tmp_path / "results")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "first bad commit: c2" in result.output
    runs = sorted((tmp_path / "results").glob("*/run.json"))
    assert len(runs) >= 2
    expected_sha = load_gsm8k(data).sha256
    for run in runs:
        info = RunInfo.model_validate_json(run.read_text())
        assert info.dataset_sha256 == expected_sha
        (cell,) = [CellResult.model_validate_json(line) for line in (run.parent / "cells.jsonl").read_text().splitlines()]
        assert cell.predicted.get("attention_backend") == "fa3", cell  # the sglang check ran for the probe


def test_an_empty_cell_list_runs_nothing(tmp_path):
    """`regress select` writes an empty list when a PR touches no cell's files: `--cells` of it is a
    one-line configuration error (it ran the whole matrix), and the PR workflow runs nothing and says so."""
    empty = tmp_path / "cells.txt"
    empty.write_text("\n")
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "configs/pr.yaml", "--cells", str(empty),
                           "--results-dir", str(tmp_path / "results"), "--no-tracking"], cwd=ROOT,
                          capture_output=True, text=True, timeout=machine_s(120))
    assert done.returncode == 2 and "lists no cell, so there is nothing to run" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr and not (tmp_path / "results").exists()
    workflow = yaml.safe_load((ROOT / "jobs" / "github" / "pr.yml").read_text())
    run = next(s["run"] for s in workflow["jobs"]["matrix"]["steps"] if "build_suite.py" in s.get("run", ""))
    assert run.index("[ ! -s cells.txt ]") < run.index("build_suite.py") and "no cell was run" in run
