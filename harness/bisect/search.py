"""`regress bisect`: find the first commit at which one cell regresses, by binary search.

The good commit is probed once for the reference answers; every other probe runs the cell on one
commit's build and is judged by the gate's paired test against the good commit on the same
questions (fail = bad). The bad commit is taken on the user's word, so a history of N commits costs
1 + ceil(log2(N - 1)) probes (7 for 64). Each probe is a normal run of the one cell: with the sglang
engine the workers get that commit's build through the suite's Ray runtime_env; with the simulator
the world's `history` and bugs' `since_commit` decide what each commit does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.errors import ConfigError, ProbeError
from harness.records import CellOutcome


@dataclass(frozen=True)
class Probe:
    commit: str
    accuracy: float | None
    bad: bool
    reason: str


@dataclass(frozen=True)
class BisectResult:
    first_bad: str
    last_good: str
    probes: list[Probe]


def bisect_commits(commits: list[str], run_probe: Callable[[str], CellOutcome],
                   judge_probe: Callable[[CellOutcome, CellOutcome], tuple[bool, str, float | None]]) -> BisectResult:
    """`commits` oldest first: the first is known good, the last known bad."""
    if len(commits) < 2:
        raise ConfigError("bisect needs at least the good and the bad commit")
    good_outcome = run_probe(commits[0])
    if good_outcome.error or good_outcome.score is None:
        raise ProbeError(f"the good commit {commits[0]} could not be measured: {good_outcome.error}")
    probes = [Probe(commits[0], good_outcome.score.accuracy, False, "the good commit: reference answers")]
    low, high = 0, len(commits) - 1  # low is good, high is bad
    while high - low > 1:
        middle = (low + high) // 2
        outcome = run_probe(commits[middle])
        bad, reason, accuracy = judge_probe(outcome, good_outcome)
        probes.append(Probe(commits[middle], accuracy, bad, reason))
        if bad:
            high = middle
        else:
            low = middle
    return BisectResult(first_bad=commits[high], last_good=commits[low], probes=probes)
