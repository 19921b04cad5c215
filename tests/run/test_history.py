"""What earlier runs give a new one: each cell's last answers that were not a regression, and the pinned run's."""

from __future__ import annotations

from harness.records import CellResult, QuestionRecord, RunInfo, Status
from harness.run.history import History
from tests.records import answer, result


def info(run_id: str, fingerprint: str = "fp", counts: dict[str, int] | None = None) -> RunInfo:
    return RunInfo(run_id=run_id, suite="nightly", config_path="", config_sha256="", engine="sim",
                   harness_version="0", protocol="clean", protocol_fingerprint=fingerprint,
                   started_at=f"2026-12-0{run_id[-1]}T02:00:00+00:00", ended_at=f"2026-12-0{run_id[-1]}T03:00:00+00:00",
                   counts=counts or {})


class MemoryArchive:
    """A RunArchive over dicts: runs oldest first, their cells, one answer per cell."""

    def __init__(self, runs: list[tuple[RunInfo, dict[str, Status]]],
                 evidence: dict[tuple[str, str], dict[str, tuple[int, float]]] | None = None,
                 nights: dict[tuple[str, str], dict[str, list[tuple[float, float, float]]]] | None = None) -> None:
        self.infos = [i for i, _ in runs]
        self.statuses = {i.run_id: cells for i, cells in runs}
        self.evidence = evidence or {}  # (run, cell) -> its evidence across nights as cells.jsonl keeps it
        self.nights = nights or {}  # (run, cell) -> the nights behind it (`evidence_nights`)

    def runs(self, suite: str) -> list[RunInfo]:
        return self.infos

    def cells(self, run_id: str) -> list[CellResult]:
        return [result(cell, status, reason="", evidence=self.evidence.get((run_id, cell), {}),
                       evidence_nights=self.nights.get((run_id, cell), {}))
                for cell, status in self.statuses[run_id].items()]

    def questions(self, run_id: str, cell_id: str) -> list[QuestionRecord]:
        return [answer(0, True, prompt_sha=run_id)]


def test_each_cell_pairs_with_its_own_last_run_that_was_not_a_regression_and_the_pinned_run():
    archive = MemoryArchive([(info("night-1"), {"a": Status.PASS, "b": Status.PASS, "c": Status.PASS}),
                             (info("night-2"), {"a": Status.FAIL, "b": Status.PASS, "c": Status.INCONCLUSIVE}),
                             (info("night-3", "other"), {"a": Status.PASS, "b": Status.PASS})])
    history = History.of(archive, "nightly", "fp", "night-4", pinned_run_id="night-1", pool=5)
    assert history.pinned_problem is None
    assert history.baseline("a").run_ids == ("night-1",)  # night-2 failed it; night-3 asked other questions
    assert history.baseline("b").run_ids == ("night-2", "night-1")
    # c's newest night was undecided: pooled by the paired test (a baseline of its passing nights
    # only would be its lucky launches), left out where the evidence across nights accumulates.
    assert history.baseline("c").run_ids == ("night-2", "night-1")
    assert history.baseline("c", before_streak=True).run_ids == ("night-1",)
    assert history.pinned("b")[0] == "night-1" and history.pinned("b")[1].questions[0].prompt_sha == "night-1"
    # The pin may be any night the cell was judged on answers and was not a regression in.
    assert History.of(archive, "nightly", "fp", "night-4", pinned_run_id="night-2").pinned("c")[0] == "night-2"


def test_an_undecided_night_that_leaned_to_a_drop_is_no_baseline_for_the_history_test():
    """A 3-point drop left undecided on its first night would enter the next night's baseline and
    hide itself; a healthy undecided night (evidence below 1) still enters it. Where the cell has a
    reference, its evidence against the reference decides: the history's own was measured against
    this baseline, and a night that leaned only against one lucky launch would keep that launch the
    baseline (f); a reference cell (r) has only the history's."""
    archive = MemoryArchive([(info("night-1"), {c: Status.PASS for c in "defr"}),
                             (info("night-2"), {c: Status.INCONCLUSIVE for c in "defr"})],
                            evidence={("night-2", "d"): {"reference": (1, 0.6), "history": (1, -0.2)},
                                      ("night-2", "e"): {"reference": (2, -0.4), "history": (2, -1.5)},
                                      ("night-2", "f"): {"reference": (1, -2.3), "history": (1, 2.9)},
                                      ("night-2", "r"): {"history": (1, 0.8)}})
    history = History.of(archive, "nightly", "fp", "night-3", pool=5)
    assert history.baseline("d").run_ids == ("night-1",)
    assert history.baseline("e").run_ids == ("night-2", "night-1")
    assert history.baseline("f").run_ids == ("night-2", "night-1")
    assert history.baseline("r").run_ids == ("night-1",)


def test_a_baseline_pools_the_newest_passing_runs():
    archive = MemoryArchive([(info(f"night-{k}"), {"a": Status.PASS}) for k in range(1, 8)])
    history = History.of(archive, "nightly", "fp", "night-8", pool=5)
    baseline = history.baseline("a")
    assert baseline.run_ids == ("night-7", "night-6", "night-5", "night-4", "night-3")
    assert [o.questions[0].prompt_sha for o in baseline.outcomes] == [f"night-{k}" for k in range(7, 2, -1)]
    assert History.of(archive, "nightly", "fp", "night-8").baseline("a").run_ids == ("night-7",)


def test_auto_pins_the_first_run_of_the_protocol_that_was_not_red():
    archive = MemoryArchive([
        (info("night-1", "old", {"pass": 3}), {"a": Status.PASS}),  # another protocol: another series
        (info("night-2", counts={"pass": 2, "fail": 1}), {"a": Status.PASS}),
        (info("night-3", counts={"pass": 2, "inconclusive": 1, "skipped": 2}), {"a": Status.PASS}),
        (info("night-4", counts={"pass": 3}), {"a": Status.PASS})])
    history = History.of(archive, "nightly", "fp", "night-5", pinned_run_id="auto")
    assert history.pinned_run.run_id == "night-3" and history.pinned("a")[0] == "night-3"
    assert History.of(archive, "nightly", "new", "night-5", pinned_run_id="auto").pinned_run is None


def test_a_pinned_run_that_cannot_be_paired_says_why():
    archive = MemoryArchive([(info("night-1"), {"a": Status.PASS}), (info("night-2", "other"), {"a": Status.PASS})])
    missing = History.of(archive, "nightly", "fp", "night-3", pinned_run_id="night-9")
    assert missing.pinned("a") is None and "is not a run of suite nightly" in missing.pinned_problem
    other = History.of(archive, "nightly", "fp", "night-3", pinned_run_id="night-2")
    assert other.pinned("a") is None and "asked other questions" in other.pinned_problem


class AnswersArchive(MemoryArchive):
    """The same, with each cell's answers in each run given."""

    def __init__(self, runs: list[tuple[RunInfo, dict[str, Status]]], right: dict[tuple[str, str], list[bool]]) -> None:
        super().__init__(runs)
        self.right = right

    def questions(self, run_id: str, cell_id: str) -> list[QuestionRecord]:
        return [answer(i, ok, prompt_sha=run_id) for i, ok in enumerate(self.right[run_id, cell_id])]


def test_the_cells_first_launches_night_to_night_are_launch_spread_samples_centred_on_the_models_mean():
    """Three cells in three runs: each pair of runs gives one sample of 2 degrees of freedom, its
    drops centred on their mean (a shift every cell shares is not spread); a failed cell is left out."""
    n = 100

    def right(correct: int) -> list[bool]:
        return [True] * correct + [False] * (n - correct)

    statuses = {"a": Status.PASS, "b": Status.INCONCLUSIVE, "c": Status.PASS}
    accuracy = {"night-1": {"a": 90, "b": 80, "c": 70}, "night-2": {"a": 86, "b": 78, "c": 70},
                "night-3": {"a": 80, "b": 80, "c": 66}}
    archive = AnswersArchive([(info(run), statuses if run != "night-3" else {**statuses, "b": Status.FAIL})
                              for run in accuracy],
                             {(run, cell): right(correct) for run, cells in accuracy.items() for cell, correct in cells.items()})
    history = History.of(archive, "nightly", "fp", "night-4", pool=5)
    newer, older = history.launch_samples("m", "flexible")  # night-3 vs night-2, then night-2 vs night-1
    # night-2 vs night-1: drops (of night-2 from night-1) 4, 2, 0 points; centred 2, 0, -2
    assert older.df == 2 and abs(older.between - (0.02**2 + 0.02**2) / 2) < 1e-12
    # each drop's sampling variance: its discordant share (nested answers: the drop itself) less the drop squared, over n
    variances = [(d - d * d) / n for d in (0.04, 0.02, 0.0)]
    assert abs(older.within - 2 / 6 * sum(variances)) < 1e-12
    assert newer.df == 1  # b failed on night-3: a and c only
    assert history.launch_samples("other", "flexible") == []
