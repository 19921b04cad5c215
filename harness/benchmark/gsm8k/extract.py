"""Reading the final number out of a model's answer.

Two rules are scored on every answer:
- strict: the number after `####` or after "The answer is" (the format the shots teach);
- flexible: the last number anywhere in the text.
Both keep signs and decimals and drop `$`, `%` and thousands separators, so `$1,234.50` reads 1234.5.
sglang's own `few_shot_gsm8k` rule (last run of digits, commas removed, signs and decimals lost) is
kept separately for the `sglang-fewshot` protocol, so its scores match sglang's CI thresholds.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# A number that is not glued to a word before it (no `COVID19`, `x2`), optionally signed or in
# dollars, with optional thousands separators and decimals. A trailing period is punctuation.
# Any run of digits may carry `,ddd` groups: `1945,400` is one number (1945400) for both rules, not
# 1945 for one and 400 for the other.
_NUMBER = r"(?<![A-Za-z0-9_.])(-?)\$?(-?)(\d+(?:,\d{3})*(?:\.\d+)?)"
_NUMBER_RE = re.compile(_NUMBER)
_STRICT_RE = re.compile(r"(?:####|[Tt]he (?:final )?answer is:?)\s*\**\s*" + _NUMBER)
_SGLANG_INTEGER_RE = re.compile(r"\d+")
_RUN_EVAL_NUMBER = r"-?\d+\.?\d*"
_RUN_EVAL_MARKER_RE = re.compile(r"####\s*(" + _RUN_EVAL_NUMBER + ")")
_RUN_EVAL_NUMBER_RE = re.compile(_RUN_EVAL_NUMBER)


def normalise_number(text: str) -> str | None:
    """Canonical form of a numeric string: `1,234.50` -> `1234.5`, `-3.0` -> `-3`."""
    cleaned = text.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _from_match(match: re.Match[str]) -> str | None:
    sign = "-" if (match.group(1) or match.group(2)) else ""
    return normalise_number(sign + match.group(3))


def extract_flexible(output: str) -> str | None:
    """The last number in the text, or None when there is none (an invalid answer)."""
    matches = list(_NUMBER_RE.finditer(output))
    return _from_match(matches[-1]) if matches else None


def extract_strict(output: str) -> str | None:
    """The number after the last `####` or "The answer is", or None."""
    matches = list(_STRICT_RE.finditer(output))
    return _from_match(matches[-1]) if matches else None


def gold_answer(solution: str) -> str:
    """The reference number of a GSM8K solution (`... #### 72`)."""
    _, marker, final = solution.rpartition("####")
    value = normalise_number(final) if marker else None
    if value is None:
        raise ValueError(f"GSM8K solution has no '#### <number>' line: {solution[-80:]!r}")
    return value


def extract_sglang_integer(output: str) -> str | None:
    """sglang few_shot_gsm8k's rule: commas removed, last run of digits; None is invalid."""
    numbers = _SGLANG_INTEGER_RE.findall(output.replace(",", ""))
    return numbers[-1] if numbers else None


def extract_sglang_run_eval(output: str) -> str | None:
    """sglang run_eval GSM8KEval's rule: commas removed; the number after the first `####`, else
    the last number; read as a Python literal (so `007` is no number, `3.50` is 3.5). Canonical
    string, or None (invalid)."""
    text = output.replace(",", "")
    marker = _RUN_EVAL_MARKER_RE.search(text)
    if marker is not None:
        found = marker.group(1)
    else:
        numbers = _RUN_EVAL_NUMBER_RE.findall(text)
        if not numbers:
            return None
        found = numbers[-1]
    digits = found.lstrip("-")
    if "." not in digits and len(digits) > 1 and digits.startswith("0") and digits.strip("0"):
        return None  # a Python literal cannot have leading zeros: ast.literal_eval refuses it
    return normalise_number(found)
