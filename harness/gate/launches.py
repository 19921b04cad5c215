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

with a chi-square interval on `sum between` (the questions' part held fixed).

Night to night, each cell's first launch is a launch made whatever its answers too: a model's C cells
judged in two runs give `centred_sample` (C - 1 degrees of freedom a pair of runs, where a run's
second launches give one a model). Their drops are centred on the cells' mean (a build shift common
to every cell is the history test's to judge, not spread); what a new build moves in one cell and not
the others is counted as spread, so night to night reads high where builds differ, never low. A suite's own
`launch_sd` is a prior worth PRIOR_DF degrees of freedom that the gate weighs in with the
measurement, and that only raises it (`spread_for_gate`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from harness.records import LaunchSample, QuestionRecord

PRIOR_DF = 8  # degrees of freedom the suite's prior `launch_sd` counts for beside the measurement
REMEMBERED = 512  # `Answers.pooled` results kept (oldest dropped first)
_REMEMBERED: dict[tuple, tuple[list, Answers]] = {}


@dataclass(frozen=True, eq=False)
class Answers:
    """One side of a paired test: per question, the share of its launches that answered it right,
    and which launches answered it (each launch adds its own shift: the launch term of the variance).
    Held as arrays: `questions` (sorted question indices), `right` (their shares), and one entry per
    answer, `answer_question` (its position in `questions`), `answer_value` (1 right, 0 wrong) and
    `answer_launch` (its launch's number within this side)."""

    questions: np.ndarray
    right: np.ndarray
    answer_question: np.ndarray
    answer_value: np.ndarray
    answer_launch: np.ndarray

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
        strict = extraction == "strict"
        index, value, launch = [], [], []
        for run, records in enumerate(runs):
            answered = [r for r in records if r.error is None]
            index += [r.index for r in answered]
            value += [r.correct_strict for r in answered] if strict else [r.correct for r in answered]
            launch += [(run << 20) + r.launch for r in answered]  # a launch is (run, launch) of the pool
        launch_ids = np.unique(np.array(launch, dtype=np.int64), return_inverse=True)[1]
        answers = cls.from_arrays(np.array(index, dtype=np.int64), np.array(value, dtype=float), launch_ids)
        if len(_REMEMBERED) >= REMEMBERED:
            _REMEMBERED.pop(next(iter(_REMEMBERED)))
        _REMEMBERED[key] = (list(runs), answers)  # the lists are held, so their ids stay theirs
        return answers

    @classmethod
    def from_arrays(cls, index: np.ndarray, value: np.ndarray, launch: np.ndarray) -> Answers:
        questions, position = np.unique(index, return_inverse=True)
        counts = np.bincount(position, minlength=len(questions))
        right = np.bincount(position, weights=value, minlength=len(questions)) / np.maximum(counts, 1)
        return cls(questions, right, position, value, launch)

    @classmethod
    def binary(cls, right: dict[int, bool]) -> Answers:
        index = np.array(sorted(right), dtype=np.int64)
        return cls.from_arrays(index, np.array([float(right[i]) for i in index], dtype=float),
                               np.zeros(len(index), dtype=np.int64))

    def only(self, keep: np.ndarray) -> Answers:
        """The same answers on the questions `keep` (a boolean mask over `questions`) holds."""
        answer_kept = keep[self.answer_question]
        return Answers.from_arrays(self.questions[self.answer_question[answer_kept]], self.answer_value[answer_kept],
                                   self.answer_launch[answer_kept])

    @property
    def n(self) -> int:
        return len(self.questions)

    @property
    def total(self) -> float:
        return float(self.right.sum())

    @property
    def launches(self) -> float:
        """Its effective number of launches over all its questions (`effective_launches`)."""
        return self.effective_launches(np.ones(self.n, dtype=bool))

    @property
    def launch_count(self) -> int:
        return int(len(np.unique(self.answer_launch))) if len(self.answer_launch) else 0

    def effective_launches(self, shared: np.ndarray) -> float:
        """How many launches the mean over the questions `shared` (a boolean mask over `questions`)
        averages, as its launch variance sees it: 1 / sum_l w_l^2, w_l the share of the mean that
        launch l's answers make up. k launches on the same questions: k; two launches on two halves
        of the questions (an extension): 2; one launch on 400 and another on 2,238 questions: 1.34."""
        count = int(shared.sum())
        if count == 0 or len(self.answer_launch) == 0:
            return 1.0
        per_question = np.bincount(self.answer_question, minlength=self.n)
        answer_shared = shared[self.answer_question]
        weights = np.bincount(self.answer_launch[answer_shared],
                              weights=1.0 / per_question[self.answer_question[answer_shared]])
        return float(1.0 / np.sum((weights / count) ** 2))

    @property
    def is_binary(self) -> bool:
        """Every question answered once, right or wrong: the exact paired tests apply."""
        return len(self.answer_question) == self.n and bool(np.all((self.right == 0) | (self.right == 1)))


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


def drop_with_variance(losses: float, gains: float, n: int) -> tuple[float, float, int]:
    """(d, v, n) of a paired drop on n shared questions (`centred_sample`): its sampling variance
    from the discordance, as the paired tests compute it."""
    drop = (losses - gains) / n
    return drop, max((losses + gains) / n - drop * drop, 0.0) / n, n


def centred_sample(drops: list[tuple[float, float, int]]) -> LaunchSample | None:
    """One model's cells judged in two runs, their first launches paired: per cell (d, v, n), the
    paired drop, its sampling variance (discordance) and the shared questions. Each d varies by
    2 sd^2 + v (one launch a side); centred on their mean, sum (d - mean)^2 has expectation
    (C - 1) / C * sum (2 sd^2 + v) for C cells. As a launch sample (halved, as two launches' sum of
    squared deviations from their mean is half their difference squared): `between` = sum (d - mean)^2
    / 2, `within` = (C - 1) / (2 C) sum v, C - 1 degrees of freedom. None for fewer than two cells."""
    if len(drops) < 2:
        return None
    count = len(drops)
    centre = sum(d for d, _, _ in drops) / count
    return LaunchSample(df=count - 1, between=sum((d - centre) ** 2 for d, _, _ in drops) / 2,
                        within=(count - 1) / (2 * count) * sum(v for _, v, _ in drops), n=min(n for _, _, n in drops))


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


def churn_floor(samples: list[LaunchSample], confidence: float = 0.95) -> float:
    """A model's answer churn, at its one-sided lower confidence bound: per question, the variance of
    one launch's answer around what its configuration answers on average, the mean over questions
    (two launches of a configuration disagree on about twice that share of questions). From launches
    made whatever their answers (`launch_sample`: a reference's second launch): each sample's
    per-question variances sum to within n^2 / df, and pooled over the samples' questions they give
    the estimate. Bounded as a count of disagreements (twice that sum: a pair's disagreements
    exactly), Poisson. 0 without a sample: nothing is then taken for churn (harness.gate.evidence)."""
    from scipy.stats import chi2

    total = sum(sample.within * sample.n**2 / sample.df for sample in samples if sample.df > 0)
    questions = sum(sample.n for sample in samples if sample.df > 0)
    if questions == 0 or total <= 0:
        return 0.0
    disagreements = 2 * total
    low = float(chi2.ppf(1 - confidence, 2 * disagreements)) / 2
    return low / 2 / questions


def churn_variance(mine: Answers, other: Answers, churn: float, other_fresh: bool) -> float:
    """What answer churn (`churn_floor`) adds to the variance of the paired drop of `mine` against
    `other` on the questions both answered, from `mine`'s launches and (`other_fresh`) the other
    side's: per question churn / (the launches that answered it), summed, over n^2. A night's own
    launches make this part; no other night shares it (harness.gate.evidence)."""
    if churn <= 0:
        return 0.0
    _, in_mine, in_other = np.intersect1d(mine.questions, other.questions, assume_unique=True, return_indices=True)
    n = len(in_mine)
    if n == 0:
        return 0.0
    part = np.sum(1.0 / np.bincount(mine.answer_question, minlength=mine.n)[in_mine])
    if other_fresh:
        part += np.sum(1.0 / np.bincount(other.answer_question, minlength=other.n)[in_other])
    return float(churn * part / n**2)


def spread_for_gate(prior: float, estimate: SpreadEstimate | None) -> float:
    """The launch spread the paired tests add: the measurement, with the suite's prior (`launch_sd`)
    counted as PRIOR_DF degrees of freedom of it, and never under the measurement.

    A moment estimate on a few degrees of freedom often reads far under the truth (DeepSeek-V2-Lite's
    3 PR cells: 0.0-0.4 point for a true 0.5 on the nights that went red on it, session 33), and a
    paired test that takes it as known then fails a healthy cell more often than its alpha. Weighing
    the prior in (the variances weighed by their degrees of freedom: the scale of the posterior a
    scaled inverse chi-square prior on PRIOR_DF degrees of freedom gives) keeps a low reading from
    taking the launch term away, and lets the measurement carry the gate as its degrees of freedom
    grow (at 3 x PRIOR_DF, three quarters of the weight).
    Only ever raised by the prior: a spread measured above it is used as measured, as a prior too low
    for the fleet must not hide launches that move more than it says."""
    if estimate is None:
        return prior
    blended = (PRIOR_DF * prior**2 + estimate.df * estimate.sd**2) / (PRIOR_DF + estimate.df)
    return math.sqrt(max(blended, estimate.sd**2))
