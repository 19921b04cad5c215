"""Bad input at the command line: exit 2, a message that says what and where, nothing launched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT, machine_s

DEMO = (ROOT / "configs" / "demo.yaml").read_text()


def regress(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`regress ARGS` in a subprocess whose Ray, if it started one, would write its session under
    `result.ray_tmpdir` (RAY_TMPDIR), so a test can tell that nothing was launched."""
    import os
    import shutil
    import tempfile
    import weakref

    ray_tmpdir = tempfile.mkdtemp(prefix="regress-ray-")
    result = subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, timeout=machine_s(120),
                            cwd=ROOT, env={**os.environ, "RAY_TMPDIR": ray_tmpdir, **(env or {})})
    result.ray_tmpdir = Path(ray_tmpdir)  # type: ignore[attr-defined]
    weakref.finalize(result, shutil.rmtree, ray_tmpdir, True)  # removed with the result (Ray's too, if it ran)
    return result


def refused(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    assert list(result.ray_tmpdir.iterdir()) == []  # type: ignore[attr-defined]  # Ray never started


def suite_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return str(path)


def test_tp_that_no_node_can_hold(tmp_path):
    text = DEMO.replace("tp: 2", "tp: 16")
    result = regress("run", suite_file(tmp_path, text), "--results-dir", str(tmp_path / "r"))
    assert result.returncode == 2 and "16 GPUs" in result.stderr and "largest node has 8" in result.stderr
    # Refused with Ray up: no cell, and no MLflow store (its logger was only warming up).
    assert not list((tmp_path / "r").glob("*/cells.jsonl")) and not (tmp_path / "r" / "mlflow.db").exists()


def test_missing_dataset_folder(tmp_path):
    refused(regress("run", "configs/demo.yaml", "--gsm8k-path", str(tmp_path / "nope"), "--results-dir",
                    str(tmp_path / "r")), "does not exist", "test.jsonl")


def test_dataset_lines_without_expected_fields(tmp_path):
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    (folder / "test.jsonl").write_text(json.dumps({"q": "x", "a": "y"}) + "\n")
    (folder / "train.jsonl").write_text(json.dumps({"question": "x", "answer": "#### 1"}) + "\n")
    refused(regress("run", "configs/demo.yaml", "--gsm8k-path", str(folder), "--results-dir", str(tmp_path / "r")),
            "test.jsonl:1", "'question' and 'answer'")


def test_unreadable_dataset_line(tmp_path):
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    (folder / "test.jsonl").write_text("{not json\n")
    (folder / "train.jsonl").write_text("")
    refused(regress("run", "configs/demo.yaml", "--gsm8k-path", str(folder)), "test.jsonl:1", "not valid JSON")


def test_resume_id_that_does_not_exist(tmp_path):
    refused(regress("run", "configs/demo.yaml", "--resume", "demo-19990101-000000-dead", "--results-dir",
                    str(tmp_path)), "--resume demo-19990101-000000-dead", "no run.json")


def test_selection_that_leaves_no_cell(tmp_path):
    refused(regress("run", "configs/demo.yaml", "--select", "model=nobody", "--results-dir", str(tmp_path)),
            "selects no cell")


def test_rules_that_leave_no_cell(tmp_path):
    text = DEMO + "include:\n  - {model: kimi-linear, attention_backend: fa3}\nexclude:\n  - {model: kimi-linear}\n"
    refused(regress("plan", suite_file(tmp_path, text)), "leave no cell to run")


def test_a_reference_cell_removed_by_the_exclusions(tmp_path):
    text = DEMO + "exclude:\n  - {model: kimi-linear, attention_backend: triton, reason: broken}\n"
    refused(regress("plan", suite_file(tmp_path, text)), "reference cell kimi-linear.ab-triton.um-off.rc-on",
            "is excluded (broken)")


def test_unknown_model_in_the_simulator_world(tmp_path):
    text = DEMO.replace("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-ai/DeepSeek-V9")
    refused(regress("run", suite_file(tmp_path, text), "--results-dir", str(tmp_path / "r")),
            "DeepSeek-V9", "not in the simulator's world")


def test_non_positive_question_count_on_the_command_line(tmp_path):
    refused(regress("run", "configs/demo.yaml", "--num-questions", "0"), "--num-questions")


def test_plan_prints_a_line_per_cell_with_its_tp_and_flags_and_marks_the_references():
    result = regress("plan", "configs/nightly.yaml")
    data = json.loads(regress("plan", "configs/nightly.yaml", "--json").stdout)
    assert result.returncode == 0 and result.stdout.startswith("nightly: 72 cells (sglang)\n")
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[2:74]}
    assert len(lines) == 72
    for cell in data["cells"]:
        line = lines[cell["cell_id"]]
        assert line.endswith(" ".join(cell["flags"]) or "-") and f"  {cell['tp']:>2}  " in line
        assert ("(reference)" in line) == (cell["reference_cell"] is None)
    assert "72 cells, " in result.stdout and "GPU-slots in all" in result.stdout


def test_plan_json_lists_cells_and_skips():
    result = regress("plan", "configs/nightly.yaml", "--json")
    data = json.loads(result.stdout)
    assert result.returncode == 0 and len(data["cells"]) == 72 and data["skipped"]
    # Each cell's exact server argv, ports and the worker's interpreter as placeholders, for other tools.
    kimi = next(c for c in data["cells"] if c["cell_id"].startswith("kimi-linear.ab-fa3.um-on.rc-on.cp-off"))
    assert kimi["argv"][:3] == ["{python}", "-m", "sglang.launch_server"] and "{port}" in kimi["argv"]
    assert kimi["argv"][-7:] == ["--attention-backend", "fa3", "--enable-unified-memory", "--chunked-prefill-size",
                                 "-1", "--mamba-radix-cache-strategy", "extra_buffer"]
    assert "--trust-remote-code" in kimi["argv"] and kimi["argv"][kimi["argv"].index("--tp-size") + 1] == "2"


def test_a_local_ray_that_cannot_start_is_one_line_and_not_a_regression(monkeypatch, tmp_path):
    """Seen on a loaded 2-core machine: Ray's node timed out during startup. That is infrastructure
    (exit 3), never "regressions found" (exit 1), and the user reads one line, not a traceback."""
    import ray
    from typer.testing import CliRunner

    from harness.cli import app

    def timed_out(**_: object) -> None:
        raise Exception("The current node timed out during startup. This could happen because some of the "
                        "Ray processes failed to startup.\n(77 more lines)")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", timed_out)
    # Between tries the run shuts Ray down; here that would stop the Ray this test worker's other
    # modules share (they then found none, and a Ray call started one without GPUs).
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    result = CliRunner().invoke(app, ["run", "configs/demo.yaml", "--results-dir", str(tmp_path), "--no-tracking"])
    assert result.exit_code == 3
    assert "could not start a local Ray cluster (" in result.output and "tries in" in result.output
    assert "The current node timed out during startup" in result.output
    assert "Traceback" not in result.output and "77 more lines" not in result.output


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)},"
    f" *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))


def test_hostile_suite_files_get_one_line_and_exit_2(tmp_path):
    """An alias bomb (10^9 values once expanded), a 5,000-deep list, a non-UTF-8 file, a binary file, 5 MiB:
    each is refused before anything starts, in one line."""
    cases = {"bomb.yaml": (BOMB + DEMO).encode(), "deep.yaml": ("x: " + "[" * 5000 + "]" * 5000 + "\n").encode(),
             "latin1.yaml": DEMO.replace("# The incident demo", "# caf\xe9").encode("latin-1"),
             "binary.yaml": bytes(range(256)) * 4, "huge.yaml": DEMO.encode() + b"#" * (5 << 20)}
    expected = {"bomb.yaml": "alias bomb", "deep.yaml": "nested deeper", "latin1.yaml": "not UTF-8",
                "binary.yaml": "not UTF-8", "huge.yaml": "larger than 4 MiB"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        result = regress("plan", str(tmp_path / name))
        refused(result, expected[name], name)
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_cells_file_that_is_not_text_is_refused(tmp_path):
    (tmp_path / "cells.txt").write_bytes(b"\xff\xfe k\x00i\x00")
    refused(regress("run", "configs/demo.yaml", "--cells", str(tmp_path / "cells.txt"), "--results-dir",
                    str(tmp_path / "r"), "--no-tracking"), "--cells file", "not UTF-8")


def test_an_unknown_eval_client_names_the_allowed_ones(tmp_path):
    refused(regress("eval", "--base-url", "http://127.0.0.1:9", "--client", "curl", "--results-dir",
                    str(tmp_path / "r"), "--no-tracking"), "--client", "aiohttp, openai")
