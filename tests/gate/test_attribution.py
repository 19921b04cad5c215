"""Failure attribution: the smallest shared condition of the failing cells."""

from __future__ import annotations

import itertools

from harness.gate.attribution import explain

BACKENDS = ["fa3", "flashinfer", "flashmla", "triton"]


def demo_cells():
    cells = []
    for model, backend, um, rc in itertools.product(["kimi", "dsv2"], BACKENDS, ["off", "on"], ["on", "off"]):
        cells.append({"model": model, "attention_backend": backend, "unified_memory": um, "radix_cache": rc})
    return cells


def is_incident(cell) -> bool:
    return cell["unified_memory"] == "on" and cell["radix_cache"] == "on" and cell["attention_backend"] != "triton"


def test_incident_is_explained_by_the_three_factor_condition():
    cells = demo_cells()
    failing = [c for c in cells if is_incident(c)]
    passing = [c for c in cells if not is_incident(c)]
    explanation = explain(failing, passing)
    assert explanation.exact and len(failing) == 6
    assert str(explanation) == "attention_backend in {fa3, flashinfer, flashmla} & radix_cache=on & unified_memory=on"


def test_single_model_bug_names_the_model():
    cells = demo_cells()
    failing = [c for c in cells if is_incident(c) and c["model"] == "kimi"]
    passing = [c for c in cells if c not in failing]
    assert str(explain(failing, passing)).startswith("model=kimi & ")


def test_no_exact_explanation_gives_best_cover_with_counts():
    cells = demo_cells()
    failing = [c for c in cells if c["attention_backend"] == "fa3"] + [cells[-1]]
    passing = [c for c in cells if c not in failing]
    explanation = explain(failing, passing)
    assert not explanation.exact and "covers" in str(explanation)


def test_nothing_failing_gives_nothing():
    assert explain([], demo_cells()) is None
