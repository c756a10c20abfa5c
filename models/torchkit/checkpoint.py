"""Training checkpoints: atomic writes by rank 0, a pointer to the newest one, a loader that never runs pickled code.

Layout under a run's output dir:
  checkpoints/step_00001000.pt   one file per saved step
  checkpoints/latest             text file naming the newest complete step file (no symlink: S3/FUSE-safe)

Everything we store is a tensor, dict, list, int, float, str, bool or None, so `torch.load(weights_only=True)` can
read it back; a file that needs anything else (a pickled object, a class) is rejected, not executed.

A run's final checkpoint is not written twice: the trainer writes model.pt with a "checkpoint" section (optimizer,
schedule, RNG, records) and `link_checkpoint` makes the step file a hard link to it (a copy where the filesystem
has no hard links). `load_checkpoint` reads such a model file as a checkpoint.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import shutil
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tasks.core.storage import atomic_file, write_text_atomic

log = logging.getLogger(__name__)

CHECKPOINT_KIND = "recflow.checkpoint"
MODEL_KIND = "recflow.model"
FORMAT_VERSION = 1
LATEST_POINTER = "latest"
_STEP_FILE = re.compile(r"^step_(\d{8,})\.pt$")


class CheckpointError(ValueError):
    """A file that is not a readable recflow checkpoint / model file (message is one line naming the file)."""


def checkpoint_file(directory: Path, step: int) -> Path:
    return directory / f"step_{step:08d}.pt"


def write_torch_atomic(path: Path, payload: dict[str, Any], checksum_of: dict[str, torch.Tensor] | None = None
                       ) -> str | None:
    """torch.save into a temporary sibling, fsync, rename over `path`: readers never see half a file.

    checksum_of: CPU tensors the payload holds; their `state_checksum` is computed in a thread while the file is
    written (hashlib and the writer both release the GIL), and returned."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        digest = pool.submit(state_checksum, checksum_of) if checksum_of is not None else None
        with atomic_file(path, "wb") as f:
            torch.save(payload, f)
        _fsync_directory(path.parent)
        return digest.result() if digest is not None else None


def host_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state's tensors in host memory (a host tensor is not copied), detached. Entries of one type that are
    views covering one device storage together (the DLRM's per-table entries of its joint table) become views of
    one host copy of it: torch.save then writes it once as one storage, and a loader can map it back as one tensor
    (models.dlrm.model._joint_view) where a copy per entry would make it join the tables again. Anything else is
    copied entry by entry."""
    def storage_of(value: torch.Tensor) -> tuple[str, int, torch.dtype] | None:
        if value.device.type == "cpu" or not value.numel():
            return None
        return str(value.device), value.untyped_storage().data_ptr(), value.dtype

    views: dict[tuple[str, int, torch.dtype] | None, list[torch.Tensor]] = {}
    for value in state.values():
        views.setdefault(storage_of(value), []).append(value)
    # device storages that two or more views of one type cover exactly: each copied once, whole
    shared: dict[Any, torch.UntypedStorage | None] = {
        where: None for where, group in views.items() if where is not None and len(group) > 1
        and sum(v.numel() * v.element_size() for v in group) == group[0].untyped_storage().nbytes()}
    host = {}
    for key, value in state.items():
        value, where = value.detach(), storage_of(value)
        if where not in shared:
            host[key] = value.cpu()
            continue
        if shared[where] is None:
            shared[where] = value.untyped_storage().cpu()
        host[key] = torch.empty(0, dtype=value.dtype, device="cpu").set_(shared[where], value.storage_offset(),
                                                                         value.size(), value.stride())
    return host


def state_checksum(state: dict[str, torch.Tensor]) -> str:
    """sha256 over (name, raw bytes) of every tensor in key order: the identity of a set of weights. The tensors
    are hashed in place (a CPU tensor is not copied; another device's is copied to the CPU once)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        flat = tensor.detach().cpu().contiguous().view(-1)
        digest.update(memoryview(flat.view(torch.uint8).numpy()))
    return digest.hexdigest()


_FINGERPRINT_CHUNK = 1 << 24


@torch.no_grad()
def device_fingerprint(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """Two wrapping int64 sums per tensor (of its 32-bit words, and of their squares), computed where the tensors
    are: equal on two ranks iff (with overwhelming likelihood) their weights are bit-identical, without copying
    them to the host. Exact integer arithmetic, so the order of the reduction cannot make equal weights differ."""
    sums = []
    for _, tensor in sorted(state.items()):
        flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
        pad = (-flat.numel()) % 4
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad)])
        words = flat.view(torch.int32)
        first = torch.zeros((), dtype=torch.int64, device=words.device)
        second = torch.zeros((), dtype=torch.int64, device=words.device)
        for start in range(0, words.numel(), _FINGERPRINT_CHUNK):
            chunk = words[start:start + _FINGERPRINT_CHUNK].to(torch.int64)
            first += chunk.sum()
            second += (chunk * chunk).sum()
        sums += [first, second]
    return torch.stack(sums) if sums else torch.zeros(0, dtype=torch.int64)


def _fsync_directory(directory: Path) -> None:
    # The rename is only durable once the directory entry is on disk (matters for power loss, not for kills).
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory: Path, step: int, state: dict[str, Any], keep_last: int = 3) -> Path:
    """Write `state` as checkpoint `step`, point `latest` at it, and delete all but the newest `keep_last` files.

    Call on rank 0 only. The pointer is written after the step file, so it always names a complete file.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_file(directory, step)
    write_torch_atomic(path, {"kind": CHECKPOINT_KIND, "version": FORMAT_VERSION, "step": step, **state})
    write_text_atomic(directory / LATEST_POINTER, path.name + "\n")
    _prune(directory, path, keep_last)
    return path


def link_checkpoint(directory: Path, step: int, source: Path, keep_last: int = 3) -> Path:
    """Make checkpoint `step` the file `source` (a model file holding a checkpoint section) without writing its
    bytes again: a hard link, or a copy where the filesystem has none. Then as save_checkpoint: pointer, pruning."""
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_file(directory, step)
    staged = directory / f".tmp-link-{path.name}"
    staged.unlink(missing_ok=True)
    try:
        os.link(source, staged)
    except OSError as exc:
        log.warning("no hard link %s -> %s (%s): copying the file", source, staged, exc)
        shutil.copyfile(source, staged)
    os.replace(staged, path)
    _fsync_directory(directory)
    write_text_atomic(directory / LATEST_POINTER, path.name + "\n")
    _prune(directory, path, keep_last)
    return path


def _prune(directory: Path, newest: Path, keep_last: int) -> None:
    if keep_last > 0:
        for old in _step_files(directory)[:-keep_last]:
            if old != newest:
                old.unlink(missing_ok=True)


def _step_files(directory: Path) -> list[Path]:
    """Complete step files in step order (temporaries of killed writers are named .tmp-* and never match)."""
    found = [(int(m.group(1)), p) for p in directory.glob("step_*.pt") if (m := _STEP_FILE.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint in `directory`, or None.

    Follows the `latest` pointer; if the pointer is missing or stale (killed between the two renames), falls back to
    the highest-numbered step file.
    """
    if not directory.is_dir():
        return None
    pointer = directory / LATEST_POINTER
    if pointer.is_file():
        name = pointer.read_text().strip()
        # Only a bare step-file name is followed: a pointer must never lead to another run's directory.
        if _STEP_FILE.fullmatch(name) and (directory / name).is_file():
            return directory / name
        log.warning("checkpoint pointer %s names %r, not a step file here; using the newest step file", pointer, name)
    files = _step_files(directory)
    return files[-1] if files else None


_CONTROL = re.compile(r"\x1b\[[0-9;]*m|[\x00-\x1f\x7f]")


def _refusal_reason(exc: Exception) -> str:
    """The reason torch's weights_only loader gave, as one plain line. Its message also advises re-running with
    weights_only=False; that advice is never repeated."""
    text = _CONTROL.sub(" ", str(exc))
    match = re.search(r"WeightsUnpickler error:\s*(.*?)(?:\s{2,}|\. Please use|Check the documentation|$)", text)
    reason = match.group(1) if match else text.strip().split("  ")[0]
    reason = re.sub(r"\s+", " ", reason).strip()
    return reason[:300] or type(exc).__name__


def safe_load(path: Path, kind: str | tuple[str, ...], map_location: str | torch.device = "cpu",
              mmap: bool = False) -> dict[str, Any]:
    """Load a recflow file of the given kind (or one of the given kinds, the first named in errors) with
    `torch.load(weights_only=True)`; CheckpointError otherwise.

    mmap: map the tensors from the file instead of reading them (a process that needs only slices of large
    tables then reads only those pages)."""
    kinds = (kind,) if isinstance(kind, str) else kind
    kind = kinds[0]  # named in errors (the others are alternative layouts of it)
    try:
        # mmap needs torch's zip format (every file recflow writes); anything else is refused below as not ours
        payload = torch.load(path, weights_only=True, map_location=map_location,
                             mmap=mmap and zipfile.is_zipfile(path))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint file") from None
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError... for foreign files
        raise CheckpointError(
            f"{path}: not a {kind} file (safe loader refused it: {type(exc).__name__}: {_refusal_reason(exc)})"
        ) from None
    if not isinstance(payload, dict) or payload.get("kind") not in kinds:
        found = payload.get("kind") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"{path}: not a {kind} file (kind is {found!r})")
    if payload.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: {kind} format version {payload.get('version')!r}, expected {FORMAT_VERSION}")
    return payload


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """A checkpoint: a checkpoint file, or a model file with a checkpoint section (a run's final step, written
    once as model.pt), returned in the checkpoint layout."""
    payload = safe_load(path, (CHECKPOINT_KIND, MODEL_KIND), map_location, mmap)
    if payload["kind"] == CHECKPOINT_KIND:
        return payload
    if not isinstance(payload.get("checkpoint"), dict):
        raise CheckpointError(f"{path}: a {MODEL_KIND} file without a checkpoint section cannot resume training")
    return {"kind": CHECKPOINT_KIND, "version": payload["version"], "step": payload["step"],
            "model": payload["state_dict"], "config": payload["config"], "hparams": payload["hparams"],
            **payload["checkpoint"]}


def capture_rng_state() -> dict[str, Any]:
    """torch / CUDA / numpy / python RNG states as tensors, lists and numbers (weights_only-safe)."""
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else [],
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_cached),
        },
        "python": {"version": int(py_version), "state": [int(v) for v in py_state], "gauss_next": py_gauss},
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of capture_rng_state (CUDA states only restored when the same number of devices is visible)."""
    torch.set_rng_state(state["torch"].cpu())
    cuda_states = state.get("cuda") or []
    if cuda_states and torch.cuda.is_available() and len(cuda_states) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda_states])
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["name"],
            np_state["keys"].cpu().numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    py_state = state["python"]
    random.setstate((py_state["version"], tuple(py_state["state"]), py_state["gauss_next"]))
