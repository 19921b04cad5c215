"""The results folder: `results/<run_id>/` exactly as docs/results-contract.md says.

Every file but cells.jsonl goes to a temporary file, synced to disk, then renamed over the target,
so a crash never leaves half a file. cells.jsonl is appended to, one line per judged cell in one
`write` (O(1) a cell: a 20,000-cell matrix rewrote it whole 20,000 times): a process killed in the
middle of it leaves the line written or not; a full disk's short write is cut back to the last
whole line; and a torn last line (power lost mid-write, a hand edit) is dropped when read, and said
(`torn_line`), since the cell it belonged to runs again on `--resume`.
"""

from __future__ import annotations

import errno
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
            out.flush()
            os.fsync(out.fileno())  # the data is on disk before the rename makes it the file
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
        self.torn_line: int | None = None  # the torn last line of cells.jsonl that `cells` dropped, if any

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
        target.parent.mkdir(parents=True, exist_ok=True)
        line = (result.model_dump_json() + "\n").encode()
        with target.open("ab") as out:
            whole = _after_last_newline(out)  # a torn last line is cut off, not glued to this one
            try:
                written = os.write(out.fileno(), line)
                if written != len(line):
                    raise OSError(errno.ENOSPC, f"short write to {target} ({written} of {len(line)} bytes)")
                os.fsync(out.fileno())
            except OSError:
                os.truncate(target, whole)  # no half line left behind (a full disk)
                raise

    def rewrite_cells(self, results: list[CellResult]) -> None:
        atomic_write(self.path / "cells.jsonl", "".join(r.model_dump_json() + "\n" for r in results))

    def cells(self) -> list[CellResult]:
        target = self.path / "cells.jsonl"
        if not target.exists():
            return []
        text = target.read_text(errors="replace")
        lines = text.splitlines()
        results = []
        self.torn_line = None
        for number, line in enumerate(lines, start=1):
            try:
                results.append(CellResult.model_validate_json(line))
            except ValidationError as error:
                if number == len(lines) and not text.endswith("\n"):
                    self.torn_line = number  # written in part: that cell is not judged yet
                    break
                raise ConfigError(f"{target}:{number}: not a valid cell result: {error.errors()[0]['msg']}; "
                                  "fix or delete that line (its cell then runs again on --resume)") from None
        return results

    def torn_note(self) -> str | None:
        """What to tell the user when the last `cells` dropped a torn line, else None."""
        if self.torn_line is None:
            return None
        return (f"dropped the torn last line ({self.torn_line}) of {self.path / 'cells.jsonl'}: a cell was being "
                "written when the run stopped; `--resume` runs it again")

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


TAIL_BYTES = 65536  # where a torn last line is looked for (the demo's longest line: 2.8 KB; an error cell adds 40 log lines)


def _after_last_newline(handle) -> int:
    """The length of the file open in `handle` up to its last newline, the rest cut off (a torn
    line longer than TAIL_BYTES is left as it is)."""
    size = os.fstat(handle.fileno()).st_size
    if size == 0:
        return 0
    with open(handle.name, "rb") as reader:
        reader.seek(max(0, size - TAIL_BYTES))
        tail = reader.read()
    if tail.endswith(b"\n"):
        return size
    cut = tail.rfind(b"\n")
    whole = size - len(tail) + cut + 1 if cut >= 0 else (0 if size <= TAIL_BYTES else size)
    os.truncate(handle.name, whole)
    return whole
