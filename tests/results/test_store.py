"""cells.jsonl under crashes and full disks: appended in O(1), never half a line kept, a torn last
line dropped and said."""

from __future__ import annotations

import os

import pytest

from harness.errors import ConfigError
from harness.records import Status
from harness.results.store import ResultsStore
from tests.records import result


def store_with(tmp_path, count: int) -> ResultsStore:
    store = ResultsStore(tmp_path, "run-1")
    for number in range(count):
        store.append_cell(result(f"m.c{number}", Status.PASS))
    return store


def test_a_torn_last_line_is_dropped_said_and_cut_off_before_the_next_append(tmp_path):
    store = store_with(tmp_path, 3)
    target = store.path / "cells.jsonl"
    text = target.read_text()
    target.write_text(text[: len(text) - 40])  # the third line lost its end (power cut mid-write)
    assert [r.cell_id for r in store.cells()] == ["m.c0", "m.c1"] and store.torn_line == 3
    store.append_cell(result("m.c2", Status.FAIL))  # the resumed run judges that cell again
    assert [r.cell_id for r in store.cells()] == ["m.c0", "m.c1", "m.c2"] and store.torn_line is None
    assert target.read_text().count("\n") == 3


def test_a_bad_line_in_the_middle_is_still_a_clear_error(tmp_path):
    store = store_with(tmp_path, 3)
    target = store.path / "cells.jsonl"
    lines = target.read_text().splitlines(keepends=True)
    target.write_text(lines[0] + "{not json\n" + lines[2])
    with pytest.raises(ConfigError, match=r"cells.jsonl:2: not a valid cell result.*fix or delete that line"):
        store.cells()


def test_a_short_write_is_cut_back_to_the_last_whole_line(tmp_path, monkeypatch):
    store = store_with(tmp_path, 2)
    target = store.path / "cells.jsonl"
    before = target.read_bytes()
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:10]))  # the disk filled up
    with pytest.raises(OSError, match="short write"):
        store.append_cell(result("m.c2", Status.PASS))
    monkeypatch.undo()
    assert target.read_bytes() == before and store.torn_line is None and len(store.cells()) == 2
