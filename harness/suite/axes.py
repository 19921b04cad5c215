"""The one registry of built-in matrix axes: everything the harness knows about an axis, in one entry.

An axis entry says which values a suite may give it, the short name in cell ids, the sglang flag a
value adds, the `/server_info` field that flag resolves to (what `verify` checks and the simulator
reports), and how the simulator's copy of sglang's parser accepts the flag. Config validation,
matrix expansion, verification and the simulator all read this table, so adding an axis is one
`register(...)` call here (plus its test):

    >>> register(SwitchAxis("mixed_chunk", "mc", "--enable-mixed-chunk", "enable_mixed_chunk"))  # doctest: +SKIP

Any other axis name in a suite is a *custom* axis: a map of value names to flag lists
(`{none: [], tbo: [--enable-two-batch-overlap]}`), verified through `REPORTED_FLAGS`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from harness.registry import Registry

# sglang's `--attention-backend` choices (server_args.py, recent versions; see shared FACTS.md).
SGLANG_ATTENTION_BACKENDS: tuple[str, ...] = (
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "dsv4", "cutlass_mla", "fa3", "fa4",
    "flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "trtllm_mha",
    "dual_chunk_flash_attn", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave",
    "intel_amx", "ascend", "intel_xpu",
)
SWITCH_VALUES = ("on", "off")


def switch_value(value: Any) -> str:
    """`on` / `off`; YAML 1.1 reads on/off/yes/no as booleans, so both spellings are accepted."""
    if value is True or value in ("on", "true", "yes"):
        return "on"
    if value is False or value in ("off", "false", "no"):
        return "off"
    raise ValueError(f"{value!r} is not a switch value; allowed: on, off")


@dataclass(frozen=True)
class Axis:
    """A built-in axis. Subclasses say how values map to flags and resolved fields."""

    name: str
    abbreviation: str
    flag: str
    server_field: str

    def value(self, raw: Any) -> str:
        """One suite value in canonical form; ValueError naming the allowed values otherwise."""
        raise NotImplementedError

    def allowed(self) -> tuple[str, ...]:
        raise NotImplementedError

    def flags(self, value: str) -> list[str]:
        raise NotImplementedError

    def expected(self, value: str) -> dict[str, Any]:
        """The server field(s) a value must resolve to (empty: the server decides)."""
        raise NotImplementedError

    def add_to_parser(self, parser: argparse.ArgumentParser, backends: list[str]) -> None:
        """Accept the flag as sglang's parser does (the simulator's copy of it)."""
        raise NotImplementedError

    def reported_flags(self) -> dict[str, tuple[str, type | None]]:
        """flag -> (server field, value type; None for a switch that reports True)."""
        raise NotImplementedError


@dataclass(frozen=True)
class BackendAxis(Axis):
    """An attention backend: `default` passes no flag, `auto` expands to what sglang accepts."""

    def value(self, raw: Any) -> str:
        if raw not in self.allowed():
            raise ValueError(f"unknown attention backend {raw!r}; allowed: {', '.join(self.allowed())}")
        return str(raw)

    def allowed(self) -> tuple[str, ...]:
        return ("default", "auto", *SGLANG_ATTENTION_BACKENDS)

    def flags(self, value: str) -> list[str]:
        return [] if value == "default" else [self.flag, value]

    def expected(self, value: str) -> dict[str, Any]:
        return {} if value == "default" else {self.server_field: value}

    def add_to_parser(self, parser: argparse.ArgumentParser, backends: list[str]) -> None:
        parser.add_argument(self.flag, dest=self.server_field, choices=backends, default=None)

    def reported_flags(self) -> dict[str, tuple[str, type | None]]:
        return {self.flag: (self.server_field, str)}


@dataclass(frozen=True)
class SwitchAxis(Axis):
    """on / off through a store-true flag; `flag_when` is the value that passes it
    (`on` for `--enable-...`, `off` for `--disable-...`)."""

    flag_when: str = "on"

    def value(self, raw: Any) -> str:
        return switch_value(raw)

    def allowed(self) -> tuple[str, ...]:
        return SWITCH_VALUES

    def flags(self, value: str) -> list[str]:
        return [self.flag] if value == self.flag_when else []

    def expected(self, value: str) -> dict[str, Any]:
        return {self.server_field: value == self.flag_when}

    def add_to_parser(self, parser: argparse.ArgumentParser, backends: list[str]) -> None:
        parser.add_argument(self.flag, dest=self.server_field, action="store_true")

    def reported_flags(self) -> dict[str, tuple[str, type | None]]:
        return {self.flag: (self.server_field, None)}


@dataclass(frozen=True)
class SizeAxis(Axis):
    """A token count: `default` passes no flag, `off` passes -1 (sglang's "disabled"), or a size."""

    def value(self, raw: Any) -> str:
        if raw in ("off", False):
            return "off"
        if raw == "default":
            return "default"
        if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
            return str(raw)
        raise ValueError(f"{raw!r} is not allowed; allowed: off, default, or a positive token count")

    def allowed(self) -> tuple[str, ...]:
        return ("off", "default", "<tokens>")

    def _size(self, value: str) -> int:
        return -1 if value == "off" else int(value)

    def flags(self, value: str) -> list[str]:
        return [] if value == "default" else [self.flag, str(self._size(value))]

    def expected(self, value: str) -> dict[str, Any]:
        return {} if value == "default" else {self.server_field: self._size(value)}

    def add_to_parser(self, parser: argparse.ArgumentParser, backends: list[str]) -> None:
        parser.add_argument(self.flag, dest=self.server_field, type=int, default=None)

    def reported_flags(self) -> dict[str, tuple[str, type | None]]:
        return {self.flag: (self.server_field, int)}


@dataclass(frozen=True)
class ChoiceAxis(Axis):
    """One of a fixed set of flag values (`--kv-cache-dtype fp8_e5m2`); `default` passes no flag."""

    choices: tuple[str, ...] = ()

    def value(self, raw: Any) -> str:
        if raw not in self.allowed():
            raise ValueError(f"{raw!r} is not allowed; allowed: {', '.join(self.allowed())}")
        return str(raw)

    def allowed(self) -> tuple[str, ...]:
        return ("default", *self.choices)

    def flags(self, value: str) -> list[str]:
        return [] if value == "default" else [self.flag, value]

    def expected(self, value: str) -> dict[str, Any]:
        return {} if value == "default" else {self.server_field: value}

    def add_to_parser(self, parser: argparse.ArgumentParser, backends: list[str]) -> None:
        parser.add_argument(self.flag, dest=self.server_field, choices=self.choices, default=None)

    def reported_flags(self) -> dict[str, tuple[str, type | None]]:
        return {self.flag: (self.server_field, str)}


AXES: Registry[Axis] = Registry("axis")


def register(axis: Axis) -> Axis:
    """Add a built-in axis. Its name must be new; its flag must be sglang's."""
    return AXES.add(axis.name, axis)


@contextmanager
def registered(axis: Axis) -> Iterator[Axis]:
    """An axis registered for the duration of a block (tests, plugins)."""
    with AXES.registered(axis.name, axis):
        yield axis


for _axis in (
    BackendAxis("attention_backend", "ab", "--attention-backend", "attention_backend"),
    BackendAxis("prefill_attention_backend", "pab", "--prefill-attention-backend", "prefill_attention_backend"),
    BackendAxis("decode_attention_backend", "dab", "--decode-attention-backend", "decode_attention_backend"),
    SwitchAxis("unified_memory", "um", "--enable-unified-memory", "enable_unified_memory"),
    SwitchAxis("radix_cache", "rc", "--disable-radix-cache", "disable_radix_cache", flag_when="off"),
    SizeAxis("chunked_prefill", "cp", "--chunked-prefill-size", "chunked_prefill_size"),
    SwitchAxis("deterministic_inference", "di", "--enable-deterministic-inference",
               "enable_deterministic_inference"),
):
    register(_axis)


def backend_axes() -> tuple[str, ...]:
    return tuple(name for name, axis in AXES.items() if isinstance(axis, BackendAxis))


def abbreviation(axis_name: str) -> str:
    """The short name in cell ids (`ab-fa3`); a custom axis keeps its own name."""
    axis = AXES.find(axis_name)
    return axis.abbreviation if axis else axis_name


# Flags outside the registry whose effect the server reports, so custom flag sets are verified too.
_OTHER_REPORTED: dict[str, tuple[str, type | None]] = {
    "--enable-two-batch-overlap": ("enable_two_batch_overlap", None),
    "--tp-size": ("tp_size", int),
}


def reported_flags() -> dict[str, tuple[str, type | None]]:
    """Every flag the harness knows the server to report: flag -> (server field, type)."""
    table = dict(_OTHER_REPORTED)
    for axis in AXES.values():
        table.update(axis.reported_flags())
    return table


def server_fields() -> tuple[str, ...]:
    """The `/server_info` fields of every registered axis, in registry order."""
    return tuple(axis.server_field for axis in AXES.values())



def flags_known() -> set[str]:
    """Every flag some registered axis passes (the simulator's parser takes these from the registry)."""
    return {axis.flag for axis in AXES.values()}
