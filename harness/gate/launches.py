"""Launches: what moves a cell between server launches beyond its questions (pure).

A launch of a server answers the questions; another launch of the same configuration answers some of
them otherwise (non-deterministic kernels, autotuning, another node), and its accuracy as a whole may
sit a little higher or lower: that whole-launch shift is the *launch spread* (an sd, `launch_sd`).
It does not shrink with more questions, only with more launches: a cell judged on k launches against
a side of m launches carries launch_sd^2 (1/k + 1/m) in its paired drop's variance.

The spread is measured, not assumed, from launches made whatever their answers: each reference's
second launch with gate.measure_launch_spread (harness.run.relaunch). A relaunch of an undecided
cell is no sample: it was made *because* its first launch looked low, and the two launches then
differ by more than launches do (measured: 0.61 points for a true 0.5 over 20 simulated nightlies,
benchmarks/gate_calibration.py). A cell's unselected launches give a `LaunchSample`: on the questions
all of them answered, the sum of squared deviations of the launches' accuracies from their mean
(`between`, launches - 1 degrees of freedom) and the part the questions' own chance explains
(`within`: per question, the variance of its answers over the launches, summed over questions and
divided by n^2; its expectation when launches differ only question by question). Pooled over cells and
runs (one-way random effects, moment estimate):

    launch_sd^2 = (sum between - sum within) / sum df          (floored at 0)

with a chi-square interval on `sum between` (the questions' part held fixed). A suite's own
`launch_sd` is the prior the gate uses while the pooled samples have fewer than `MIN_DF` degrees of
freedom (`spread_for_gate`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from harness.records import LaunchSample, QuestionRecord

MIN_DF = 8  # pooled degrees of freedom from which the measurement replaces the suite's prior
REMEMBERED = 512  # `Answers.pooled` results kept (oldest dropped first)
_REMEMBERED: dict[tuple, tuple[list, Answers]] = {}


@dataclass(frozen=True)
class Answers:
    """One side of a paired test: per question, the share of its launches that answered it right,
    and which launches answered it (each launch adds its own shift: the launch term of the variance)."""

    right: dict[int, float]
    members: dict[int, tuple] = field(default_factory=dict)  # question -> its launches' keys; {}: one launch

    @classmethod
    def of(cls, records: list[QuestionRecord], extraction: str) -> Answers:
        """Answered questions only (a transport failure is no answer), grouped over launches."""
        return cls.pooled([records], extraction)

    @classmethod
    def pooled(cls, runs: list[list[QuestionRecord]], extraction: str) -> Answers:
        """Several runs' records of one cell, each run's launches launches of the pool. Remembered
        for the same lists (a reference is paired with each of its cells, a baseline at each stage)."""
        key = (tuple(id(records) for records in runs), tuple(len(records) for records in runs), extraction)
        kept = _REMEMBERED.get(key)
        if kept is not None and all(a is b for a, b in zip(kept[0], runs, strict=True)):
            return kept[1]
        totals: dict[int, list[float]] = defaultdict(list)
        members: dict[int, list] = defaultdict(list)
        for run, records in enumerate(runs):
            for record in records:
                if record.error is None:
                    totals[record.index].append(float(record.correct_strict if extraction == "strict" else record.correct))
                    members[record.index].append((run, record.launch))
        answers = cls({index: sum(values) / len(values) for index, values in totals.items()},
                      {index: tuple(keys) for index, keys in members.items()})
        if len(_REMEMBERED) >= REMEMBERED:
            _REMEMBERED.pop(next(iter(_REMEMBERED)))
        _REMEMBERED[key] = (list(runs), answers)  # the lists are held, so their ids stay theirs
        return answers

    @classmethod
    def binary(cls, right: dict[int, bool]) -> Answers:
        return cls({index: float(value) for index, value in right.items()})

    @property
    def launches(self) -> float:
        """Its effective number of launches over all its questions (`effective_launches`)."""
        return self.effective_launches(self.right.keys())

    def effective_launches(self, questions) -> float:
        """How many launches the mean over `questions` averages, as its launch variance sees it:
        1 / sum_l w_l^2, w_l the share of the mean that launch l's answers make up. k launches on
        the same questions: k; two launches on two halves of the questions (an extension): 2; one
        launch on 400 and another on 2,238 questions: 1.34."""
        if not self.members:
            return 1.0
        weights: dict = defaultdict(float)
        count = 0
        for question in questions:
            keys = self.members.get(question, ())
            for launch in keys:
                weights[launch] += 1 / len(keys)
            count += bool(keys)
        if not count:
            return 1.0
        return 1 / sum((weight / count) ** 2 for weight in weights.values())

    @property
    def is_binary(self) -> bool:
        """Every question answered once, right or wrong: the exact paired tests apply."""
        return all(value in (0.0, 1.0) for value in self.right.values()) and \
            all(len(keys) == 1 for keys in self.members.values())


def launch_sample(records: list[QuestionRecord], extraction: str) -> LaunchSample | None:
    """The cell's launches in one run as a launch-spread sample; None with fewer than two launches
    or no question every launch answered."""
    by_launch: dict[int, dict[int, float]] = defaultdict(dict)
    for record in records:
        if record.error is None:
            by_launch[record.launch][record.index] = float(
                record.correct_strict if extraction == "strict" else record.correct)
    if len(by_launch) < 2:
        return None
    shared = set.intersection(*(set(answers) for answers in by_launch.values()))
    if not shared:
        return None
    k, n = len(by_launch), len(shared)
    accuracies = [sum(answers[q] for q in shared) / n for answers in by_launch.values()]
    mean = sum(accuracies) / k
    between = sum((a - mean) ** 2 for a in accuracies)
    # Per question, the unbiased variance of its answers over the k launches; a launch's accuracy
    # then varies by their sum / n^2 from the questions alone, and `between` by (k - 1) times that.
    per_question = 0.0
    for q in shared:
        values = [answers[q] for answers in by_launch.values()]
        centre = sum(values) / k
        per_question += sum((v - centre) ** 2 for v in values) / (k - 1)
    return LaunchSample(df=k - 1, between=between, within=(k - 1) * per_question / n**2, n=n)


@dataclass(frozen=True)
class SpreadEstimate:
    """The pooled launch spread: its moment estimate and a two-sided interval (sds, fractions)."""

    sd: float
    low: float
    high: float
    df: int
    confidence: float = 0.9

    def describe(self) -> str:
        return (f"launch spread {self.sd * 100:.2f} pts ({self.confidence:.0%} CI {self.low * 100:.2f}-"
                f"{self.high * 100:.2f}, {self.df} df)")


def pooled_spread(samples: list[LaunchSample], confidence: float = 0.9) -> SpreadEstimate | None:
    """The moment estimate over `samples` (module docstring); None without a degree of freedom."""
    df = sum(sample.df for sample in samples)
    if df == 0:
        return None
    between = sum(sample.between for sample in samples)
    within = sum(sample.within for sample in samples)
    from scipy.stats import chi2

    tail = (1 - confidence) / 2
    low_total = between * df / float(chi2.ppf(1 - tail, df))
    high_total = between * df / float(chi2.ppf(tail, df))

    def sd(total: float) -> float:
        return math.sqrt(max(total - within, 0.0) / df)

    return SpreadEstimate(sd=sd(between), low=sd(low_total), high=sd(high_total), df=df, confidence=confidence)


def spread_for_gate(prior: float, estimate: SpreadEstimate | None) -> float:
    """The launch spread the paired tests add: the measurement once it rests on MIN_DF degrees of
    freedom, else the larger of the suite's prior (`launch_sd`) and what has been measured so far."""
    if estimate is None:
        return prior
    if estimate.df >= MIN_DF:
        return estimate.sd
    return max(prior, estimate.sd)
