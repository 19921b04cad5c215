"""The plan-time check against the real sglang 0.5.23 release (installed CPU-only by `make sglang-env`):
every shipped suite passes it, and a cell sglang refuses is named with sglang's own message."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest
import yaml

from harness.engine.check import check_cells
from harness.suite.config import load_suite
from harness.suite.matrix import Matrix, expand, select
from tests.helpers import ROOT

SGLANG_PYTHON = ROOT / ".sglang-0.5.23" / "bin" / "python"
pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def sglang_python() -> str:
    assert SGLANG_PYTHON.exists(), "the pinned sglang is missing: `make sglang-env` installs it (make test does)"
    return str(SGLANG_PYTHON)


def shipped(suite: str, _: Path) -> tuple[Path, str | None]:
    return ROOT / "configs" / f"{suite}.yaml", None


def with_two_batch_overlap_at_tp_1(folder: Path) -> tuple[Path, str | None]:
    """The nightly matrix before this check: two-batch overlap at tp 1 without attention DP."""
    suite = yaml.safe_load((ROOT / "configs" / "nightly.yaml").read_text())
    suite["axes"]["wrapper"]["two-batch-overlap"] = ["--enable-two-batch-overlap"]
    (folder / "nightly.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return folder / "nightly.yaml", "model=deepseek-v2-lite,attention_backend=triton,wrapper=two-batch-overlap"


def with_an_unknown_flag(folder: Path) -> tuple[Path, str | None]:
    (folder / "s.yaml").write_text("suite: s\nengine: sglang\nmodels: [{id: m, path: deepseek-ai/DeepSeek-V2-Lite-Chat, "
                                   "extra_args: [--no-such-flag]}]\n")
    return folder / "s.yaml", None


SUITES = {"nightly": partial(shipped, "nightly"), "pr": partial(shipped, "pr"),
          "two-batch-overlap": with_two_batch_overlap_at_tp_1, "unknown-flag": with_an_unknown_flag}


@pytest.fixture(scope="module")
def checks(sglang_python, tmp_path_factory) -> dict[str, tuple[list, dict]]:
    """name -> (the suite's cells, what the pinned sglang says of each) for every suite in SUITES:
    one check process each (sglang's import, ~7-10 s of CPU, is paid once per check), two side by
    side, for every test here that reads them."""
    def check(name: str) -> tuple[list, dict]:
        path, selection = SUITES[name](tmp_path_factory.mktemp(name))
        loaded = load_suite(path)
        cells = list(select(expand(loaded.suite), selection).cells)
        return cells, {c.cell_id: c for c in check_cells(sglang_python, loaded, cells)}

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(SUITES, pool.map(check, SUITES), strict=True))


@pytest.mark.parametrize("suite", ["nightly", "pr"])
def test_every_shipped_sglang_suite_passes_the_real_sglang_check(checks, suite):
    cells, checked = checks[suite]
    assert sorted(checked) == sorted(c.cell_id for c in cells)
    assert {c.sglang_version for c in checked.values()} == {"0.5.23"}
    assert [c.cell_id for c in checked.values() if c.refused] == []
    assert all(c.stage == "check" for c in checked.values())  # argparse, the whole resolution and its checks
    for cell in cells:  # what each cell asked for is what sglang resolves
        predicted = checked[cell.cell_id].predicted
        assert {k: v for k, v in cell.expected.items() if k in predicted} == {
            k: predicted[k] for k in cell.expected if k in predicted}, cell.cell_id


def test_sglang_picks_fa3_for_kimi_linear_on_an_h200_when_no_backend_is_asked(checks):
    cells, checked = checks["nightly"]
    chosen = select(Matrix(tuple(cells), ()), "model=kimi-linear,attention_backend=default,chunked_prefill=default,"
                                              "wrapper=none,unified_memory=off,radix_cache=on")
    default = next(c for c in chosen.cells if c.factors["attention_backend"] == "default")
    assert checked[default.cell_id].predicted["attention_backend"] == "fa3"
    assert checked[default.cell_id].predicted["mamba_radix_cache_strategy"] == "extra_buffer"


def test_a_cell_sglang_refuses_carries_its_message(checks):
    """The nightly matrix before this check: two-batch overlap at tp 1 without attention DP."""
    _, checked = checks["two-batch-overlap"]
    refused = [c for c in checked.values() if c.refused]
    assert len(refused) == 4 and all(c.stage == "check" for c in refused)
    assert all("two batch overlap without an EP a2a backend" in c.refused and "attention DP" in c.refused
               for c in refused)
    assert not checked["deepseek-v2-lite.ab-triton.um-off.rc-on.cp-default.wrapper-none"].refused  # its reference


def test_an_unknown_flag_is_refused_at_argparse(checks):
    (checked,) = checks["unknown-flag"][1].values()
    assert checked.stage == "argparse" and "unrecognized arguments: --no-such-flag" in checked.refused


def test_the_predicted_fields_come_from_the_axis_registry(sglang_python, tmp_path: Path):
    """A registered axis's field is predicted with no list to keep in step (deterministic inference
    was missing from the hand-kept one)."""
    from harness.engine.verify import predicted_fields
    from harness.suite.axes import SwitchAxis, registered

    assert "enable_deterministic_inference" in predicted_fields()
    with registered(SwitchAxis("mixed_chunk", "mc", "--enable-mixed-chunk", "enable_mixed_chunk")):
        assert "enable_mixed_chunk" in predicted_fields()
        (tmp_path / "s.yaml").write_text(
            "suite: s\nengine: sglang\nmodels: [{id: m, path: moonshotai/Kimi-Linear-48B-A3B-Instruct, tp: 2, "
            "trust_remote_code: true}]\naxes: {mixed_chunk: [on], deterministic_inference: [off]}\n")
        loaded = load_suite(tmp_path / "s.yaml")
        (checked,) = check_cells(sglang_python, loaded, list(expand(loaded.suite).cells))
    assert checked.refused is None and checked.stage == "check", checked
    assert checked.predicted["enable_mixed_chunk"] is True
    assert checked.predicted["enable_deterministic_inference"] is False

