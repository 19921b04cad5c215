"""World files: what the simulator's models know, how configurations drift, and what is broken.

A world is pure data plus pure decisions (`World.decide`): given a model, a question and a
resolved server configuration, it says whether the answer is right, wrong, corrupted or empty.
Every decision is a hash of its inputs, so the same world, seed and configuration always give the
same answers, and two configurations disagree on a few percent of questions, as real backends do.
"""

from __future__ import annotations

import functools
import hashlib
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.errors import ConfigError
from harness.suite.axes import AXES, reported_flags
from harness.suite.files import load_yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimModel(_Strict):
    accuracy: float = Field(ge=0, le=1)
    kind: Literal["mla", "hybrid-linear", "dense"] = "dense"
    # Some sglang versions turn the radix cache off for hybrid-linear models unless this strategy
    # is given; a world can reproduce that to exercise the `mismatch` check.
    radix_cache_needs_extra_buffer: bool = False
    invalid_share_of_wrong: float = Field(0.1, ge=0, le=1)
    # Per-model overrides of the world's latency: load time and seconds per request.
    startup_s: float | None = Field(None, ge=0)
    base_s: float | None = Field(None, ge=0)
    # Extra load time when the node's page cache does not hold the weights yet (the first load of
    # the model on that node; see World.page_cache_dir).
    cold_load_s: float = Field(0.0, ge=0)


class Condition(_Strict):
    """Matches on the model path and resolved server fields (a value or a list of values)."""

    models: list[str] = []
    when: dict[str, Any] = {}

    def matches(self, model_path: str, resolved: dict[str, Any]) -> bool:
        if self.models and model_path not in self.models:
            return False
        for key, wanted in self.when.items():
            options = wanted if isinstance(wanted, list) else [wanted]
            if resolved.get(key) not in options:
                return False
        return True


class Bug(Condition):
    name: str
    # When it strikes: always; on a request that hits the prefix cache (the incident's class: the
    # cache's KV rows read wrong); `warm`: on a question whose whole prompt the server has seen
    # since its cache was last flushed (right cold, wrong warm: sglang PR #16053); `batched`: on a
    # request served while others are (cross-request contamination: alone it is right);
    # `decode_hit`: on a request whose cached prefix holds rows a decode wrote (its own answer asked
    # again, the decode self-check's follow-up: the decode-cache-hit class of sglang's kl_test_utils).
    trigger: Literal["always", "prefix_hit", "warm", "batched", "decode_hit"] = "always"
    # Per configuration, the share of matching requests that is corrupted is drawn in this range.
    corrupt_probability: tuple[float, float] = (0.7, 0.95)
    # Corrupt an answer by a wrong number, or by the whole effect a broken kernel has: junk to max
    # tokens; `unchanged`: every answer stays as it was, only the log-probabilities move (a bug that
    # corrupts the reasoning's numbers but not the final one, visible to teacher forcing alone).
    style: Literal["wrong", "garbage", "mixed", "empty", "unchanged"] = "mixed"
    # On an affected request, each teacher-forced log-probability moves by this (nats) times a draw
    # in [0.5, 1.5), and the top-1 token changes at `top1_flip` of the positions.
    divergence: float = Field(1.0, ge=0)
    top1_flip: float = Field(0.3, ge=0, le=1)
    # With a commit history in the world: the bug exists from this commit on (REGRESS_SIM_COMMIT
    # names the build a server runs), so bisection can be tested.
    since_commit: str | None = None


class Fault(Condition):
    """Infrastructure faults. Each field is independent; unset means absent."""

    name: str = "fault"
    startup_exit_code: int | None = None
    startup_message: str = "RuntimeError: simulated startup failure"
    never_ready: bool = False
    crash_after_requests: int | None = None
    hang_after_requests: int | None = None
    hang_request_rate: float = 0.0
    error_status: int = 503
    error_rate: float = 0.0
    error_until_request: int | None = None  # the error burst ends after this many requests
    malformed_rate: float = 0.0
    empty_output_rate: float = 0.0
    ignore_sigterm: bool = False
    spawn_grandchild: bool = False
    # Kill the process that started the server (a Ray worker dying mid-cell). With `once_file`, only
    # the first server to get there does it (the file records that it happened).
    kill_parent_after_requests: int | None = None
    once_file: str | None = None


class Latency(_Strict):
    slots: int = Field(256, ge=1)
    base_s: float = Field(0.0, ge=0)
    prefill_s_per_token: float = Field(0.0, ge=0)
    decode_s_per_token: float = Field(0.0, ge=0)
    startup_s: float = Field(0.2, ge=0)


class World(_Strict):
    version: str = "0.5.6-sim"
    seed: int = 0
    flip_rate: float = Field(0.10, ge=0, le=1)
    default_backend: dict[str, str] = {"mla": "fa3", "hybrid-linear": "fa3", "dense": "triton"}
    default_chunked_prefill_size: int = 8192
    models: dict[str, SimModel]
    bugs: list[Bug] = []
    faults: list[Fault] = []
    latency: Latency = Latency()
    attention_backends: list[str] | None = None  # what `--attention-backend` accepts; None: sglang's list
    history: list[str] = []  # commits, oldest first, for `since_commit`
    # Where simulated page caches live: one folder per node (REGRESS_NODE_ID), a file per model
    # loaded there. Relative to the world file. None: every load is cold.
    page_cache_dir: str | None = None
    # Server-info keys this build does not report (an sglang from before the flag existed).
    unreported_fields: list[str] = []
    # Healthy numerics: each configuration moves every teacher-forced log-probability by a draw in
    # [-drift, drift) nats times a scale of its own per question (exponential, mean 1: a few
    # questions drift far more than most, as long or near-tie contexts do), a draw per
    # configuration, question and position; and changes the top-1 token at a share `drift` of
    # positions (near-ties). Per attention backend: `backend_drift`.
    logprob_drift: float = Field(0.01, ge=0, le=1)
    backend_drift: dict[str, float] = {}
    # Healthy numerics along a server's own paths: a text scored in a batch or alone, read from the
    # prefix cache or computed, moves each log-probability by a draw in [-path_noise, path_noise)
    # nats per path (kernels that are not batch-invariant; real sglang on CPU, radix on: 0.013-0.033
    # nats/token mean between paths, README). 0: every path gives the same numbers.
    path_noise: float = Field(0.0, ge=0, le=1)

    def bug_active(self, bug: Bug, commit: str | None) -> bool:
        if bug.since_commit is None:
            return True
        if commit is None or commit not in self.history or bug.since_commit not in self.history:
            return False
        return self.history.index(commit) >= self.history.index(bug.since_commit)

    def model(self, path: str) -> SimModel:
        try:
            return self.models[path]
        except KeyError:
            raise ConfigError(f"model {path!r} is not in the simulator's world; "
                              f"known: {', '.join(self.models)}") from None

    def faults_for(self, model_path: str, resolved: dict[str, Any]) -> list[Fault]:
        return [fault for fault in self.faults if fault.matches(model_path, resolved)]

    def affecting(self, model_path: str, question: str, resolved: dict[str, Any], prefix_hit: bool,
                  commit: str | None = None, warm: bool = False, batched: bool = False,
                  decode_hit: bool = False) -> Bug | None:
        """The first active bug that matches this configuration and corrupts this question's request."""
        model = self.model(model_path)
        signature = configuration_signature(resolved)
        seen = {**resolved, **wrapping(model.kind, resolved)}
        for bug in self.bugs:
            if not bug.matches(model_path, seen) or not {"always": True, "prefix_hit": prefix_hit, "warm": warm,
                                                         "batched": batched, "decode_hit": decode_hit}[bug.trigger]:
                continue
            if not self.bug_active(bug, commit):
                continue
            low, high = bug.corrupt_probability
            strength = low + (high - low) * unit_hash(self.seed, bug.name, signature, model_path)
            if unit_hash(self.seed, bug.name, question, signature) < strength:
                return bug
        return None

    def decide(self, model_path: str, question: str, resolved: dict[str, Any], prefix_hit: bool,
               commit: str | None = None, warm: bool = False, batched: bool = False) -> Decision:
        """Right, wrong, or corrupted, for this question on this configuration."""
        model = self.model(model_path)
        signature = configuration_signature(resolved)
        correct = unit_hash(self.seed, model_path, question) < model.accuracy
        if unit_hash(self.seed, model_path, question, signature, "flip") < self.flip_rate:
            correct = unit_hash(self.seed, model_path, question, signature, "redraw") < model.accuracy
        bug = self.affecting(model_path, question, resolved, prefix_hit, commit, warm, batched)
        if bug is not None and bug.style != "unchanged":
            style = bug.style
            if style == "mixed":
                style = "garbage" if unit_hash(self.seed, question, "style") < 0.5 else "wrong"
            return Decision(style, bug.name)
        if correct:
            return Decision("right")
        invalid = unit_hash(self.seed, model_path, question, signature, "invalid") < model.invalid_share_of_wrong
        return Decision("invalid" if invalid else "wrong")

    def teacher_forced(self, model_path: str, question: str, continuation: str, resolved: dict[str, Any],
                       prefix_hit: bool, commit: str | None = None, batched: bool = False,
                       chunks: list[str] | None = None, decode_hit: bool = False, warm: bool = False) -> TeacherScores:
        """The log-probabilities and top-1 tokens a server of this configuration gives `continuation`
        (or its tokens, `chunks`) after the question, teacher-forced or decoded: the same numbers on
        either path, a bug's damage where it strikes. A token is 4 characters (as the simulator counts them);
        the model's own numbers are seeded draws per question, the configuration's drift and an
        affecting bug's damage are added to them (vectorised: one seeded generator per part)."""
        import numpy as np

        self.model(model_path)  # an unknown model is a ConfigError, as for answers
        signature = configuration_signature(resolved)
        drift = self.backend_drift.get(str(resolved.get("attention_backend")), self.logprob_drift)
        drift *= -math.log(1.0 - unit_hash(self.seed, model_path, question, signature, "scale"))
        bug = self.affecting(model_path, question, resolved, prefix_hit, commit, warm, batched, decode_hit)
        chunks = chunks or [continuation[i:i + 4] for i in range(0, len(continuation), 4)] or [""]
        count = len(chunks)
        tokens = np.array([zlib.crc32(chunk.encode()) % 32000 for chunk in chunks])
        others = (unit_draws(count, self.seed, "other", model_path, question) * 32000).astype(int)
        others = np.where(others == tokens, (others + 1) % 32000, others)
        logprobs = -3.0 * unit_draws(count, self.seed, model_path, question, "logprob")
        logprobs += drift * (2 * unit_draws(count, self.seed, model_path, question, signature, "drift") - 1)
        top_is_token = unit_draws(count, self.seed, model_path, question, "top") < 0.6
        top_is_token ^= unit_draws(count, self.seed, model_path, question, signature, "tie") < min(drift, 1.0)
        if self.path_noise:
            logprobs += self.path_noise * (2 * unit_draws(count, self.seed, model_path, question, signature, "path",
                                                          batched, prefix_hit) - 1)
        if bug is not None:
            logprobs -= bug.divergence * (0.5 + unit_draws(count, self.seed, bug.name, question))
            top_is_token ^= unit_draws(count, self.seed, bug.name, question, "top") < bug.top1_flip
        tops = np.where(top_is_token, tokens, others)
        return TeacherScores(tuple(int(t) for t in tokens), tuple(float(v) for v in np.minimum(logprobs, 0.0)),
                             tuple(int(t) for t in tops))


@dataclass(frozen=True)
class TeacherScores:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_ids: tuple[int, ...]


@dataclass(frozen=True)
class Decision:
    kind: Literal["right", "wrong", "invalid", "garbage", "empty"]
    bug: str | None = None


def wrapping(kind: str, resolved: dict[str, Any]) -> dict[str, str | None]:
    """Which wrapper attention backend sglang runs, and the backend inside it, as bugs can match them
    (`attention_wrapper`, `wrapped_backend`; never reported by /server_info):

    - `hybrid_linear`: hybrid linear-attention models (Kimi-Linear) run their full-attention layers
      through HybridLinearAttnBackend around the configured backend;
    - `hybrid`: a prefill backend that differs from the decode backend runs HybridAttnBackend around
      both (the decode backend is the one reported inside);
    - `none`: a single backend, unwrapped.
    """
    prefill, decode = resolved.get("prefill_attention_backend"), resolved.get("decode_attention_backend")
    if kind == "hybrid-linear":
        return {"attention_wrapper": "hybrid_linear", "wrapped_backend": resolved.get("attention_backend")}
    if prefill and decode and prefill != decode:
        return {"attention_wrapper": "hybrid", "wrapped_backend": decode}
    return {"attention_wrapper": "none", "wrapped_backend": None}


def numerics_fields() -> tuple[str, ...]:
    """Server-info fields that change numerics: every field a flag the harness knows resolves to
    (the axis registry, `harness.suite.axes.reported_flags`), and the seed. Two configurations that
    differ in these drift apart."""
    return _numerics_fields(tuple(AXES.items()))


@functools.lru_cache(maxsize=16)
def _numerics_fields(_registry: tuple) -> tuple[str, ...]:  # keyed by the registry's entries: never stale
    return (*dict.fromkeys(field for field, _ in reported_flags().values()), "random_seed")


def configuration_signature(resolved: dict[str, Any]) -> str:
    """The resolved fields that change numerics, those that are set (not None, not False): so
    registering an axis keeps every world's answers for cells that do not use it."""
    return "|".join(f"{key}={resolved[key]}" for key in numerics_fields() if resolved.get(key) not in (None, False))


def _digest(parts: tuple[object, ...]) -> bytes:
    return hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()


def unit_draws(count: int, *parts: object):
    """`count` deterministic numbers in [0, 1) from its inputs (a numpy generator seeded by them)."""
    import numpy as np

    return np.random.default_rng(int.from_bytes(_digest(parts), "big")).random(count)


def unit_hash(*parts: object) -> float:
    """A deterministic number in [0, 1) from its inputs."""
    digest = _digest(parts)
    return int.from_bytes(digest, "big") / 2**64


def load_world(path: str | Path) -> World:
    path = Path(path)
    data = load_yaml(path, "simulator world")
    try:
        return World.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise ConfigError(f"{path}: invalid simulator world: {problems}") from None
