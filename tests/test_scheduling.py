"""The scheduler's decisions, without Ray: priority order, learned durations, packing, reservation,
forecasts and the planned order."""

from __future__ import annotations

import itertools

import pytest

from harness.records import CellResult, Status, Timings
from harness.run.scheduling.durations import Durations
from harness.run.scheduling.forecast import Forecast, forecast, improve
from harness.run.scheduling.inventory import SLOT_PATIENCE_S
from harness.run.scheduling.placement import (
    Packer,
    longest_first,
    pick_gpus,
    priority_class,
    priority_order,
)
from harness.suite.config import Suite
from harness.suite.matrix import Cell, expand


def cells(models: list[dict], backends: tuple[str, ...] = ("triton", "fa3")) -> dict[str, Cell]:
    suite = Suite.model_validate({"suite": "s", "engine": "sglang", "models": models,
                                  "axes": {"attention_backend": list(backends)}})
    return expand(suite).by_id()


MODELS = [{"id": "one", "path": "a/one", "tp": 1}, {"id": "two", "path": "a/two", "tp": 2},
          {"id": "eight", "path": "a/eight", "tp": 8}, {"id": "typed", "path": "a/typed", "tp": 1, "gpu_type": "H100"}]
CELLS = cells(MODELS)


def history(cell_id: str, model: str, seconds: float, status: Status = Status.PASS, stopped: bool = False) -> CellResult:
    return CellResult(cell_id=cell_id, model=model, factors={}, args=[], resolved={}, status=status, reason="",
                      stopped_early=stopped, timings=Timings(started_at=100.0, ended_at=100.0 + seconds))


def node(packer: Packer, name: str, gpus: int, idle: int | None = None, types: frozenset[str] = frozenset()) -> None:
    packer.inventory.add_node(name, gpus, types)
    for gpu in range(gpus if idle is None else idle):
        packer.inventory.add_gpu(name, str(gpu))


# ---- durations ---------------------------------------------------------------------------------------
def test_durations_prefer_the_same_cell_then_this_runs_model_then_the_last_runs_model():
    durations = Durations([history("one.ab-triton", "one", 50), history("one.ab-fa3", "one", 5, stopped=True),
                           history("two.ab-triton", "two", 30)])
    assert durations.expect(CELLS["one.ab-triton"]) == 50
    assert durations.expect(CELLS["one.ab-fa3"]) == 5  # its own last duration, even stopped early
    assert durations.expect(CELLS["two.ab-fa3"]) == 30  # the model's, from the last run
    assert durations.expect(CELLS["eight.ab-fa3"]) is None
    durations.learn(CELLS["two.ab-triton"], 12, stopped_early=False)
    durations.learn(CELLS["two.ab-triton"], 1, stopped_early=True)  # a stopped cell says little of the others
    assert durations.expect(CELLS["two.ab-fa3"]) == 12  # this run (same machines, same build) wins


# ---- priority ------------------------------------------------------------------------------------------
def test_priority_puts_recent_failures_then_widest_each_reference_ahead_of_its_cells():
    durations = Durations([history("one.ab-fa3", "one", 500), history("two.ab-fa3", "two", 5)])
    order = [c.cell_id for c in priority_order(list(CELLS.values()), durations, first={"two.ab-fa3", "two.ab-triton"})]
    assert order[:2] == ["two.ab-triton", "two.ab-fa3"]  # failed last time, after its reference
    assert order[2:4] == ["eight.ab-triton", "eight.ab-fa3"]  # then the widest, reference first
    # Among one-GPU cells, the model with the longest cell first ("one": 500 s; "typed": typical).
    assert order[4:] == ["one.ab-triton", "one.ab-fa3", "typed.ab-triton", "typed.ab-fa3"]


# ---- placing -------------------------------------------------------------------------------------------
def test_a_cell_goes_to_the_node_it_fills_best():
    packer = Packer(Durations())
    node(packer, "roomy", 8)
    node(packer, "snug", 8, idle=2)
    (placement,) = packer.place([CELLS["two.ab-triton"]], now=0)
    assert placement.node == "snug" and placement.gpus == ("0", "1")


def test_between_equal_fits_the_node_that_loaded_the_model_wins_unless_turned_off():
    for prefer_warm, expected in ((True, "warm"), (False, "cold")):
        packer = Packer(Durations(), prefer_warm=prefer_warm)
        node(packer, "cold", 1)
        node(packer, "warm", 1)
        packer.inventory.loaded("warm", "one")
        (placement,) = packer.place([CELLS["one.ab-triton"]], now=0)
        assert placement.node == expected


def test_a_wide_cell_that_waits_is_not_starved_by_narrow_cells_of_unknown_length():
    packer = Packer(Durations())
    node(packer, "n", 8, idle=0)
    for gpu in range(6):  # six one-GPU cells hold the node; two GPUs come back idle
        packer.inventory.occupy(f"running-{gpu}", "n", (str(gpu),), 100.0, "other")
    packer.inventory.add_gpu("n", "6")
    packer.inventory.add_gpu("n", "7")
    queue = [CELLS["eight.ab-triton"], CELLS["one.ab-triton"], CELLS["one.ab-fa3"]]
    assert packer.place(queue, now=0) == []  # the node is reserved for the tp-8 cell


def test_narrow_cells_backfill_a_reserved_node_only_when_they_end_before_the_wide_cell_can_start():
    durations = Durations([history("one.ab-triton", "one", 10), history("one.ab-fa3", "one", 500)])
    packer = Packer(durations)
    node(packer, "n", 8, idle=2)
    for gpu in range(2, 8):
        packer.inventory.occupy(f"running-{gpu}", "n", (str(gpu),), 60.0, "other")  # the tp-8 cell fits at t=60
    queue = [CELLS["eight.ab-triton"], CELLS["one.ab-fa3"], CELLS["one.ab-triton"]]
    placed = [p.cell.cell_id for p in packer.place(queue, now=0)]
    assert placed == ["one.ab-triton"]  # 10 s ends before 60; 500 s would delay the tp-8 cell


def test_once_anything_is_known_a_cell_of_unknown_length_counts_as_typical_for_backfilling():
    packer = Packer(Durations([history("two.ab-triton", "two", 10)]))  # typical: 10 s
    node(packer, "n", 8, idle=2)
    for gpu in range(2, 8):
        packer.inventory.occupy(f"running-{gpu}", "n", (str(gpu),), 100.0, "other")
    queue = [CELLS["eight.ab-triton"], CELLS["one.ab-triton"]]
    assert [p.cell.cell_id for p in packer.place(queue, now=0)] == ["one.ab-triton"]
    packer = Packer(Durations([history("two.ab-triton", "two", 10)]))
    node(packer, "n", 8, idle=2)
    for gpu in range(2, 8):
        packer.inventory.occupy(f"running-{gpu}", "n", (str(gpu),), 5.0, "other")  # the tp-8 cell fits sooner
    assert packer.place(queue, now=0) == []


def test_slots_ray_is_still_starting_are_kept_for_the_wide_cells_ahead_of_narrow_ones():
    durations = Durations([history("one.ab-triton", "one", 10)])
    packer = Packer(durations)
    for name, idle in (("a", 2), ("b", 1)):  # slots come up one by one at the start of a run
        node(packer, name, 8, idle=idle)
        for _ in range(8 - idle):
            packer.inventory.ask_gpu(name, now=0)
    queue = [CELLS["eight.ab-triton"], CELLS["eight.ab-fa3"], CELLS["one.ab-triton"]]
    # Each tp-8 cell holds a node whose other slots are coming: the one-GPU cell takes neither.
    assert packer.place(queue, now=1) == []
    # Slots that never come (another job holds those GPUs) stop counting: a known cell may go.
    assert [p.cell.cell_id for p in packer.place(queue, now=SLOT_PATIENCE_S + 1)] == ["one.ab-triton"]


def test_gpus_the_reserved_cell_will_not_need_are_used_now():
    packer = Packer(Durations())
    node(packer, "n", 8, idle=3)
    packer.inventory.occupy("a", "n", ("3", "4"), 60.0, "other")
    packer.inventory.occupy("b", "n", ("5", "6", "7"), 100.0, "other")
    four = cells([{"id": "four", "path": "a/four", "tp": 4}, {"id": "two", "path": "a/two", "tp": 2},
                  {"id": "one", "path": "a/one", "tp": 1}])
    # The tp-4 cell fits at t=60 (3 idle + 2 back), leaving 1 GPU it will not need: a one-GPU cell
    # of unknown length may take it now; a two-GPU one would delay the tp-4 cell.
    queue = [four["four.ab-triton"], four["two.ab-triton"], four["one.ab-triton"]]
    assert [p.cell.cell_id for p in packer.place(queue, now=0)] == ["one.ab-triton"]


def test_a_typed_cell_runs_only_on_a_node_of_its_type_and_waits_for_one():
    packer = Packer(Durations())
    node(packer, "plain", 8)
    assert packer.place([CELLS["typed.ab-triton"]], now=0) == []
    assert not packer.could_hold(CELLS["typed.ab-triton"])
    node(packer, "h100", 8, types=frozenset({"H100"}))
    (placement,) = packer.place([CELLS["typed.ab-triton"]], now=0)
    assert placement.node == "h100"


def test_release_gives_the_gpus_back_and_a_node_that_left_is_forgotten_once_empty():
    packer = Packer(Durations())
    node(packer, "n", 8)
    placements = packer.place([CELLS["eight.ab-triton"]], now=0)
    assert packer.idle() == [] and packer.could_hold(CELLS["eight.ab-fa3"])
    packer.inventory.remove_node("n")  # still running there: kept
    assert packer.release(placements[0].cell.cell_id) == ("n", tuple(str(g) for g in range(8)))
    assert len(packer.idle()) == 8
    packer.inventory.remove_node("n")
    assert packer.idle() == [] and not packer.could_hold(CELLS["one.ab-triton"])


@pytest.mark.parametrize(("idle", "count", "expected"), [
    ({"0", "1", "2", "4", "5", "6", "7"}, 4, ("4", "5", "6", "7")),  # the whole aligned block
    ({"1", "2", "3", "4", "5"}, 4, ("1", "2", "3", "4")),  # no whole block: the lowest
    ({"1", "2", "3"}, 2, ("2", "3")),
    ({"3", "5"}, 1, ("3",)),
    ({"0", "1", "2"}, 3, ("0", "1", "2")),
])
def test_gpus_come_in_aligned_blocks_when_one_is_idle(idle, count, expected):
    assert pick_gpus(idle, count) == expected


# ---- forecast and plan -----------------------------------------------------------------------------------
FIVE = cells([{"id": "one", "path": "a/one", "tp": 1}], backends=("triton", "fa3", "flashinfer", "flashmla", "cutlass_mla"))


def test_forecast_plays_the_packer_forward_on_expected_durations():
    packer = Packer(Durations([history("eight.ab-triton", "eight", 10), history("eight.ab-fa3", "eight", 30)]))
    packer.inventory.add_node("n", 8)  # declared; no slot placed yet: the forecast counts them idle
    queue = [CELLS["eight.ab-triton"], CELLS["eight.ab-fa3"]]
    assert forecast(packer, queue, now=100) == Forecast(end=140, mean_end=25)  # ends 10 and 40 s from now
    packer.inventory.occupy("running", "n", tuple(str(g) for g in range(8)), 105.0, "other")  # the node is busy until 105
    assert forecast(packer, queue, now=100).end == 145
    assert forecast(Packer(Durations()), queue, now=100) is None  # nothing known: no forecast


def test_the_plan_ends_as_soon_as_any_order_would_and_keeps_the_reference_first():
    # Two GPUs; a reference of 2 s, then cells of 3, 3, 2, 2 s. Longest first ends at 7 s
    # (2+3+2 and 3+2, then the last 2); reference+2+2 on one GPU and 3+3 on the other end at 6.
    seconds = {"one.ab-triton": 2, "one.ab-fa3": 3, "one.ab-flashinfer": 3, "one.ab-flashmla": 2,
               "one.ab-cutlass_mla": 2}
    durations = Durations([history(cell_id, "one", value) for cell_id, value in seconds.items()])
    packer = Packer(durations)
    node(packer, "n", 2)
    start = priority_order(list(FIVE.values()), durations, set())
    reference, rest = start[0], start[1:]
    best = min(forecast(packer, [reference, *order], now=0) for order in itertools.permutations(rest))
    planned, expected = improve(packer, [start], now=0, priority_class=lambda c: priority_class(c, set()), tries=300)
    assert planned[0] is reference and sorted(c.cell_id for c in planned) == sorted(seconds)
    assert expected == forecast(packer, planned, now=0) == best
    assert (best.end, forecast(packer, start, now=0).end) == (6, 7)


def test_the_plan_never_moves_a_cell_ahead_of_its_reference():
    # One GPU: the forecast would rather run the two short cells first (their GPU-seconds start
    # sooner), but the paired tests need the reference, which must lead.
    seconds = {"one.ab-triton": 5, "one.ab-fa3": 1, "one.ab-flashinfer": 1}
    durations = Durations([history(cell_id, "one", value) for cell_id, value in seconds.items()])
    packer = Packer(durations)
    node(packer, "n", 1)
    start = priority_order([FIVE[cell_id] for cell_id in seconds], durations, set())
    shorter_first = [FIVE["one.ab-fa3"], FIVE["one.ab-flashinfer"], FIVE["one.ab-triton"]]
    assert forecast(packer, shorter_first, now=0) < forecast(packer, start, now=0)
    planned, _ = improve(packer, [start], now=0, priority_class=lambda c: priority_class(c, set()), tries=100)
    assert planned[0].cell_id == "one.ab-triton"


def test_longest_first_starts_long_narrow_cells_first_and_keeps_references_ahead():
    durations = Durations([history("one.ab-triton", "one", 60), history("one.ab-fa3", "one", 60),
                           history("eight.ab-triton", "eight", 10), history("eight.ab-fa3", "eight", 10)])
    queue = [CELLS["eight.ab-triton"], CELLS["eight.ab-fa3"], CELLS["one.ab-triton"], CELLS["one.ab-fa3"]]
    order = [c.cell_id for c in longest_first(queue, durations, first=set())]
    assert order == ["one.ab-triton", "one.ab-fa3", "eight.ab-triton", "eight.ab-fa3"]
    # A reference shorter than its cells still leads them; recent failures still come first.
    durations.learn(CELLS["one.ab-triton"], 5, stopped_early=False)
    order = [c.cell_id for c in longest_first(queue, durations, first={"eight.ab-fa3", "eight.ab-triton"})]
    assert order == ["eight.ab-triton", "eight.ab-fa3", "one.ab-triton", "one.ab-fa3"]


def test_planning_keeps_the_longest_first_start_when_the_width_phases_leave_a_long_narrow_cell_last():
    # One 8-GPU node: two tp-4 cells (30 s, 10 s) and a tp-2 cell of 60 s. Width phases run both tp-4
    # cells at once and start the tp-2 cell when the short one ends (10 + 60 = 70 s); longest first
    # starts it at once beside the 30 s cell, and the 10 s cell after that (60 s).
    matrix = cells([{"id": "two", "path": "a/two", "tp": 2}, {"id": "four", "path": "a/four", "tp": 4},
                    {"id": "quad", "path": "a/quad", "tp": 4}], backends=("triton",))
    seconds = {"two": 60, "four": 30, "quad": 10}
    durations = Durations([history(cell_id, cell.model.id, seconds[cell.model.id]) for cell_id, cell in matrix.items()])
    packer = Packer(durations)
    node(packer, "a", 8)
    widest = priority_order(list(matrix.values()), durations, set())
    longest = longest_first(list(matrix.values()), durations, set())
    assert (forecast(packer, widest, now=0).end, forecast(packer, longest, now=0).end) == (70, 60)
    planned, expected = improve(packer, [widest, longest], now=0, priority_class=lambda c: priority_class(c, set()),
                                tries=0)
    assert expected.end == 60 and planned == longest
