"""models.common.checkpoint_clock: when the trainers checkpoint (by steps, by minutes on the main process's clock)."""
from __future__ import annotations

import pytest

from models.common.checkpoint_clock import CheckpointClock


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _due_steps(clock: CheckpointClock, fake: FakeClock, steps: range, seconds_per_step: float) -> list[int]:
    due = []
    for step in steps:
        fake.now += seconds_per_step
        if clock.due(step):
            due.append(step)
            clock.saved()
    return due


def test_a_step_interval_alone_saves_on_its_multiples() -> None:
    fake = FakeClock()
    clock = CheckpointClock(25, 0, 10, clock=fake)
    assert _due_steps(clock, fake, range(1, 101), 60.0) == [25, 50, 75, 100]
    assert clock.describe() == "every 25 steps"


def test_a_time_interval_saves_at_the_first_log_interval_after_it_passed() -> None:
    fake = FakeClock()
    clock = CheckpointClock(0, 1, 10, clock=fake)  # 1 minute; 7 s a step: 60 s pass during step 9
    assert _due_steps(clock, fake, range(1, 41), 7.0) == [10, 20, 30, 40]
    fake = FakeClock()
    clock = CheckpointClock(0, 1, 10, clock=fake)  # 2.5 s a step: 60 s pass at step 24, checked at 30
    assert _due_steps(clock, fake, range(1, 61), 2.5) == [30, 60]
    assert clock.describe() == "every 1 min"


def test_any_checkpoint_restarts_the_time_interval_and_both_intervals_combine() -> None:
    fake = FakeClock()
    clock = CheckpointClock(40, 1, 10, clock=fake)  # 2.5 s a step, 60 s = 24 steps, checked every 10
    # 30 by time (75 s since the start); 40 by steps; 70 by time, counted from 40 (from 30 it would have been 60)
    assert _due_steps(clock, fake, range(1, 81), 2.5) == [30, 40, 70, 80]
    assert clock.describe() == "every 40 steps and every 1 min"
    assert CheckpointClock(0, 0, 10).describe() == "only at the end"
    assert not any(CheckpointClock(0, 0, 10).due(step) for step in range(1, 100))


def test_the_main_process_decides_and_every_process_asks_at_the_same_steps() -> None:
    fake = FakeClock()
    asked = []
    decisions = iter([False, True, False])

    def agree(mine: bool) -> bool:  # what a broadcast from the main process gives another rank: not its own answer
        asked.append(mine)
        return next(decisions)

    clock = CheckpointClock(0, 1, 10, agree=agree, is_main=False, clock=fake)
    fake.now += 3600  # this process's own clock says due: it is not asked for its own answer
    assert [step for step in range(1, 31) if clock.due(step)] == [20]
    assert asked == [False, False, False]  # asked at 10, 20 and 30, each time without a vote of its own


def test_bad_intervals_are_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        CheckpointClock(-1, 0, 10)
    with pytest.raises(ValueError, match="check interval 0"):
        CheckpointClock(0, 1, 0)


def _clock_rank(rank: int, out_dir: str) -> None:
    """Rank 0's clock is always due, rank 1's never (the other way round from step 20): each rank records what the
    trainer's clock (broadcast_from_main over gloo) decided at each check."""
    import json

    import torch

    from models.torchkit.distributed import DistContext, broadcast_from_main

    ctx = DistContext(rank, rank, 2, torch.device("cpu"), "gloo")
    fake = FakeClock()
    clock = CheckpointClock(0, 1, 10, agree=lambda due: broadcast_from_main(ctx, due), is_main=ctx.is_main,
                            clock=fake)
    decided = []
    for step in range(1, 41):
        fake.now += 3600 if (rank == 0) == (step <= 20) else 0  # whose own clock says "due" swaps at step 20
        if clock.due(step):
            decided.append(step)
            clock.saved()
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(decided, f)


def test_every_rank_saves_when_rank_0_s_clock_says_so_and_only_then(tmp_path) -> None:
    import json

    from tests.ranks import spawn_ranks

    spawn_ranks(_clock_rank, tmp_path)
    decided = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert decided == [[10, 20], [10, 20]]  # rank 1's own clock (due from step 21) is never asked
