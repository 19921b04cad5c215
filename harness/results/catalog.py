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


def resolve_run(results_dir: Path, name: str) -> ResultsStore:
    """A run id, a results folder, or latest:<suite> / previous:<suite>."""
    if name.startswith(("latest:", "previous:")):
        which, _, suite = name.partition(":")
        infos = runs_of(results_dir, suite)
        needed = 1 if which == "latest" else 2
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
