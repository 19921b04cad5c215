"""What every benchmark gives a run: a dataset, a plan of prompts, and how an answer is graded.

A `Benchmark` loads its data (with a content hash, so results from different data never pair),
builds a `ProtocolPlan` for one of its protocols (the prompts as they will be sent, the endpoint,
stop strings, the grader), and may extend a plan with more questions for undecided cells. The plan
is plain data plus a module-level grading function, so it travels to Ray workers unchanged.

A question's identity is (split, index): `split` says which of the benchmark's splits the question
came from; the floor is tested on the `test` split only (train questions only add pairs for the
paired tests). GSM8K (`harness.benchmark.gsm8k`) is the built-in benchmark.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal, Protocol

Endpoint = Literal["completions", "generate", "chat"]
TEST_SPLIT = "test"


@dataclass(frozen=True)
class Prompt:
    """One question as it will be sent. `(split, index)` is the question's identity in its dataset.
    `teacher`: a fixed continuation of `text` (GSM8K: the question's reference solution, in the
    shots' format) that every cell scores teacher-forced, so two servers' log-probabilities can be
    compared token by token on the same input; None: the protocol has none (chat)."""

    index: int
    gold: str
    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    split: str = TEST_SPLIT
    teacher: str | None = None

    @property
    def sha(self) -> str:
        body = self.text if self.text is not None else json.dumps(self.messages)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Grade:
    pred: str | None
    correct: bool
    pred_strict: str | None
    correct_strict: bool


Grader = Callable[[str, str], Grade]  # (output, gold) -> grade


@dataclass(frozen=True)
class ProtocolPlan:
    """Everything needed to ask and score the questions of one cell."""

    name: str  # the protocol
    endpoint: Endpoint
    prompts: tuple[Prompt, ...]
    stop: tuple[str, ...]
    max_tokens: int
    temperature: float
    shot_indices: tuple[int, ...]
    seed: int
    dataset_sha256: str
    fingerprint: str
    grader: Grader
    benchmark: str = "gsm8k"
    extensible: bool = False  # whether `Benchmark.extension` can add questions to it

    def grade(self, output: str, gold: str) -> Grade:
        return self.grader(output, gold)

    def test_indices(self) -> tuple[int, ...]:
        """The indices of its test-split questions, in plan order (what the floor and early stop see)."""
        return tuple(p.index for p in self.prompts if p.split == TEST_SPLIT)

    def fingerprint_fields(self) -> dict[str, object]:
        return {"protocol": self.name, "endpoint": self.endpoint, "dataset_sha256": self.dataset_sha256,
                "shots": list(self.shot_indices), "questions": len(self.prompts), "seed": self.seed,
                "stop": list(self.stop), "max_tokens": self.max_tokens, "temperature": self.temperature}


def fingerprinted(plan: ProtocolPlan) -> ProtocolPlan:
    """`plan` with its fingerprint: a hash of what it asks and how (results with different
    fingerprints are not comparable). GSM8K's plans hash exactly these fields, so a benchmark named
    otherwise adds its name to them."""
    fields = plan.fingerprint_fields() | {"question_indices": [p.index for p in plan.prompts],
                                          "template": plan.prompts[0].sha if plan.prompts else ""}
    if plan.benchmark != "gsm8k":
        fields["benchmark"] = plan.benchmark
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return ProtocolPlan(**{**plan.__dict__, "fingerprint": digest})


class Dataset(Protocol):
    """What a run records of its data."""

    @property
    def source(self) -> str: ...  # a folder, or `hub:<id>`

    @property
    def sha256(self) -> str: ...  # of the content, whatever the source


class Benchmark:
    """A benchmark: its protocols, its data, its plans. Subclass, then `BENCHMARKS.add(name, instance)`
    (harness.benchmark.registry)."""

    protocols: ClassVar[tuple[str, ...]]
    default_protocol: ClassVar[str]

    def load(self, path: Path | None) -> Dataset:
        """The data, from `path` or the benchmark's default source; DatasetError when it cannot be had."""
        raise NotImplementedError

    def plan(self, data: Dataset, protocol: str, num_questions: int | None, seed: int,
             max_tokens: int) -> ProtocolPlan:
        """The questions one cell is asked; ConfigError for an unknown protocol or too many questions."""
        raise NotImplementedError

    def extension(self, data: Dataset, plan: ProtocolPlan, count: int) -> ProtocolPlan | None:
        """`count` more questions for undecided cells, in `plan`'s template; None when it has none."""
        return None
