"""Matrix expansion: cells, ids, flags, expectations, references, rules and selection."""

from __future__ import annotations

import pytest

from harness.errors import ConfigError
from harness.suite.config import Suite
from harness.suite.matrix import expand, select


def suite(**overrides) -> Suite:
    data = {
        "suite": "t", "engine": "sglang",
        "models": [{"id": "kimi", "path": "moonshotai/Kimi-Linear-48B-A3B-Instruct", "tp": 2},
                   {"id": "dsv2", "path": "deepseek-ai/DeepSeek-V2-Lite-Chat", "tp": 1}],
        "axes": {"attention_backend": ["fa3", "flashinfer", "flashmla", "triton"], "unified_memory": ["off", "on"],
                 "radix_cache": ["on", "off"]},
        "baseline": {"attention_backend": "triton"},
    }
    data.update(overrides)
    return Suite.model_validate(data)


def test_demo_shape_expands_to_32_cells_with_stable_ids():
    matrix = expand(suite())
    assert len(matrix.cells) == 32
    assert len({c.cell_id for c in matrix.cells}) == 32
    assert [c.cell_id for c in expand(suite()).cells] == [c.cell_id for c in matrix.cells]
    assert "kimi.ab-fa3.um-on.rc-on" in matrix.by_id()


def test_flags_and_expectations_follow_the_factors():
    cell = expand(suite()).by_id()["kimi.ab-fa3.um-on.rc-off"]
    assert cell.flags == ("--attention-backend", "fa3", "--enable-unified-memory", "--disable-radix-cache")
    assert cell.expected == {"tp_size": 2, "attention_backend": "fa3", "enable_unified_memory": True,
                             "disable_radix_cache": True}


def test_default_backend_passes_no_flag_and_expects_nothing():
    matrix = expand(suite(axes={"attention_backend": ["default", "fa3"]}, baseline={}))
    cell = matrix.by_id()["kimi.ab-default"]
    assert cell.flags == () and "attention_backend" not in cell.expected


def test_chunked_prefill_values():
    matrix = expand(suite(axes={"chunked_prefill": ["off", 4096, "default"]}, baseline={}))
    cells = matrix.by_id()
    assert cells["dsv2.cp-off"].flags == ("--chunked-prefill-size", "-1")
    assert cells["dsv2.cp-4096"].expected["chunked_prefill_size"] == 4096
    assert cells["dsv2.cp-default"].flags == ()


def test_custom_axis_adds_its_flag_set():
    matrix = expand(suite(axes={"overlap": {"none": [], "tbo": ["--enable-two-batch-overlap"]}}, baseline={}))
    assert matrix.by_id()["dsv2.overlap-tbo"].flags == ("--enable-two-batch-overlap",)
    assert matrix.by_id()["dsv2.overlap-tbo"].env == {}


def test_a_custom_axis_value_can_set_the_servers_environment():
    """sglang reads many switches from SGLANG_* variables: a custom axis value may set them, over the
    model's env, with or without flags; the reference (first value) gets none of them."""
    models = [{"id": "dsv2", "path": "deepseek-ai/DeepSeek-V2-Lite-Chat", "env": {"A": "model", "B": "model"}}]
    matrix = expand(suite(models=models, baseline={}, axes={
        "radix_cache": ["off", "on"],
        "jit": {"none": [], "deepgemm": {"env": {"B": "axis", "SGLANG_ENABLE_JIT_DEEPGEMM": "1"}},
                "both": {"flags": ["--enable-two-batch-overlap"], "env": {"C": "axis"}}}}))
    cells = matrix.by_id()
    deepgemm = cells["dsv2.rc-on.jit-deepgemm"]
    assert deepgemm.flags == () and deepgemm.env == {"B": "axis", "SGLANG_ENABLE_JIT_DEEPGEMM": "1"}
    assert deepgemm.reference_cell == "dsv2.rc-off.jit-none" and cells["dsv2.rc-off.jit-none"].env == {}
    both = cells["dsv2.rc-on.jit-both"]
    assert both.flags == ("--enable-two-batch-overlap",) and both.env == {"C": "axis"}
    assert both.expected["enable_two_batch_overlap"] is True  # flags are verified as before; env cannot be


def test_reference_cells_come_first_and_pair_by_model():
    matrix = expand(suite())
    references = [c for c in matrix.cells if c.is_reference]
    assert [c.cell_id for c in references] == ["kimi.ab-triton.um-off.rc-on", "dsv2.ab-triton.um-off.rc-on"]
    assert matrix.cells[:2] == tuple(references)
    assert matrix.by_id()["dsv2.ab-fa3.um-on.rc-on"].reference_cell == "dsv2.ab-triton.um-off.rc-on"


def test_exclude_rule_skips_with_reason():
    matrix = expand(suite(exclude=[{"model": "dsv2", "unified_memory": "on", "reason": "hybrid only"}]))
    assert len(matrix.cells) == 24 and len(matrix.skipped) == 8
    assert {s.reason for s in matrix.skipped} == {"hybrid only"}


def test_include_rule_keeps_only_matching_cells():
    matrix = expand(suite(include=[{"attention_backend": ["triton", "fa3"], "radix_cache": "on"}]))
    assert all(c.factors["radix_cache"] == "on" for c in matrix.cells)
    assert len(matrix.cells) == 8


def test_excluding_a_reference_cell_is_a_config_error():
    with pytest.raises(ConfigError, match="reference cell kimi.ab-triton.um-off.rc-on"):
        expand(suite(exclude=[{"model": "kimi", "attention_backend": "triton"}]))


def test_auto_expands_to_the_accepted_backends():
    matrix = expand(suite(axes={"attention_backend": ["triton", "auto"]}, baseline={}),
                    attention_backends=("triton", "fa3", "flashinfer"))
    assert [c.factors["attention_backend"] for c in matrix.cells if c.model.id == "dsv2"] == [
        "triton", "fa3", "flashinfer"]


def test_select_by_factors_keeps_references():
    matrix = select(expand(suite()), "model=dsv2,attention_backend=fa3,unified_memory=on")
    assert {c.cell_id for c in matrix.cells} == {"dsv2.ab-fa3.um-on.rc-on", "dsv2.ab-fa3.um-on.rc-off",
                                                 "dsv2.ab-triton.um-off.rc-on"}


def test_select_by_glob_and_errors():
    assert len(select(expand(suite()), "kimi.*.um-on.rc-on").cells) == 4 + 1
    with pytest.raises(ConfigError, match="selects no cell"):
        select(expand(suite()), "nothing*")
    with pytest.raises(ConfigError, match="did you mean 'radix_cache'"):
        select(expand(suite()), "radix=on")
