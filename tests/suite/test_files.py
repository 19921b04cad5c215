"""The YAML reader (harness.suite.files) behaves the same on libyaml's parser, which it uses where
PyYAML has it, and on PyYAML's Python parser, which it falls back to."""

from __future__ import annotations

import pytest
import yaml

from harness.errors import ConfigError
from harness.suite import files
from tests.helpers import ROOT

LOADERS = {"libyaml": yaml.CSafeLoader, "python": yaml.SafeLoader}


@pytest.fixture(params=sorted(LOADERS))
def parser(request, monkeypatch):
    monkeypatch.setattr(files, "_UniqueKeyLoader", files._unique_key_loader(LOADERS[request.param]))
    return request.param


def refusal(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        files.parse_yaml(text, "suite.yaml")
    return str(caught.value)


def test_the_shipped_nightly_suite_reads_the_same_either_way(parser):
    text = (ROOT / "configs" / "nightly.yaml").read_text()
    assert files.parse_yaml(text, "nightly.yaml") == yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506


def test_a_key_given_twice_is_refused_with_both_lines(parser):
    assert refusal("suite: a\ngate:\n  alpha: 0.01\nsuite: b\n") == (
        "suite.yaml: key 'suite' appears twice in one mapping (lines 1 and 4); keep one")


def test_a_syntax_error_names_its_line_and_column(parser):
    assert refusal("suite: a\naxes: [unclosed\nb: 1\n").startswith("suite.yaml: YAML syntax error at line ")


@pytest.mark.parametrize("text", ["x: " + "[" * 5000 + "]" * 5000, "x:\n" + "".join(" " * i + "- \n" for i in range(1, 2000))],
                         ids=["flow", "block"])
def test_nesting_past_what_the_parser_follows_is_one_line(parser, text):
    assert refusal(text) == "suite.yaml: nested deeper than 64 levels"
