"""Did the server run the configuration the cell is labelled with? (pure)"""

from __future__ import annotations

from typing import Any

# Server-info fields kept in cells.jsonl (the whole info goes to MLflow as an artifact).
RESOLVED_SUBSET = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
                   "disable_radix_cache", "enable_unified_memory", "chunked_prefill_size", "tp_size",
                   "random_seed", "model_path", "mamba_radix_cache_strategy", "enable_deterministic_inference",
                   "enable_two_batch_overlap", "version")


def resolved_subset(info: dict[str, Any]) -> dict[str, Any]:
    return {key: info[key] for key in RESOLVED_SUBSET if key in info}


def mismatches(expected: dict[str, Any], resolved: dict[str, Any]) -> list[str]:
    """One line per field the server did not honour: `disable_radix_cache: requested False, resolved True`."""
    problems = []
    for key, wanted in expected.items():
        if key not in resolved:
            problems.append(f"{key}: requested {wanted!r}, not reported by the server")
        elif resolved[key] != wanted:
            problems.append(f"{key}: requested {wanted!r}, resolved {resolved[key]!r}")
    return problems
