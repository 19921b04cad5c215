"""Finding runs in a results folder: by id or folder, as `latest:SUITE` / `previous:SUITE`, and a
cell's answers in a finished run as an outcome the gate can pair with."""

from __future__ import annotations

from pathlib import Path

from harness.benchmark.scoring import score
from harness.errors import ConfigError
from harness.records import CellOutcome, QuestionRecord, RunInfo
from harness.results.store import ResultsStore


def runs_of(results_dir: Path, suite: str) -> list[RunInfo]:
    """Finished (not interrupted) runs of `suite` in `results_dir`, oldest first."""
    infos = []
    for path in Path(results_dir).glob(f"{suite}-*/run.json"):
        infos.append(RunInfo.model_validate_json(path.read_text()))
    return sorted((i for i in infos if i.suite == suite and not i.interrupted), key=lambda i: i.started_at)


RELATIVE_NAMES = {"latest": 1, "previous": 2}  # `latest:SUITE`: the newest finished run; `previous:SUITE`: the one before


def relative_name(name: str) -> tuple[int, str] | None:
    """`latest:nightly` -> (1, "nightly"), `previous:nightly` -> (2, "nightly"); None for a run id or
    a folder. The one place these names are read (the folder and the archives both use it)."""
    which, colon, suite = name.partition(":")
    return (RELATIVE_NAMES[which], suite) if colon and which in RELATIVE_NAMES else None


def resolve_run(results_dir: Path, name: str) -> ResultsStore:
    """A run id, a results folder, or latest:<suite> / previous:<suite>, in `results_dir`."""
    relative = relative_name(name)
    if relative is not None:
        needed, suite = relative
        infos = runs_of(results_dir, suite)
        if len(infos) < needed:
            raise ConfigError(f"{name}: {len(infos)} finished run(s) of suite {suite!r} in {results_dir}")
        return ResultsStore(results_dir, infos[-needed].run_id)
    path = Path(name)
    if (path / "run.json").is_file():
        return ResultsStore(path.parent, path.name)
    return ResultsStore.existing(results_dir, name)


def answers_outcome(cell_id: str, records: list[QuestionRecord], args: list[str] | None = None) -> CellOutcome | None:
    """A cell's answers from a finished run, as an outcome the gate can pair with (None: no answers)."""
    if not records:
        return None
    return CellOutcome(cell_id=cell_id, args=args or [], score=score(records, 0.0), questions=records)


def stored_outcome(store: ResultsStore, cell_id: str, args: list[str] | None = None) -> CellOutcome | None:
    """`answers_outcome` of the cell's questions in a results folder."""
    return answers_outcome(cell_id, store.read_questions(cell_id), args)
