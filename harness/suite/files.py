"""Reading the files people hand the harness (suites, selection rules, simulator worlds, `--cells`,
`--changed-files`): bounded in size, decoded as UTF-8, YAML bounded in depth and in the values its
aliases expand to. Anything else is a `ConfigError` that names the file and what is wrong, before
anything is launched.

Why bounds: PyYAML shares an alias's value instead of copying it, so nine nested aliases load in
microseconds, but validating or iterating the result visits 10^9 values (the "billion laughs"); and
its composer recurses once per nesting level, so a 5,000-deep list raises RecursionError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.errors import ConfigError

MAX_BYTES = 4 * 1024 * 1024  # a suite or a list of cells is kilobytes; a 4 MiB file is a mistake
MAX_VALUES = 200_000  # values after expanding aliases (the 72-cell nightly: about 300)
MAX_DEPTH = 64  # nesting levels (the shipped suites: 5)


def read_text(path: str | Path, what: str) -> str:
    """The file's text, or a ConfigError naming `what` (e.g. "suite file", "--cells")."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{what} {path}: larger than {MAX_BYTES // (1024 * 1024)} MiB; is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{what} {path}: not UTF-8 text (byte {error.start}: {data[error.start:error.start + 1]!r});"
                          " save it as UTF-8") from None


def read_lines(path: str | Path, what: str) -> list[str]:
    """The file's non-blank lines, stripped (a list of cell ids, of changed files)."""
    return [line.strip() for line in read_text(path, what).splitlines() if line.strip()]


def load_yaml(path: str | Path, what: str) -> Any:
    """The file's YAML document, checked against MAX_DEPTH and MAX_VALUES."""
    return parse_yaml(read_text(path, what), path)


def parse_yaml(text: str, path: str | Path) -> Any:
    """`text` (read from `path`) as YAML, checked against MAX_DEPTH and MAX_VALUES."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader (below)
    except _DuplicateKey as error:
        raise ConfigError(f"{path}: {error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        if "maximum nesting depth" in problem:  # libyaml's own limit (1,000 levels)
            raise _too_deep(path) from None
        raise ConfigError(f"{path}: YAML syntax error{where}: {problem.splitlines()[0]}") from None
    except RecursionError:  # PyYAML's Python composer recurses once per level
        raise _too_deep(path) from None
    _check_bounds(data, path)
    return data


def _too_deep(path: str | Path) -> ConfigError:
    """One refusal for nesting past MAX_DEPTH, whether the parser's own limit or the walk finds it."""
    return ConfigError(f"{path}: nested deeper than {MAX_DEPTH} levels")


class _DuplicateKey(ValueError):
    pass


def _unique_key_loader(base: type) -> type:
    """`base` (a safe loader) refusing a key given twice in one mapping: PyYAML keeps the last
    silently, so a second `gate:` further down a suite would replace the first without a word."""

    class UniqueKeyLoader(base):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    if key in seen:
                        raise _DuplicateKey(f"key {key!r} appears twice in one mapping (lines {seen[key] + 1} "
                                            f"and {key_node.start_mark.line + 1}); keep one")
                    seen[key] = key_node.start_mark.line
                except TypeError:  # an unhashable key: the constructor below says so
                    break
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


# libyaml's parser where PyYAML was built with it (its wheels are): 0.6 ms against 5.4 ms for the
# nightly suite (docs/benchmarks.md); the same safe constructor and resolver either way.
_UniqueKeyLoader = _unique_key_loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _check_bounds(data: Any, path: str | Path) -> None:
    """Walk the document as a validator would (shared values visited every time they are used)."""
    count = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(f"{path}: more than {MAX_VALUES:,} values once its YAML aliases are expanded "
                              "(an alias bomb?); write the values out")
        if depth > MAX_DEPTH:
            raise _too_deep(path)
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for pair in value.items() for item in pair)
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
