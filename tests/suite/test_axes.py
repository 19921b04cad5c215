"""The axis registry is the one place an axis is described: registering one makes suites accept it,
cells carry its flag and expectation, the simulator's parser accepts and reports it, and verification
checks it."""

from __future__ import annotations

import pytest

from harness.engine.verify import mismatches
from harness.errors import ConfigError
from harness.sim.args import build_parser
from harness.suite.axes import AXES, SwitchAxis, register, registered
from harness.suite.config import Suite
from harness.suite.matrix import expand

TOY = SwitchAxis("mixed_chunk", "mc", "--enable-mixed-chunk", "enable_mixed_chunk")


def suite(axes: dict) -> Suite:
    return Suite.model_validate({"suite": "t", "engine": "sglang", "models": [{"id": "m", "path": "p"}],
                                 "axes": axes})


def test_a_registered_toy_axis_flows_from_suite_to_flags_to_verification():
    with registered(TOY):
        cells = {c.cell_id: c for c in expand(suite({"mixed_chunk": ["off", True]})).cells}
        on, off = cells["m.mc-on"], cells["m.mc-off"]
        assert on.flags == ("--enable-mixed-chunk",) and off.flags == ()
        assert on.expected["enable_mixed_chunk"] is True and off.expected["enable_mixed_chunk"] is False
        parsed = vars(build_parser().parse_args(["--model-path", "p", "--enable-mixed-chunk"]))
        assert parsed["enable_mixed_chunk"] is True
        assert mismatches(on.expected, {"tp_size": 1, "enable_mixed_chunk": True}, on.flags) == []
        assert mismatches(on.expected, {"tp_size": 1, "enable_mixed_chunk": False}, on.flags) == [
            "enable_mixed_chunk: requested True, resolved False"]
    assert "mixed_chunk" not in AXES


def test_without_registration_the_name_is_a_custom_axis_and_must_map_flags():
    with pytest.raises(ValueError, match="custom axis must map value names"):
        suite({"mixed_chunk": ["off", "on"]})


def test_a_bad_value_of_a_registered_axis_names_the_allowed_values():
    with registered(TOY), pytest.raises(ValueError, match="allowed: on, off"):
        suite({"mixed_chunk": ["maybe"]})


def test_an_axis_name_is_registered_once():
    with pytest.raises(ValueError, match="registered already"):
        register(SwitchAxis("radix_cache", "rc2", "--disable-radix-cache", "disable_radix_cache"))


def test_a_default_that_an_older_server_does_not_report_is_no_mismatch():
    """sglang builds from before `--enable-unified-memory` do not report the key: an `off` cell
    passed no flag, so the key's absence means the default, not another configuration."""
    cells = {c.cell_id: c for c in expand(suite({"unified_memory": ["off", "on"]})).cells}
    old_build = {"tp_size": 1}
    off, on = cells["m.um-off"], cells["m.um-on"]
    assert mismatches(off.expected, old_build, ["--tp-size", "1", *off.flags]) == []
    assert mismatches(on.expected, old_build, ["--tp-size", "1", *on.flags]) == [
        "enable_unified_memory: requested True, not reported by the server"]
    # A build that reports the key is held to it either way.
    assert mismatches(off.expected, {"tp_size": 1, "enable_unified_memory": True}, off.flags) != []


def test_config_errors_for_registered_axes_still_say_where(tmp_path):
    from harness.suite.config import load_suite

    path = tmp_path / "s.yaml"
    path.write_text("suite: s\nengine: sglang\nmodels: [{id: m, path: p}]\naxes: {attention_backend: [fa33]}\n")
    with pytest.raises(ConfigError, match=r"axes\.attention_backend: unknown attention backend 'fa33'.*did you mean 'fa3'"):
        load_suite(path)


def test_a_choice_axis_is_one_registry_entry_and_the_simulator_takes_its_flag():
    """`kv_cache_dtype` was a plain flag of the simulator's parser: registering it as an axis replaces
    that flag (no argparse clash), cells carry it, and the simulator reports what it was given."""
    from harness.sim.args import resolve
    from harness.sim.world import World
    from harness.suite.axes import ChoiceAxis

    kv = ChoiceAxis("kv_cache_dtype", "kv", "--kv-cache-dtype", "kv_cache_dtype", choices=("auto", "fp8_e5m2"))
    with registered(kv):
        cells = {c.cell_id: c for c in expand(suite({"kv_cache_dtype": ["auto", "fp8_e5m2"]})).cells}
        fp8 = cells["m.kv-fp8_e5m2"]
        assert fp8.flags == ("--kv-cache-dtype", "fp8_e5m2") and fp8.expected == {"tp_size": 1, "kv_cache_dtype": "fp8_e5m2"}
        args = build_parser().parse_args(["--model-path", "m", *fp8.flags])
        world = World.model_validate({"models": {"m": {"accuracy": 0.9}}})
        assert resolve(args, world)["kv_cache_dtype"] == "fp8_e5m2"
        assert mismatches(fp8.expected, resolve(args, world), fp8.flags) == []
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--model-path", "m", "--kv-cache-dtype", "int3"])
        with pytest.raises(ValueError, match="allowed: default, auto, fp8_e5m2"):
            suite({"kv_cache_dtype": ["int3"]})
    assert "kv_cache_dtype" not in AXES
    assert vars(build_parser().parse_args(["--model-path", "m"]))["kv_cache_dtype"] == "auto"  # the plain flag again
