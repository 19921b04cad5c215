"""Did the server run the configuration the cell is labelled with? (pure)

Only what the passed flags imply must be reported: a field the cell expects at its default (an
`off` switch, for which no flag was passed) may be missing from `/server_info`, since sglang builds
from before that flag existed do not report it, and a missing key then means the default.
"""

from __future__ import annotations

from typing import Any

from harness.suite.axes import reported_flags, server_fields
from harness.suite.matrix import expectations_from_flags

# Server-info fields kept in cells.jsonl besides the axes' own (the whole info goes to MLflow).
_OTHER_FIELDS = ("tp_size", "random_seed", "model_path", "mamba_radix_cache_strategy", "enable_two_batch_overlap",
                 "version")


# Resolved fields the plan-time check reports besides every field the harness knows a flag for:
# what the engine decides by itself (and the simulator has no say in).
_DECIDED_BY_ENGINE = ("page_size", "mamba_radix_cache_strategy")


def predicted_fields() -> tuple[str, ...]:
    """What the plan-time sglang check predicts: every field a known flag resolves to (the axis
    registry and the other reported flags, `harness.suite.axes.reported_flags`), and what sglang
    decides by itself."""
    return tuple(dict.fromkeys([*(field for field, _ in reported_flags().values()), *_DECIDED_BY_ENGINE]))


def resolved_subset(info: dict[str, Any]) -> dict[str, Any]:
    return {key: info[key] for key in (*server_fields(), *_OTHER_FIELDS) if key in info}


def mismatches(expected: dict[str, Any], resolved: dict[str, Any],
               flags: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """One line per field the server did not honour: `disable_radix_cache: requested False, resolved True`.

    `flags`: the server's whole argv; a field that no passed flag implies may be absent (see above).
    With `flags` None every expected field must be reported.
    """
    implied = None if flags is None else set(expectations_from_flags(flags))
    problems = []
    for key, wanted in expected.items():
        if key not in resolved:
            if implied is None or key in implied:
                problems.append(f"{key}: requested {wanted!r}, not reported by the server")
        elif resolved[key] != wanted:
            problems.append(f"{key}: requested {wanted!r}, resolved {resolved[key]!r}")
    return problems
