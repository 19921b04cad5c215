"""The results folder: `results/<run_id>/` exactly as docs/results-contract.md says.

Every write goes to a temporary file that is then renamed over the target, so a crash never leaves
half a line; cells.jsonl is rewritten whole on each append for the same reason (it is small).
"""

from __future__ import annotations

import os
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from harness.errors import ConfigError
from harness.records import CellResult, QuestionRecord, RunInfo


def new_run_id(suite: str) -> str:
    return f"{suite}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class ResultsStore:
    """One run's folder."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.root = Path(root)
        self.run_id = run_id
        self.path = self.root / run_id

    @classmethod
    def existing(cls, root: Path, run_id: str) -> ResultsStore:
        store = cls(root, run_id)
        if not (store.path / "run.json").is_file():
            known = sorted(p.name for p in Path(root).glob("*/run.json")) if Path(root).is_dir() else []
            hint = f"; runs here: {', '.join(p.split('/')[0] for p in known[-5:])}" if known else ""
            raise ConfigError(f"--resume {run_id}: no run.json under {store.path}{hint}")
        return store

    def write_run(self, info: RunInfo) -> None:
        atomic_write(self.path / "run.json", info.model_dump_json(indent=2) + "\n")

    def read_run(self) -> RunInfo:
        return RunInfo.model_validate_json((self.path / "run.json").read_text())

    def append_cell(self, result: CellResult) -> None:
        target = self.path / "cells.jsonl"
        existing = target.read_text() if target.exists() else ""
        atomic_write(target, existing + result.model_dump_json() + "\n")

    def rewrite_cells(self, results: list[CellResult]) -> None:
        atomic_write(self.path / "cells.jsonl", "".join(r.model_dump_json() + "\n" for r in results))

    def cells(self) -> list[CellResult]:
        target = self.path / "cells.jsonl"
        if not target.exists():
            return []
        results = []
        for number, line in enumerate(target.read_text().splitlines(), start=1):
            try:
                results.append(CellResult.model_validate_json(line))
            except ValidationError as error:
                raise ConfigError(f"{target}:{number}: not a valid cell result: {error.errors()[0]['msg']}") from None
        return results

    def write_questions(self, cell_id: str, records: list[QuestionRecord]) -> Path:
        path = self.path / "questions" / f"{cell_id}.jsonl"
        atomic_write(path, "".join(r.model_dump_json() + "\n" for r in records))
        return path

    def read_questions(self, cell_id: str) -> list[QuestionRecord]:
        path = self.path / "questions" / f"{cell_id}.jsonl"
        if not path.exists():
            return []
        return [QuestionRecord.model_validate_json(line) for line in path.read_text().splitlines()]

    def write_log(self, cell_id: str, text: str) -> Path:
        path = self.path / "logs" / f"{cell_id}.log"
        atomic_write(path, text)
        return path

    def write_text(self, name: str, text: str) -> Path:
        atomic_write(self.path / name, text)
        return self.path / name
