"""Did the server run the configuration the cell is labelled with? (pure)

Only what the passed flags imply must be reported: a field the cell expects at its default (an
`off` switch, for which no flag was passed) may be missing from `/server_info`, since sglang builds
from before that flag existed do not report it, and a missing key then means the default.
"""

from __future__ import annotations

from typing import Any

from harness.records import QuestionRecord
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


def exercise_mismatches(expected: dict[str, Any], records: list[QuestionRecord]) -> list[str]:
    """Whether the answers exercised the cell's radix-cache label: with the cache on, some question
    must have reused a cached prefix; with it off, none may. Nothing is claimed when the server does
    not report cached tokens, or fewer than two questions were answered."""
    if "disable_radix_cache" not in expected:
        return []
    reported = [r.cached_tokens for r in records if r.error is None and r.cached_tokens is not None]
    if len(reported) < 2:
        return []
    hits = sum(tokens > 0 for tokens in reported)
    if expected["disable_radix_cache"] is False and hits == 0:
        return [f"radix cache on, but none of {len(reported)} answered questions reused a cached prefix (0 cached "
                "prompt tokens): the cell did not test its label (do its prompts share a prefix?)"]
    if expected["disable_radix_cache"] is True and hits:
        return [f"radix cache off, but {hits} of {len(reported)} answered questions were served cached prompt tokens "
                f"({sum(reported)} in all)"]
    return []


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
