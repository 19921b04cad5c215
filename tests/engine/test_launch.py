"""The exact argv, environment and mismatch logic for every cell of the nightly suite."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from harness.engine.launch import EngineRoutes, LaunchSpec
from harness.engine.verify import mismatches
from harness.sim.args import build_parser
from harness.suite.config import load_suite
from harness.suite.matrix import expand
from tests.helpers import machine_s

NIGHTLY = load_suite("configs/nightly.yaml").suite
CELLS = expand(NIGHTLY).cells

# Written out independently of harness.suite.matrix, from the README's table of axes.
AXIS_FLAGS = {
    ("attention_backend", "default"): [],
    ("unified_memory", "on"): ["--enable-unified-memory"], ("unified_memory", "off"): [],
    ("radix_cache", "on"): [], ("radix_cache", "off"): ["--disable-radix-cache"],
    ("chunked_prefill", "default"): [], ("chunked_prefill", "off"): ["--chunked-prefill-size", "-1"],
    ("wrapper", "none"): [],
    ("wrapper", "split-fa3-flashmla"): ["--prefill-attention-backend", "fa3", "--decode-attention-backend", "flashmla"],
}


def expected_flags(factors: dict[str, str]) -> list[str]:
    flags: list[str] = []
    for axis, value in factors.items():
        if axis == "attention_backend" and value != "default":
            flags += ["--attention-backend", value]
        else:
            flags += AXIS_FLAGS[(axis, value)]
    return flags


def spec(cell, python="/opt/venv/bin/python") -> LaunchSpec:
    return LaunchSpec(engine=EngineRoutes.of("sglang"), python=python, cell=cell, seed=NIGHTLY.seed, startup_timeout_s=1200,
                      env={"SUITE_VAR": "1"})


def test_nightly_has_wrapper_cells_and_plain_backends():
    ids = [c.cell_id for c in CELLS]
    assert any("split-fa3-flashmla" in i for i in ids)
    # No two-batch-overlap cell at tp 1: sglang 0.5.23 refuses it without attention DP or an EP a2a backend.
    assert not any("two-batch-overlap" in i for i in ids)
    assert len(CELLS) == 72


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.cell_id)
def test_exact_argv_for_every_nightly_cell(cell):
    model = cell.model
    argv = spec(cell).argv(port=31000, nccl_port=31001)
    assert argv == ["/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", model.path,
                    "--host", "127.0.0.1", "--port", "31000", "--tp-size", str(model.tp), "--random-seed", "0",
                    "--nccl-port", "31001", "--enable-cache-report", "--trust-remote-code", *expected_flags(cell.factors), *model.extra_args]
    # The simulator (and so the fake sglang package) accepts exactly this command line.
    parsed = build_parser().parse_args(argv[3:])
    assert parsed.tp_size == model.tp and parsed.random_seed == 0


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.cell_id)
def test_mismatch_logic_for_every_nightly_cell(cell):
    resolved = {"attention_backend": "fa3", "disable_radix_cache": False, **cell.expected}
    assert mismatches(cell.expected, resolved) == []
    flipped = dict(resolved, disable_radix_cache=not resolved["disable_radix_cache"])
    problems = mismatches(cell.expected, flipped)
    assert problems == [f"disable_radix_cache: requested {resolved['disable_radix_cache']!r}, "
                        f"resolved {flipped['disable_radix_cache']!r}"]
    assert mismatches(cell.expected, {k: v for k, v in resolved.items() if k != "tp_size"}) == [
        f"tp_size: requested {cell.model.tp}, not reported by the server"]


def test_environment_is_suite_then_model_then_cell_and_python_defaults_to_the_driver():
    cell = CELLS[0]
    assert spec(cell).environment() == {"SUITE_VAR": "1", **cell.model.env}
    model = cell.model.model_copy(update={"env": {"SUITE_VAR": "model", "M": "model"}})
    axis_set = replace(cell, model=model, env={"M": "cell", "C": "cell"})
    assert spec(axis_set).environment() == {"SUITE_VAR": "model", "M": "cell", "C": "cell"}
    from harness.engine.launch import default_python

    assert default_python(None) == sys.executable and default_python("/x/python") == "/x/python"


def test_a_radix_label_is_exercised_or_the_cell_says_it_was_not():
    from harness.engine.verify import exercise_mismatches
    from tests.records import answers

    def served(cached: list[int | None]):
        return [r.model_copy(update={"cached_tokens": c}) for r, c in zip(answers([True] * len(cached)), cached, strict=True)]

    on, off = {"disable_radix_cache": False}, {"disable_radix_cache": True}
    assert exercise_mismatches(on, served([0, 812, 812])) == []
    assert exercise_mismatches(on, served([0, 0, 0])) == [
        "radix cache on, but none of 3 answered questions reused a cached prefix (0 cached prompt tokens): the cell "
        "did not test its label (do its prompts share a prefix?)"]
    assert exercise_mismatches(off, served([0, 0])) == []
    assert exercise_mismatches(off, served([0, 812])) == [
        "radix cache off, but 1 of 2 answered questions were served cached prompt tokens (812 in all)"]
    assert exercise_mismatches(on, served([None, None, None])) == []  # not reported: nothing claimed
    assert exercise_mismatches({}, served([0, 0])) == []  # no radix label


def test_the_check_stands_in_for_the_missing_submodules_of_an_importable_cuda_package(tmp_path):
    """An importable `sgl_kernel` without its CUDA submodules (a CPU build) broke a resolution that
    describes a GPU (`No module named 'sgl_kernel.quantization'`): the check stands in for what no
    file provides, and leaves what the package has alone."""
    import subprocess

    from tests.helpers import ROOT

    package = tmp_path / "sgl_kernel"
    package.mkdir()
    (package / "__init__.py").write_text("REAL = True\n")
    (package / "present.py").write_text("VALUE = 7\n")
    probe = ("from harness.engine.sglang_check import install_stand_ins\n"
             "print(install_stand_ins())\n"
             "import sgl_kernel, sgl_kernel.present\n"
             "from sgl_kernel.quantization import fp8_quant\n"
             "print(sgl_kernel.REAL, sgl_kernel.present.VALUE, type(sgl_kernel.quantization).__name__)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=machine_s(60), check=True,
                         env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"})
    wholly_missing, partial = out.stdout.strip().splitlines()
    assert "sgl_kernel" not in wholly_missing  # importable: not stood in for as a whole
    assert partial == "True 7 _StandIn"


def test_cells_share_a_check_process_when_their_environment_and_gpu_kind_are_the_same(tmp_path):
    """One sglang import per environment, not per model: the two models without an env of their own
    share one; a model's env, a custom axis's env and another GPU kind each need their own."""
    from harness.engine.check import check_groups

    (tmp_path / "s.yaml").write_text("""
suite: s
engine: sglang
models:
  - {id: a, path: deepseek-ai/DeepSeek-V2-Lite-Chat}
  - {id: b, path: moonshotai/Kimi-Linear-48B-A3B-Instruct, tp: 2}
  - {id: c, path: deepseek-ai/DeepSeek-V2-Lite-Chat, env: {X: "1"}}
  - {id: d, path: deepseek-ai/DeepSeek-V2-Lite-Chat, gpu_type: B200}
axes:
  radix_cache: [on, off]
  plant: {none: [], kv: {env: {X: "1"}}}
""")
    cells = list(expand(load_suite(tmp_path / "s.yaml").suite).cells)
    groups = {(tuple(sorted(env.items())), group[0].model.gpu_type): sorted(c.cell_id for c in group)
              for env, group in check_groups(cells, {"SUITE": "s"})}
    suite_env, with_x = (("SUITE", "s"),), (("SUITE", "s"), ("X", "1"))
    assert groups == {
        (suite_env, None): sorted(f"{m}.rc-{rc}.plant-none" for m in "ab" for rc in ("on", "off")),
        (with_x, None): sorted([f"{m}.rc-{rc}.plant-kv" for m in "ab" for rc in ("on", "off")]
                               + [f"c.rc-{rc}.plant-{p}" for rc in ("on", "off") for p in ("none", "kv")]),
        (suite_env, "B200"): ["d.rc-off.plant-none", "d.rc-on.plant-none"],
        (with_x, "B200"): ["d.rc-off.plant-kv", "d.rc-on.plant-kv"]}
