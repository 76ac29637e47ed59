"""Timed inputs: one shared file per audited spec, a disjoint slot of fresh values for every call.

The parent (trusted) writes the file; workers map it read-only. Every call of a sample reads its own
slot, so no call sees data another call of the sample saw, and the values change every round.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile
from dataclasses import dataclass
from typing import Sequence

import torch

from runners import suite
from runners.suite import WorkloadSpec

_ALIGN = 4096  # every input of every slot starts on its own page: the same placement for every arm


@dataclass(frozen=True)
class SlotLayout:
    """Where input `i` of slot `s` lives in the shared file: `offsets[i] + s * strides[i]` bytes."""

    spec: WorkloadSpec
    slots: int
    offsets: tuple[int, ...]
    strides: tuple[int, ...]
    nbytes: int

    @classmethod
    def for_spec(cls, spec: WorkloadSpec, slots: int) -> SlotLayout:
        elsize = torch.empty((), dtype=spec.torch_dtype).element_size()
        offsets, strides, cursor = [], [], 0
        for layout in suite.input_layouts(spec):
            stride = -(-layout.numel * elsize // _ALIGN) * _ALIGN
            offsets.append(cursor)
            strides.append(stride)
            cursor += stride * slots
        return cls(spec=spec, slots=slots, offsets=tuple(offsets), strides=tuple(strides), nbytes=max(cursor, _ALIGN))

    def views(self, base: torch.Tensor, slot: int) -> tuple[torch.Tensor, ...]:
        """The inputs of `slot` as views of `base` (the whole file as uint8)."""
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} outside 0..{self.slots - 1}")
        dtype = self.spec.torch_dtype
        elsize = torch.empty((), dtype=dtype).element_size()
        out = []
        for layout, offset, stride in zip(suite.input_layouts(self.spec), self.offsets, self.strides):
            start = offset + slot * stride
            out.append(base[start : start + layout.numel * elsize].view(dtype).view(layout.shape))
        return tuple(out)

    def to_dict(self) -> dict[str, int]:
        return {"slots": self.slots, "nbytes": self.nbytes}


def map_inputs(path: str, nbytes: int) -> tuple[mmap.mmap, torch.Tensor]:
    """A worker's view of the shared file: private (a write lands in the worker's own copy, which the
    parent compares with what it wrote), populated up front so no timed call takes the page faults
    of first touch, and reading the parent's later writes until the worker writes a page itself."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        # Populated read-only first: populating a writable private mapping would copy every page
        # at once, and the worker would never see the parent's next values.
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
        mapping = mmap.mmap(fd, nbytes, flags=flags, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns the buffer is read-only; it is made writable next
        base = torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mprotect(ctypes.c_void_p(base.data_ptr()), ctypes.c_size_t(nbytes), mmap.PROT_READ | mmap.PROT_WRITE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect of the input mapping failed")
    return mapping, base


class SharedInputs:
    """The parent's writable copy of one spec's input file, rewritten with fresh values per round."""

    def __init__(self, directory: str, spec: WorkloadSpec, slots: int) -> None:
        self.layout = SlotLayout.for_spec(spec, slots)
        fd, self.path = tempfile.mkstemp(dir=directory, prefix=f"{spec.name}-", suffix=".inputs")
        try:
            os.ftruncate(fd, self.layout.nbytes)
            os.fchmod(fd, 0o644)  # workers (another uid) read it; only the parent may write
            self._mapping = mmap.mmap(fd, self.layout.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._base = torch.frombuffer(self._mapping, dtype=torch.uint8, count=self.layout.nbytes)

    @property
    def spec(self) -> WorkloadSpec:
        return self.layout.spec

    @property
    def slots(self) -> int:
        return self.layout.slots

    def slot_bytes(self, slot: int) -> list[tuple[int, bytes]]:
        """(offset in the file, bytes) of every input of `slot`, as the parent wrote them."""
        out = []
        for view, offset, stride in zip(self.layout.views(self._base, slot), self.layout.offsets, self.layout.strides):
            start = offset + slot * stride
            out.append((start, view.reshape(-1).view(torch.uint8).numpy().tobytes()))
        return out

    def inputs(self, slot: int) -> tuple[torch.Tensor, ...]:
        """Slot `slot`'s inputs, as the parent wrote them (copies: the file is rewritten later)."""
        return tuple(t.clone() for t in self.layout.views(self._base, slot))

    def fill(self, *, seed: int, slots: Sequence[int] | None = None, distribution: str = "normal") -> None:
        """Fresh values in `slots` (all by default), each slot different, drawn from `seed`."""
        chosen = list(range(self.slots)) if slots is None else list(slots)
        if not chosen:
            return
        spec = self.spec
        for index, layout in enumerate(suite.input_layouts(spec)):
            rows = layout.shape[0] if layout.shape else 1
            shape = (rows * len(chosen), *layout.shape[1:]) if layout.shape else (len(chosen),)
            values = suite.generate_tensor(
                layout,
                shape,
                seed=suite.derive_seed(seed, spec.key, layout.seed_name, distribution),
                dtype=spec.torch_dtype,
                device="cpu",
                distribution=distribution,
            ).reshape(len(chosen), -1)
            for row, slot in enumerate(chosen):
                self.layout.views(self._base, slot)[index].reshape(-1).copy_(values[row])

    def copy_slot(self, source: int, target: int) -> None:
        for src, dst in zip(self.layout.views(self._base, source), self.layout.views(self._base, target)):
            dst.copy_(src)

    def close(self) -> None:
        self._base = torch.empty(0, dtype=torch.uint8)
        try:
            self._mapping.close()
        except (BufferError, ValueError):
            pass  # a view still alive; the mapping goes with it
        try:
            os.unlink(self.path)
        except OSError:
            pass


def slots_for(calls: int) -> int:
    """Slots an audit needs for `calls` calls per sample: every call of a sample its own."""
    return max(2, int(calls))


def slot_bytes(spec: WorkloadSpec) -> int:
    return SlotLayout.for_spec(spec, 1).nbytes
