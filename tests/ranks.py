"""Two (or more) real processes joined in one gloo process group, for tests of collective code.

`spawn_ranks(fn, out_dir, *args)` runs `fn(rank, out_dir, *args)` in `nprocs` spawned processes (torch's own
`torch.multiprocessing.spawn`), each a member of one gloo group initialised from a file store in `out_dir` (one
call per `out_dir`: the store file stays); `fn` writes what the test checks under `out_dir`.

Each process leaves with `os._exit(0)` once every rank has passed a final barrier, skipping the teardown of the
group and of the interpreter: torch 2.13's CPU processes abort now and then while tearing down ("terminate called
without an active exception", SIGABRT; one process in one CI run of this suite; docs/scale_out.md "The abort at
exit" for the trainer's side of it). A test of what the ranks compute would fail on a crash after the computation. A
crash before the barrier (or `fn` raising) still fails the test: spawn reports it and stops the other ranks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any


def spawn_ranks(fn: Callable[..., None], out_dir: Path, *args: Any, nprocs: int = 2) -> None:
    import torch.multiprocessing

    torch.multiprocessing.spawn(_rank_main, args=(fn, str(out_dir), nprocs, args), nprocs=nprocs)


def _rank_main(rank: int, fn: Callable[..., None], out_dir: str, nprocs: int, args: tuple[Any, ...]) -> None:
    import torch.distributed as dist

    # A collective one rank never joins (a regression) fails in two minutes, not gloo's default thirty.
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=nprocs,
                            timeout=timedelta(minutes=2))
    fn(rank, out_dir, *args)
    dist.barrier()  # every rank's collectives are done: none waits on a peer that leaves now
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
