"""Where the DLRM step's time goes on a GPU, and what the table update could be instead (issue #28 §2).

  python3 -m bench.gpu_dlrm_profile --device cuda --json profile.json     # criteo_f15 tables, batch 65536, AMP

One model at NVIDIA's criteo_f15 cardinalities, its dense layers compiled as the trainer does; then, on a batch
already on the device:
  profile     torch.profiler over 5 steps of today's step: the kernels that take the GPU's time, top first.
  updates     the whole step (forward, backward, dense SGD, table update) with the table update done each way:
                today        models.dlrm.model.Dlrm.apply_sparse_update (fp16 rows -> fp32, x 1/scale, isfinite)
                none         no table update at all: the ceiling any update can reach
                fused_scale  the rows' unscale and finite check in one compiled kernel, then one index_add_
                dedup        fused_scale, then duplicate ids summed first (unique + index_add_ into a compact
                             buffer), so the table's index_add_ touches each row once
                sorted       fused_scale, then ids sorted and equal ids' rows summed (segment_reduce)
                bf16         autocast bf16 (no loss scale, nothing to unscale), rows -> fp32, one index_add_
  loop        the trainer's default step (--amp_dtype auto, padded, compiled) with its batch already on the device,
              copied from pageable host memory before each step (the trainer until 2026-11-28, --no-copy_ahead),
              from pinned host memory before each step, and from pinned memory one step ahead on a side stream
              (the trainer's default since, models.torchkit.device_batches): how much of the trainer-vs-step gap
              (5.46M vs 6.31M on an H200) the copy explains.
  interaction the default step with the interaction's 1 + n_cat vectors padded by zero vectors to a multiple of 8
              before its bmm (27 -> 32: aligned batched GEMMs), beside the default: same output, checked first.
  update_cast the default step with its table update compiled: the bf16 gradient rows cast and added into the fp32
              table in one kernel (inductor's scatter-add), instead of a cast to an fp32 copy of all 1.7M rows and
              then index_add_; beside the default, same result checked first.
  ops         the table ops alone: the lookup (index_select), index_add_ of this batch's ids (skewed: the small
              tables' rows are hit thousands of times) and of as many distinct random rows.
--sections picks which run (default: all but updates, measured on 2026-11-28: docs/PERFORMANCE-gpu.md); the
profile is of the trainer's default step unless --profile_dtype fp16. One JSON line; the figures are what to choose
the trainer's next changes from.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any, Callable

import torch

from bench.gpu_dlrm import LR, NUM_NUMERICAL, cardinalities, device_name
from models.dlrm.model import DotInteraction
from models.torchkit.device_batches import ahead_on_device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn: Callable[[], None], warmup: int, iterations: int) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    started = time.perf_counter()
    for _ in range(iterations):
        fn()
    _sync(device)
    return (time.perf_counter() - started) / iterations


def _unscaled(grads: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """fp32 rows x 1/scale, all zero if any is not finite (one reduction and one pointwise pass when compiled)."""
    finite = torch.isfinite(grads.float().sum())
    return torch.where(finite, grads.float() * inv_scale, torch.zeros((), device=grads.device))


class RowPaddedInteraction(DotInteraction):
    """DotInteraction with its 1 + n_cat vectors padded by zero vectors to a multiple of 8 before the bmm: the same
    output (the pad rows' dots are never selected), computed by aligned batched GEMMs."""

    def __init__(self, num_categorical: int, embedding_dim: int, padded: bool) -> None:
        super().__init__(num_categorical, embedding_dim, padded)
        n = num_categorical + 1
        self.pad_rows = -(-n // 8) * 8 - n
        rows, cols = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("tril_flat", rows * (n + self.pad_rows) + cols, persistent=False)

    def forward(self, bottom_out: torch.Tensor, embeddings: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        if isinstance(embeddings, (list, tuple)):
            embeddings = torch.stack(embeddings, dim=1)
        batch, dim = bottom_out.shape
        stacked = torch.cat([bottom_out.unsqueeze(1), embeddings, bottom_out.new_zeros(batch, self.pad_rows, dim)],
                            dim=1)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))
        parts = [bottom_out, dots.flatten(1).index_select(1, self.tril_flat)]
        if self.padding:
            parts.append(bottom_out.new_zeros(batch, self.padding))
        return torch.cat(parts, dim=1)


SECTIONS = ("profile", "updates", "loop", "interaction", "update_cast", "ops")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from models.dlrm.config import DlrmConfig
    from models.dlrm.model import Dlrm
    from models.dlrm.train import compile_dense
    from models.torchkit.distributed import DistContext
    from tasks.core.progress import RankLog

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    cards = cardinalities(args.table_scale)
    batch = args.batch_size
    result: dict[str, Any] = {"bench": "gpu_dlrm_profile", "device": device_name(device), "torch": torch.__version__,
                              "batch_size": batch, "table_scale": args.table_scale}

    def note(**figures: Any) -> None:
        result.update(figures)
        print(json.dumps(figures), flush=True)
        if args.json is not None:
            args.json.write_text(json.dumps(result, sort_keys=True) + "\n")

    cfg = DlrmConfig(device=args.device, amp=True, lr=LR, compile=args.compile)
    with torch.device(device):
        model = Dlrm(NUM_NUMERICAL, cards)
    compile_dense(model, cfg, DistContext(0, 0, 1, device, None), RankLog(0))
    weight = model.embeddings.weight
    optimizer = torch.optim.SGD([p for n, p in model.named_parameters() if n != "embeddings.weight"], lr=LR)
    generator = torch.Generator(device=device).manual_seed(0)
    numerical = torch.randn(batch, NUM_NUMERICAL, device=device, generator=generator)
    categorical = torch.stack([torch.randint(0, c, (batch,), device=device, generator=generator) for c in cards],
                              dim=1)
    label = torch.randint(0, 2, (batch,), device=device, generator=generator).float()
    unscaled = torch.compile(_unscaled) if args.compile != "off" else _unscaled

    def update_today(ids: torch.Tensor, grads: torch.Tensor, inv: torch.Tensor | None) -> None:
        model.embeddings.pending.append((ids, grads))
        model.apply_sparse_update(LR, inv_scale=inv)

    def update_none(ids: torch.Tensor, grads: torch.Tensor, inv: torch.Tensor | None) -> None:
        return

    def _rows(grads: torch.Tensor, inv: torch.Tensor | None) -> torch.Tensor:
        return unscaled(grads, inv) if inv is not None else grads.float()

    def update_fused(ids: torch.Tensor, grads: torch.Tensor, inv: torch.Tensor | None) -> None:
        weight.data.index_add_(0, ids, _rows(grads, inv), alpha=-LR)

    def update_dedup(ids: torch.Tensor, grads: torch.Tensor, inv: torch.Tensor | None) -> None:
        unique, inverse = torch.unique(ids, return_inverse=True)
        summed = torch.zeros(unique.numel(), grads.shape[1], device=device).index_add_(0, inverse, _rows(grads, inv))
        weight.data.index_add_(0, unique, summed, alpha=-LR)

    def update_sorted(ids: torch.Tensor, grads: torch.Tensor, inv: torch.Tensor | None) -> None:
        order_ids, order = torch.sort(ids)
        unique, counts = torch.unique_consecutive(order_ids, return_counts=True)
        summed = torch.segment_reduce(_rows(grads, inv).index_select(0, order), "sum", lengths=counts, axis=0)
        weight.data.index_add_(0, unique, summed, alpha=-LR)

    updates = {"today": update_today, "none": update_none, "fused_scale": update_fused, "dedup": update_dedup,
               "sorted": update_sorted, "bf16": update_fused}

    def make_step(update: Callable[..., None], dtype: torch.dtype,
                  next_batch: Callable[[], tuple[torch.Tensor, ...]] | None = None) -> Callable[[], None]:
        """One training step with the table update done by `update`, on next_batch()'s rows (default: the batch
        already on the device)."""
        scaler = torch.amp.GradScaler(device.type) if (cuda and dtype == torch.float16) else None

        def step() -> None:
            numerical_, categorical_, label_ = next_batch() if next_batch is not None else (numerical, categorical,
                                                                                            label)
            with torch.autocast(device_type=device.type, dtype=dtype):
                logits = model(numerical_, categorical_)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), label_)
            optimizer.zero_grad(set_to_none=True)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            ids, grads = model.embeddings.take_pending()
            inv = scaler._scale.double().reciprocal().float() if scaler is not None else None  # noqa: SLF001
            update(ids, grads, inv)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
        return step

    from models.torchkit.distributed import amp_dtype as resolve_amp

    sections = set(args.sections.split(","))
    amp_dtype = torch.float16 if cuda else torch.bfloat16  # the updates section's baseline (fp16, as measured)
    default_dtype = resolve_amp(device, args.profile_dtype)
    today = make_step(update_today, default_dtype)
    _timed(device, today, warmup=5, iterations=1)  # compile
    if args.profile_steps and "profile" in sections:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(args.profile_steps):
                today()
            _sync(device)
        events = prof.key_averages()
        key = "self_cpu_time_total"
        if cuda:
            key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
        total = sum(getattr(e, key) for e in events) or 1.0
        top = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:args.top]
        note(profile_dtype=str(default_dtype), profile=[{"name": e.key[:90], "share": round(getattr(e, key) / total, 4),
                       "ms_per_step": round(getattr(e, key) / 1e3 / args.profile_steps, 3), "calls": e.count}
                      for e in top])
    steps: dict[str, Any] = {}
    for name, update in (updates.items() if "updates" in sections else ()):
        dtype = torch.bfloat16 if name == "bf16" else amp_dtype
        try:
            seconds = _timed(device, make_step(update, dtype), warmup=5, iterations=args.iterations)
            steps[name] = {"ms_per_step": round(seconds * 1e3, 3), "samples_per_second": round(batch / seconds)}
        except Exception as exc:  # noqa: BLE001 - a variant that fails is a figure too
            steps[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
        model.embeddings.pending = []
        print(json.dumps({"update": name, **steps[name]}), flush=True)
    if steps:
        note(updates=steps)

    def timed_figure(fn: Callable[[], None]) -> dict[str, Any]:
        try:
            seconds = _timed(device, fn, warmup=5, iterations=args.iterations)
            return {"ms_per_step": round(seconds * 1e3, 3), "samples_per_second": round(batch / seconds)}
        except Exception as exc:  # noqa: BLE001 - a variant that fails is a figure too
            return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
        finally:
            model.embeddings.pending = []

    def default_step_on(next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                        ) -> Callable[[], None]:
        """The trainer's default step (no loss scaler unless the default type is fp16) on next_batch()'s rows."""
        return make_step(update_today, default_dtype, next_batch)

    on_device = (numerical, categorical, label)
    if "loop" in sections:
        pin = cuda  # pinned host memory where there is a device to copy to
        pageable = tuple(t.cpu().clone() for t in (numerical, categorical.int(), label))
        host = tuple(t.pin_memory() if pin else t for t in pageable)

        def copied(source: tuple[torch.Tensor, ...] = host) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            n, c, y = (t.to(device, non_blocking=True) for t in source)
            return n, c.long(), y

        # The trainer's own mover: each batch copied (and cast) a step ahead on a side stream, on CUDA.
        ahead = ahead_on_device(itertools.repeat(host), copied, device)
        note(loop={"on_device": timed_figure(default_step_on(lambda: on_device)),
                   "h2d_pageable": timed_figure(default_step_on(lambda: copied(pageable))),
                   "h2d_copy": timed_figure(default_step_on(copied)),
                   "h2d_side_stream": timed_figure(default_step_on(lambda: next(ahead))),
                   "batch_bytes": int(sum(t.numel() * t.element_size() for t in host))})

    if "interaction" in sections:
        standard = model.interaction
        padded = RowPaddedInteraction(len(cards), model.embedding_dim, standard.padding > 0).to(device)
        probe = torch.randn(64, len(cards), model.embedding_dim, device=device)
        bottom = torch.randn(64, model.embedding_dim, device=device)
        same = bool(torch.allclose(padded(bottom, probe), standard(bottom, probe), atol=1e-4, rtol=1e-4))
        figures: dict[str, Any] = {"default": timed_figure(default_step_on(lambda: on_device)),
                                   "same_output": same, "pad_rows": padded.pad_rows}
        model.interaction = padded
        if args.compile != "off" and (args.compile == "on" or cuda):
            padded.compile()
        figures["rows_padded_bmm"] = timed_figure(default_step_on(lambda: on_device))
        model.interaction = standard
        note(interaction=figures)

    if "update_cast" in sections:
        def cast_add(table: torch.Tensor, ids: torch.Tensor, grads: torch.Tensor) -> None:
            table.index_add_(0, ids, grads.to(table.dtype), alpha=-LR)

        fused_cast_add = torch.compile(cast_add) if args.compile != "off" else cast_add
        probe = torch.randn(64, model.embedding_dim, device=device)
        probe_ids = torch.randint(0, 64, (512,), device=device, generator=generator)
        probe_rows = torch.randn(512, model.embedding_dim, device=device).to(default_dtype)
        expected, got = probe.clone(), probe.clone()
        cast_add(expected, probe_ids, probe_rows)
        fused_cast_add(got, probe_ids, probe_rows)

        def update_cast(ids: torch.Tensor, grads: torch.Tensor, inv: torch.Tensor | None) -> None:
            if inv is not None:  # fp16 with a loss scaler: the rows need unscaling first
                update_fused(ids, grads, inv)
            else:
                fused_cast_add(weight.data, ids, grads)

        note(update_cast={"default": timed_figure(default_step_on(lambda: on_device)),
                          "same_result": bool(torch.allclose(got, expected, atol=1e-5, rtol=1e-5)),
                          "compiled_cast_add": timed_figure(make_step(update_cast, default_dtype))})

    if "ops" not in sections:
        return result
    ids = (categorical + model.embeddings.offsets).reshape(-1)
    rows = torch.randn(ids.numel(), weight.shape[1], device=device)
    distinct = torch.randint(0, weight.shape[0], (ids.numel(),), device=device, generator=generator)
    with torch.no_grad():
        ops = {
            "lookup_index_select": _timed(device, lambda: weight.index_select(0, ids), 3, args.iterations),
            "index_add_batch_ids": _timed(device, lambda: weight.data.index_add_(0, ids, rows, alpha=-1e-9), 3,
                                          args.iterations),
            "index_add_random_ids": _timed(device, lambda: weight.data.index_add_(0, distinct, rows, alpha=-1e-9), 3,
                                           args.iterations),
        }
    note(ops_ms={k: round(v * 1e3, 3) for k, v in ops.items()}, rows_per_step=int(ids.numel()))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--table_scale", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=65536)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--profile_steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--compile", default="auto", choices=("auto", "on", "off"))
    parser.add_argument("--profile_dtype", default="auto", choices=("auto", "bf16", "fp16"),
                        help="the type of the profiled step, the loop and interaction sections (auto: the trainer's)")
    parser.add_argument("--sections", default="profile,loop,interaction,update_cast,ops",
                        help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--json", type=Path, default=None)
    return measure(parser.parse_args(argv))


if __name__ == "__main__":
    main()
