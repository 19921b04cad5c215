"""Did the server run the configuration the cell is labelled with? (pure)

Only what the passed flags imply must be reported: a field the cell expects at its default (an
`off` switch, for which no flag was passed) may be missing from `/server_info`, since sglang builds
from before that flag existed do not report it, and a missing key then means the default.
"""

from __future__ import annotations

from typing import Any

from harness.suite.axes import server_fields
from harness.suite.matrix import expectations_from_flags

# Server-info fields kept in cells.jsonl besides the axes' own (the whole info goes to MLflow).
_OTHER_FIELDS = ("tp_size", "random_seed", "model_path", "mamba_radix_cache_strategy", "enable_two_batch_overlap",
                 "version")


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
