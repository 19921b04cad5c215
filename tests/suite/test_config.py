"""Suite validation: every bad input is refused with the key path and the allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.suite.config import load_suite

GOOD = """
suite: t
engine: sim
sim_world: configs/sim/incident.yaml
models:
  - {id: m, path: deepseek-ai/DeepSeek-V2-Lite-Chat, tp: 1, floor: 0.8}
axes:
  attention_backend: [fa3, triton]
  radix_cache: [on, off]
"""


def refused(tmp_path: Path, text: str) -> str:
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_suite(path)
    return str(caught.value)


def test_the_shipped_suites_validate():
    for name in ("demo", "nightly", "pr"):
        assert load_suite(Path("configs") / f"{name}.yaml").suite.suite == name


def test_good_suite_loads_and_normalises_switches(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(GOOD)
    loaded = load_suite(path)
    assert loaded.suite.axes["radix_cache"] == ["on", "off"]  # YAML booleans become on/off
    assert len(loaded.sha256) == 64


def test_unknown_key_names_the_key_and_suggests(tmp_path):
    message = refused(tmp_path, GOOD + "num_question: 10\n")
    assert "num_question" in message and "did you mean 'num_questions'" in message


def test_unknown_nested_key_has_the_path(tmp_path):
    message = refused(tmp_path, GOOD.replace("floor: 0.8}", "flor: 0.8}"))
    assert "models[0].flor" in message and "did you mean 'floor'" in message


def test_wrong_type_names_key_and_value(tmp_path):
    message = refused(tmp_path, GOOD.replace("tp: 1", "tp: two"))
    assert "models[0].tp" in message and "'two'" in message


def test_unknown_attention_backend_lists_allowed(tmp_path):
    message = refused(tmp_path, GOOD.replace("[fa3, triton]", "[fa33, triton]"))
    assert "axes.attention_backend" in message and "'fa33'" in message
    assert "flashinfer" in message and "did you mean 'fa3'" in message


def test_empty_axis(tmp_path):
    assert "non-empty list" in refused(tmp_path, GOOD.replace("[on, off]", "[]"))


def test_duplicate_model(tmp_path):
    text = GOOD.replace("axes:", "  - {id: m, path: other}\naxes:")
    assert "duplicate model id 'm'" in refused(tmp_path, text)


def test_threshold_outside_unit_interval(tmp_path):
    assert "models[0].floor" in refused(tmp_path, GOOD.replace("floor: 0.8", "floor: 1.5"))


def test_unknown_protocol_names_the_benchmarks_protocols(tmp_path):
    """The suite names a benchmark and one of its protocols; both are checked where the run is built."""
    from harness.run.build import load_matrix

    path = tmp_path / "suite.yaml"
    path.write_text(GOOD + "protocol: gsm8k-cot\n")
    with pytest.raises(ConfigError, match=r"^protocol: unknown protocol 'gsm8k-cot' of benchmark gsm8k; allowed: "
                                          r"clean, sglang-fewshot, sglang-run-eval, chat, mixed-prefix, sgl-eval$"):
        load_matrix(path, None)
    path.write_text(GOOD + "benchmark: mmlu\n")
    with pytest.raises(ConfigError, match=r"^benchmark: unknown benchmark 'mmlu'; available: gsm8k$"):
        load_matrix(path, None)


@pytest.mark.parametrize("key", ["num_questions", "concurrency"])
def test_non_positive_counts(tmp_path, key):
    assert key in refused(tmp_path, GOOD + f"{key}: 0\n")


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    message = refused(tmp_path, GOOD + "axes: [unclosed\n")
    assert "line" in message and "column" in message


def test_baseline_value_must_belong_to_axis(tmp_path):
    message = refused(tmp_path, GOOD + "baseline: {attention_backend: flashinfer}\n")
    assert "baseline.attention_backend" in message and "fa3, triton" in message


def test_exclude_rule_with_unknown_factor(tmp_path):
    message = refused(tmp_path, GOOD + "exclude:\n  - {radix: off, reason: x}\n")
    assert "exclude[0].radix" in message and "did you mean 'radix_cache'" in message


def test_custom_axis_must_be_named_flag_sets(tmp_path):
    message = refused(tmp_path, GOOD + "  overlap: [tbo]\n")
    assert "axes.overlap" in message and "--enable-two-batch-overlap" in message


def test_a_custom_axis_value_sets_flags_and_env_and_is_stored_in_one_form(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(GOOD + "  jit: {none: [], dg: {env: {SGLANG_ENABLE_JIT_DEEPGEMM: '1'}}, "
                           "tbo: [--enable-two-batch-overlap]}\n")
    assert load_suite(path).suite.axes["jit"] == {
        "none": {"flags": [], "env": {}}, "dg": {"flags": [], "env": {"SGLANG_ENABLE_JIT_DEEPGEMM": "1"}},
        "tbo": {"flags": ["--enable-two-batch-overlap"], "env": {}}}


@pytest.mark.parametrize(("value", "said"), [
    ("{envs: {A: '1'}}", "axes.jit.dg.envs: unknown key; allowed: flags, env (did you mean 'env'?)"),
    ("{env: {A: 1}}", "axes.jit.dg.env: must map variable names"),
    ("{env: {'A-B': '1'}}", "axes.jit.dg.env: must map variable names"),
    ("{flags: --x}", "axes.jit.dg: must be a list of flag strings"),
])
def test_a_bad_custom_axis_value_names_its_key(tmp_path, value, said):
    message = refused(tmp_path, GOOD + f"  jit: {{none: [], dg: {value}}}\n")
    assert said in message, message


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read suite file"):
        load_suite(tmp_path / "absent.yaml")


def test_a_gate_that_tolerates_the_drop_it_must_catch_is_refused(tmp_path):
    message = refused(tmp_path, GOOD + "gate: {tolerance: 0.03, min_effect: 0.03}\n")
    assert "gate" in message and "tolerance (0.03) must be below min_effect (0.03)" in message


def test_the_old_early_stop_key_says_what_replaced_it(tmp_path):
    message = refused(tmp_path, GOOD + "gate: {early_stop_alpha: 0.001}\n")
    assert "early_stop_alpha was replaced by early_stop_share" in message


@pytest.mark.parametrize("value", ["../../../../../ESCAPED", "a/b", ".hidden", "x" * 65, "tab\there"])
def test_a_custom_axis_value_that_could_leave_the_results_folder_is_refused(tmp_path, value):
    """Cell ids are file names: a custom value with a path separator wrote outside the results folder."""
    message = refused(tmp_path, GOOD + f"  overlap: {{none: [], {value!r}: [--enable-two-batch-overlap]}}\n")
    assert "axes.overlap: value" in message and "cell ids name files" in message


def test_a_custom_axis_name_is_checked_too(tmp_path):
    message = refused(tmp_path, GOOD + "  Over/lap: {none: [], tbo: [--enable-two-batch-overlap]}\n")
    assert "axes.'Over/lap'" in message and "custom axis name" in message
    load_suite_ok = tmp_path / "ok.yaml"
    load_suite_ok.write_text(GOOD + "  overlap: {none: [], tbo-2.x: [--enable-two-batch-overlap]}\n")
    assert load_suite(load_suite_ok).suite.suite == "t"


def test_a_floor_follows_the_models_accuracy_and_a_far_floor_is_warned_about(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("floor: 0.8}", "accuracy: 0.72}"))
    suite = load_suite(path).suite
    assert suite.models[0].floor == 0.69 and suite.warnings() == []
    path.write_text(GOOD.replace("floor: 0.8}", "accuracy: 0.72, floor: 0.60}"))
    (warning,) = load_suite(path).suite.warnings()
    assert "models.m.floor 0.60 sits 12 pts under its accuracy 0.72" in warning and "regress calibrate" in warning
    # The shipped suites derive their floors: none warns.
    assert all(not load_suite(Path("configs") / f"{name}.yaml").suite.warnings() for name in ("demo", "nightly", "pr"))


def test_a_history_margin_must_stay_below_min_effect(tmp_path):
    message = refused(tmp_path, GOOD + "gate: {history_margin: 0.03, min_effect: 0.03}\n")
    assert "history_margin (0.03) must be below min_effect (0.03)" in message
