"""The decode self-check's requests: a sampled question's prompt decoded again, a follow-up that reads
the KV rows that decode wrote, and both decodes' tokens prefilled from scratch, so that each decoded
token has two log-probabilities the server should agree on (sglang's own `kl_test_utils` compare the
same: a Mamba2 state-saving bug showed as KL ~1.5 against ~1e-3 healthy there).

Three requests on sglang's `/generate`, one at a time:

1. `answer`: the prompt as text, `DECODED_TOKENS` greedy tokens, `logprob_start_len` 0. A request
   whose log-probabilities start at 0 reads nothing from the prefix cache (sglang caps a request's
   cache match at its `logprob_start_len`), and its input entries give the prompt's token ids.
2. `follow-up`: the prompt's ids and the answer's, `FOLLOW_TOKENS` more. With the radix cache on,
   its prompt is served from the cache up to its last token: the prompt's rows a prefill wrote and
   the answer's rows a decode wrote (its `cached_tokens` says how many).
3. `prefill`: every token of both, no new token, `logprob_start_len` 0: computed from scratch.

`ignore_eos` keeps each decode at its length. A server without `/generate`'s log-probabilities or
`input_ids` gives an error, and the gate says "not measured".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from harness.records import DecodeCheck

# Tokens decoded a question: enough for a decode-path bug (present at every decoded token) to show
# in the mean, few enough that 32 sampled questions cost ~3 requests each (README: "Evidence inside each cell").
DECODED_TOKENS = 24
FOLLOW_TOKENS = 8


@dataclass(frozen=True)
class Decoded:
    """What `/generate` returned with `return_logprob`: token ids and log-probabilities (None where
    the server gives none: the first input token)."""

    input_ids: list[int]
    input_logprobs: list[float | None]
    output_ids: list[int]
    output_logprobs: list[float | None]
    cached_tokens: int | None


def _greedy(tokens: int) -> dict:
    return {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}


def answer_body(text: str) -> dict:
    return {"text": text, "sampling_params": _greedy(DECODED_TOKENS), "return_logprob": True, "logprob_start_len": 0}


def follow_body(input_ids: list[int]) -> dict:
    return {"input_ids": input_ids, "sampling_params": _greedy(FOLLOW_TOKENS), "return_logprob": True}


def prefill_body(input_ids: list[int]) -> dict:
    return {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": 0}


def _complete(values: list[float | None]) -> list[float] | None:
    return None if any(value is None for value in values) else [float(value) for value in values]  # type: ignore[arg-type]


async def decode_check(post: Callable[[dict], Awaitable[Decoded | str]], text: str) -> DecodeCheck:
    """The three requests for one prompt (`post` sends a `/generate` body and returns what came back,
    or why nothing did) and what they say, as a DecodeCheck."""
    answer = await post(answer_body(text))
    if isinstance(answer, str):
        return DecodeCheck(error=f"answer: {answer}")
    prompt, first = answer.input_ids, answer.output_ids
    decoded_first = _complete(answer.output_logprobs)
    if not prompt or not first or decoded_first is None or len(decoded_first) != len(first):
        return DecodeCheck(error="the server returned no token ids or decode log-probabilities (return_logprob)")
    follow = await post(follow_body(prompt + first))
    if isinstance(follow, str):
        return DecodeCheck(error=f"follow-up: {follow}")
    decoded_follow = _complete(follow.output_logprobs)
    if decoded_follow is None or len(decoded_follow) != len(follow.output_ids):
        return DecodeCheck(error="the follow-up returned no decode log-probabilities")
    tokens = first + follow.output_ids
    prefill = await post(prefill_body(prompt + tokens))
    if isinstance(prefill, str):
        return DecodeCheck(error=f"prefill: {prefill}")
    prefilled = _complete(prefill.input_logprobs[len(prompt):])
    if prefill.input_ids[len(prompt):] != tokens or prefilled is None:
        return DecodeCheck(error="the prefill returned other tokens or no log-probabilities for the decoded ones")
    return DecodeCheck(prompt_tokens=len(prompt), token_ids=tokens, decoded=decoded_first + decoded_follow,
                       prefilled=prefilled, follow_start=len(first), follow_cached=follow.cached_tokens)
