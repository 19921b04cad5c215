"""Loading GSM8K: from a local folder (test.jsonl + train.jsonl) or the Hugging Face hub.

Where the data comes from, in order: an explicit path (suite `dataset.path` or `--gsm8k-path`), the
environment variable REGRESS_GSM8K_PATH, then `openai/gsm8k` (config `main`) through `datasets`,
which uses its local cache when the hub is unreachable. The content hash does not depend on the
source, so the same data always has the same fingerprint.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from harness.benchmark.gsm8k.extract import gold_answer
from harness.errors import DatasetError

ENV_VAR = "REGRESS_GSM8K_PATH"
HUB_ID = ("openai/gsm8k", "main")


@dataclass(frozen=True)
class Problem:
    question: str
    solution: str
    gold: str


@dataclass(frozen=True)
class Gsm8k:
    test: tuple[Problem, ...]
    train: tuple[Problem, ...]
    source: str
    sha256: str


def resolve_source(path: str | Path | None) -> str | None:
    """The local folder to read, or None for the hub."""
    if path:
        return str(Path(path).expanduser().resolve())
    from_env = os.environ.get(ENV_VAR)
    return str(Path(from_env).expanduser().resolve()) if from_env else None


def load_gsm8k(path: str | Path | None = None) -> Gsm8k:
    """Load both splits. Raises DatasetError with what to do when the data cannot be had."""
    return _load(resolve_source(path))


def read_split(folder: str | Path, split: str) -> tuple[Problem, ...]:
    """One split (`test` or `train`) of a local GSM8K folder, without the fingerprint of both that
    `load_gsm8k` computes (the simulator reads the train split only when it is asked from it)."""
    return tuple(_read_jsonl(Path(folder) / f"{split}.jsonl"))


@functools.lru_cache(maxsize=4)
def _load(folder: str | None) -> Gsm8k:
    if folder is None:
        test, train = _from_hub()
        source = f"hub:{HUB_ID[0]}/{HUB_ID[1]}"
    else:
        test, train = read_split(folder, "test"), read_split(folder, "train")
        source = folder
    digest = hashlib.sha256()
    for split in (test, train):
        for problem in split:
            digest.update(problem.question.encode())
            digest.update(b"\0")
            digest.update(problem.solution.encode())
            digest.update(b"\n")
    return Gsm8k(tuple(test), tuple(train), source, digest.hexdigest())


def _problem(row: object, where: str) -> Problem:
    if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(
            row.get("answer"), str):
        raise DatasetError(f"{where}: expected an object with string fields 'question' and 'answer'")
    try:
        gold = gold_answer(row["answer"])
    except ValueError as error:
        raise DatasetError(f"{where}: {error}") from None
    return Problem(row["question"], row["answer"], gold)


def _read_jsonl(path: Path) -> list[Problem]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise DatasetError(f"GSM8K file {path} does not exist; point --gsm8k-path (or {ENV_VAR}) at a "
                           "folder holding test.jsonl and train.jsonl") from None
    except OSError as error:
        raise DatasetError(f"cannot read GSM8K file {path}: {error.strerror}") from None
    problems = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DatasetError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        problems.append(_problem(row, f"{path}:{number}"))
    if not problems:
        raise DatasetError(f"{path} holds no problems")
    return problems


WHERE_TO_GET_IT = (
    f"GSM8K is {HUB_ID[0]} (config {HUB_ID[1]}) on the Hugging Face hub: on a machine that reaches it, "
    f"`python -c \"import datasets; datasets.load_dataset('{HUB_ID[0]}', '{HUB_ID[1]}')\"` fills the cache "
    "(~/.cache/huggingface); or put test.jsonl and train.jsonl (github.com/openai/grade-school-math, "
    f"grade_school_math/data) in a folder and pass --gsm8k-path or set {ENV_VAR}")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the hub (HF_ENDPOINT, else huggingface.co) accepts a connection at all: when it does
    not, `datasets` would spend half a minute retrying before using its cache."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname or "huggingface.co", port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _from_hub() -> tuple[list[Problem], list[Problem]]:
    if not hub_reachable():
        # Straight to the cache: these are read when the hub libraries are imported, just below.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets

        loaded = datasets.load_dataset(*HUB_ID)
    except Exception as error:  # noqa: BLE001 - datasets raises many unrelated types when offline
        raise DatasetError(f"cannot load {HUB_ID[0]} from the Hugging Face hub or its cache "
                           f"({type(error).__name__}: {str(error)[:200]}). {WHERE_TO_GET_IT}") from None
    return ([_problem(row, f"hub test[{i}]") for i, row in enumerate(loaded["test"])],
            [_problem(row, f"hub train[{i}]") for i, row in enumerate(loaded["train"])])
