"""The bad-input corpus: ~100 suites a tester would write by mistake or on purpose (wrong types,
unknown keys, extreme numbers, unicode and path characters in names and axis values, alias bombs,
non-UTF-8 and binary files), each fed to `regress plan`, which validates a suite exactly as `run`
does before anything is launched. Each must end in one `error:` line with exit 2 and no traceback;
the few that are valid on purpose (tp 3, a count past the split) must plan with exit 0.

In-process (CliRunner): the corpus costs seconds, not a Python start-up per input."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from tests.helpers import ROOT

DEMO: dict[str, Any] = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
DEMO["sim_world"] = str(ROOT / "configs" / "sim" / "incident.yaml")  # plans from any folder


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A mutation that sets `a.b.0.c` (list indices as numbers) to `value`, creating maps on the way."""
    def mutate(suite: dict) -> None:
        *parents, last = [int(part) if part.isdigit() else part for part in path.split(".")]
        node: Any = suite
        for part in parents:
            node = node[part] if isinstance(part, int) else node.setdefault(part, {})
        node[last] = value
    return mutate


def _drop(path: str) -> Callable[[dict], None]:
    def mutate(suite: dict) -> None:
        *parents, last = path.split(".")
        node = suite
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[last]
    return mutate


NAN, INF = float("nan"), float("inf")
REFUSED, ACCEPTED = "refused", "accepted"

# name -> (mutation of the demo suite, expected)
MUTATIONS: dict[str, tuple[Callable[[dict], None], str]] = {
    **{f"suite={value!r}": (_set("suite", value), REFUSED)
       for value in (None, 123, "", "../x", "a/b", "demo\nx", ["demo"], "x" * 300, ".hidden", "a b")},
    **{f"engine={value!r}": (_set("engine", value), REFUSED) for value in ("vllm", None, 5, "")},
    **{f"sim_world={value!r}": (_set("sim_world", value), REFUSED)
       for value in ("nope.yaml", "/etc/passwd", 5, "/")},
    "cluster=str": (_set("cluster", "local"), REFUSED),
    **{f"cluster.gpus={value!r}": (_set("cluster.gpus", value), REFUSED)
       for value in (-1, 10**12, "eight", 2.5, None, NAN, True)},
    # Valid for a suite that names a cluster (`address`); `run` refuses it on a local Ray (no node fits).
    "cluster.gpus=0": (_set("cluster.gpus", 0), ACCEPTED),
    "cluster.address=5": (_set("cluster.address", 5), REFUSED),
    "cluster.unknown": (_set("cluster.nodes", 3), REFUSED),
    **{f"protocol={value!r}": (_set("protocol", value), REFUSED) for value in ("nope", 5, None)},
    **{f"num_questions={value!r}": (_set("num_questions", value), REFUSED)
       for value in (0, -1, "many", 1.5, True, INF, "200")},
    "num_questions=None (every test question)": (_set("num_questions", None), ACCEPTED),
    "num_questions=10**12 (every test question)": (_set("num_questions", 10**12), ACCEPTED),
    **{f"seed={value!r}": (_set("seed", value), REFUSED) for value in (-1, "x", 2**70, 0.5)},
    **{f"concurrency={value!r}": (_set("concurrency", value), REFUSED) for value in (0, -5, 10**9, "x")},
    **{f"stop_grace_s={value!r}": (_set("stop_grace_s", value), REFUSED) for value in (-1, "x", NAN, INF)},
    "gate=str": (_set("gate", "strict"), REFUSED),
    **{f"gate.alpha={value!r}": (_set("gate.alpha", value), REFUSED) for value in (0, 1.5, -0.1, NAN, INF, "x")},
    **{f"gate.tolerance={value!r}": (_set("gate.tolerance", value), REFUSED) for value in (-1, 2, NAN)},
    **{f"gate.min_effect={value!r}": (_set("gate.min_effect", value), REFUSED) for value in (5, -0.1, NAN)},
    **{f"gate.extend_to={value!r}": (_set("gate.extend_to", value), REFUSED) for value in (-1, "all", 0, True)},
    "gate.extend_to=10**12 (the whole split)": (_set("gate.extend_to", 10**12), ACCEPTED),
    "gate.unknown": (_set("gate.strict", True), REFUSED),
    **{f"models={value!r}": (_set("models", value), REFUSED) for value in ([], None, "kimi", [{}], [None], 5)},
    **{f"model.id={value!r}": (_set("models.0.id", value), REFUSED)
       for value in ("../x", "a/b", "", "a b", None, 7, "x" * 300, "deepseek-v2-lite")},  # the last: a duplicate
    "model.id=unicode": (_set("models.0.id", "kimi-линейная"), REFUSED),  # ids are ASCII: they name files
    **{f"model.path={value!r}": (_set("models.0.path", value), REFUSED) for value in ("", None, 5)},
    **{f"model.tp={value!r}": (_set("models.0.tp", value), REFUSED) for value in (0, -1, 1000, "two", 1.5)},
    "model.tp=3": (_set("models.0.tp", 3), ACCEPTED),
    **{f"model.accuracy={value!r}": (_set("models.0.accuracy", value), REFUSED)
       for value in (1.5, -1, "high", NAN)},
    "model.trust_remote_code=str": (_set("models.0.trust_remote_code", "maybe"), REFUSED),
    **{f"model.extra_args={value!r}": (_set("models.0.extra_args", value), REFUSED)
       for value in ("--x", [5], [None], [["--x"]])},
    **{f"model.startup_timeout_s={value!r}": (_set("models.0.startup_timeout_s", value), REFUSED)
       for value in (-1, 0, "x", NAN)},
    "model.unknown": (_set("models.0.weights", "x"), REFUSED),
    "model.no_path": (_drop("models.0.path"), REFUSED),
    **{f"axes={value!r}": (_set("axes", value), REFUSED) for value in (None, "x", [1, 2], {"": ["a"]})},
    **{f"axes.attention_backend={value!r}": (_set("axes.attention_backend", value), REFUSED)
       for value in ([], ["nope"], "fa3", [None], [5], ["fa3", "fa3"], ["../x"])},
    **{f"axes.unified_memory={value!r}": (_set("axes.unified_memory", value), REFUSED)
       for value in (["maybe"], [], ["on", "on"])},
    **{f"axes.radix_cache={value!r}": (_set("axes.radix_cache", value), REFUSED) for value in ([1, 2], ["yes!"])},
    **{f"custom axis name {name!r}": (_set(f"axes.{name}", ["a", "b"]), REFUSED)
       for name in ("../x", "a b", "x/y", "é\u202e")},
    **{f"custom axis value {value!r}": (_set("axes.page_size", ["16", value]), REFUSED)
       for value in ("../../../../../ESCAPED", "a/b", "a\nb", "", None, "x" * 300, "`rm -rf`")},
    **{f"baseline={value!r}": (_set("baseline", value), REFUSED)
       for value in ({"attention_backend": "nope"}, "x", [1], {"nope": "a"}, {"radix_cache": "maybe"})},
    "unknown top-level key": (_set("nightly", True), REFUSED),
    "no models key": (_drop("models"), REFUSED),
    "no suite key": (_drop("suite"), REFUSED),
}

# name -> raw file bytes (documents that are not a suite at all)
RAW: dict[str, bytes] = {
    "empty": b"", "a list": b"- a\n- b\n", "a number": b"42\n", "null": b"null\n", "a string": b"just text\n",
    "broken yaml": b"suite: [demo\n", "tabs": b"suite:\tdemo\n\tengine: sim\n", "braces": b"{{{{\n",
    "a duplicated key": yaml.safe_dump(DEMO).encode() + b"suite: again\n",
    "nul bytes": b"suite: de\x00mo\n", "utf-16": "suite: demo\n".encode("utf-16"),
    "latin-1": "suite: café\n".encode("latin-1"), "binary": bytes(range(256)) * 8,
    "a python tag": b"suite: !!python/object/apply:os.system ['true']\n",
    "alias bomb": b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n".encode() for i in range(8)),
    "5,000 deep": b"x: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "5 MiB": yaml.safe_dump(DEMO).encode() + b"#" * (5 << 20),
}


def _suite_text(mutation: Callable[[dict], None]) -> bytes:
    suite = copy.deepcopy(DEMO)
    mutation(suite)
    return yaml.safe_dump(suite, allow_unicode=True).encode()


def _plan(path: Path) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(app, ["plan", str(path)])
    exception = result.exception if not isinstance(result.exception, SystemExit) else None
    return result.exit_code, result.output, exception


def _one_error(name: str, output: str) -> None:
    """One `error:` line; several problems of one suite are a header and a `  - ` line each."""
    first, *rest = output.strip().splitlines()
    assert first.startswith("error: "), f"{name}: {output}"
    assert (not rest) or ("problems)" in first and all(line.startswith("  - ") for line in rest)), f"{name}: {output}"


def test_the_corpus_is_large_enough_to_mean_something():
    assert len(MUTATIONS) + len(RAW) >= 100


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_bad_suite_gets_one_line_and_exit_2(name, tmp_path):
    mutation, expected = MUTATIONS[name]
    path = tmp_path / "suite.yaml"
    path.write_bytes(_suite_text(mutation))
    code, output, exception = _plan(path)
    assert exception is None, f"{name}: {type(exception).__name__}: {exception}"
    if expected == ACCEPTED:
        assert code == 0, f"{name}: {output}"
        return
    assert code == 2, f"{name}: exit {code}\n{output}"
    _one_error(name, output)


@pytest.mark.parametrize("name", sorted(RAW))
def test_a_file_that_is_no_suite_gets_one_line_and_exit_2(name, tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_bytes(RAW[name])
    code, output, exception = _plan(path)
    assert exception is None, f"{name}: {type(exception).__name__}: {exception}"
    assert code == 2, f"{name}: exit {code}\n{output}"
    _one_error(name, output)
