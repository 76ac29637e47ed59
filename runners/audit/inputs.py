"""Timed inputs: one shared file per audited spec, a disjoint slot of fresh values for every call.

The parent (trusted) writes the file; workers map it read-only. Every call of a sample reads its own
slot, so no call sees data another call of the sample saw, and the values change every round.

The parent draws a round's values into a private staging copy and reveals a slot (copies it into
the shared file) only when the call that reads it is due: on CPU, call i+1's values reach the
file after the worker has said call i is done (see runners.audit.sample.timed_sample), so no call
can compute ahead on the inputs of calls it has not been given. The last page of the file is the
control page: the parent writes the number of the call it has just revealed there.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from runners import suite
from runners.audit import futex
from runners.suite import WorkloadSpec

if TYPE_CHECKING:
    from runners.measure import Protocol

_ALIGN = 4096  # every input of every slot starts on its own page: the same placement for every arm


@dataclass(frozen=True)
class SlotLayout:
    """Where input `i` of slot `s` lives in the shared file: `offsets[i] + s * strides[i]` bytes."""

    spec: WorkloadSpec
    slots: int
    offsets: tuple[int, ...]
    strides: tuple[int, ...]
    nbytes: int  # the slots and, after them, one control page

    @property
    def control(self) -> int:
        """Offset of the control page (the parent's reveal counter, 8 bytes little-endian)."""
        return self.nbytes - _ALIGN

    @classmethod
    def for_spec(cls, spec: WorkloadSpec, slots: int) -> SlotLayout:
        elsize = torch.empty((), dtype=spec.torch_dtype).element_size()
        offsets, strides, cursor = [], [], 0
        for layout in suite.input_layouts(spec):
            stride = -(-layout.numel * elsize // _ALIGN) * _ALIGN
            offsets.append(cursor)
            strides.append(stride)
            cursor += stride * slots
        return cls(spec=spec, slots=slots, offsets=tuple(offsets), strides=tuple(strides), nbytes=cursor + _ALIGN)

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


def map_control(path: str, offset: int) -> tuple[mmap.mmap, int]:
    """A worker's second view of the control page: shared and read-only, and the address of its
    counter word. The worker reads the counter and wakes the parent through this one: a futex
    wake on a writable private mapping copies the page first (the kernel asks for write access
    before it settles for read), after which the worker's copy never saw the parent's next
    announcement, and the wake named a word the parent does not sleep on."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        mapping = mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=offset)
    finally:
        os.close(fd)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only on purpose
        address = torch.frombuffer(mapping, dtype=torch.uint8, count=8).data_ptr()
    return mapping, address


class SharedInputs:
    """The parent's writable copy of one spec's input file, and the private staging copy it draws a
    round's values into. `fill` and `copy_slot` write the staging copy; `reveal` copies a slot
    into the file the workers read; `hide` clears every slot of the file again."""

    def __init__(self, directory: str, spec: WorkloadSpec, slots: int, *, device: str = "cpu") -> None:
        self.layout = SlotLayout.for_spec(spec, slots)
        # Where `fill` draws values: the audit's device (a GPU draws a round's gigabyte in
        # milliseconds where one CPU thread takes seconds); they are staged on the host either way.
        self.device = device
        fd, self.path = tempfile.mkstemp(dir=directory, prefix=f"{spec.name}-", suffix=".inputs")
        try:
            os.ftruncate(fd, self.layout.nbytes)
            os.fchmod(fd, 0o644)  # workers (another uid) read it; only the parent may write
            self._mapping = mmap.mmap(fd, self.layout.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._base = torch.frombuffer(self._mapping, dtype=torch.uint8, count=self.layout.nbytes)
        self._announced = 0  # the counter word's value (the file starts zeroed)
        self._stage = torch.zeros(self.layout.nbytes, dtype=torch.uint8)
        self._shared_view = memoryview(self._mapping)
        self._stage_view = memoryview(self._stage.numpy())
        self._reserved: list[tuple[int, int]] = []  # every sample's announced numbers: never reused
        self._revealed: set[int] = set(range(self.layout.slots))  # slots the file may hold values of
        # (start, end) byte ranges of every slot's inputs, for reveal.
        elsize = torch.empty((), dtype=spec.torch_dtype).element_size()
        sizes = [layout.numel * elsize for layout in suite.input_layouts(spec)]
        self._ranges = [
            [(offset + slot * stride, offset + slot * stride + size) for offset, stride, size in zip(self.layout.offsets, self.layout.strides, sizes)]
            for slot in range(self.layout.slots)
        ]

    @property
    def spec(self) -> WorkloadSpec:
        return self.layout.spec

    @property
    def slots(self) -> int:
        return self.layout.slots

    def slot_bytes(self, slot: int) -> list[tuple[int, bytes]]:
        """(offset in the file, bytes) of every input of `slot`, as the parent drew them."""
        return [(start, self._stage_view[start:end].tobytes()) for start, end in self._ranges[slot]]

    def inputs(self, slot: int) -> tuple[torch.Tensor, ...]:
        """Slot `slot`'s inputs, as the parent drew them (copies: the values change later)."""
        return tuple(t.clone() for t in self.layout.views(self._stage, slot))

    def fill(self, *, seed: int, slots: Sequence[int] | None = None, distribution: str = "normal") -> None:
        """Fresh values for `slots` (all by default), in the staging copy: no worker sees them
        before they are revealed. Every slot draws from its own generator, seeded from `seed`, the
        slot and 64 bits from the operating system's random source drawn for this fill: one call's
        values say nothing about another's. (One stream for all slots made every later call of a
        sample the continuation of call 0's generator, and rope's positions one run: a worker
        that recovered the generator's state from call 0's values could compute the whole sample
        before its calls were announced.)"""
        chosen = list(range(self.slots)) if slots is None else list(slots)
        if not chosen:
            return
        spec = self.spec
        secret = secrets.randbits(64)
        for index, layout in enumerate(suite.input_layouts(spec)):
            shape = tuple(layout.shape) if layout.shape else (1,)
            values = torch.stack([
                suite.generate_tensor(
                    layout,
                    shape,
                    seed=suite.derive_seed(seed, spec.key, layout.seed_name, distribution, slot, secret),
                    dtype=spec.torch_dtype,
                    device=self.device,
                    distribution=distribution,
                ).reshape(-1)
                for slot in chosen
            ]).cpu()  # one copy to the host per layout (a device draw)
            for row, slot in enumerate(chosen):
                self.layout.views(self._stage, slot)[index].reshape(-1).copy_(values[row])

    def copy_slot(self, source: int, target: int) -> None:
        for src, dst in zip(self.layout.views(self._stage, source), self.layout.views(self._stage, target)):
            dst.copy_(src)

    def reveal(self, slot: int) -> None:
        """Copy `slot`'s staged values into the file the workers read."""
        shared, stage = self._shared_view, self._stage_view
        self._revealed.add(slot)
        for start, end in self._ranges[slot]:
            shared[start:end] = stage[start:end]

    def reveal_all(self) -> None:
        """Every slot at once (where calls are not revealed one by one)."""
        control = self.layout.control
        self._revealed.update(range(self.slots))
        self._shared_view[:control] = self._stage_view[:control]

    def hide(self) -> None:
        """Zero every slot of the file: what one worker's sample revealed, the next does not see."""
        address = self._base.data_ptr()
        for slot in self._revealed:
            for start, end in self._ranges[slot]:
                ctypes.memset(address + start, 0, end - start)
        self._revealed.clear()

    def reserve(self, count: int) -> int:
        """Reveal numbers for a sample of `count` calls: call i is announced as base + i + 1.

        The base is drawn at random for every sample. Counted on from one counter every arm
        shared, the jump between two of a worker's samples told it how many calls the other arms
        had been given in between, so where it stood in the round's secret order (first, or just
        before the baseline) and whom a storm left behind would hit."""
        while True:
            base = secrets.randbits(62)
            if all(base + count < start or base > end for start, end in self._reserved):
                break
        self._reserved.append((base, base + count))
        return base

    def announce(self, number: int) -> None:
        """Write `number` to the control page: the call it names may start. A single aligned 8-byte
        store, made after the slot's values were copied (x86 keeps stores in order)."""
        ctypes.c_uint64.from_address(self._base.data_ptr() + self.layout.control).value = number
        self._announced = number

    def sleep(self, timeout_s: float) -> int:
        """The parent sleeps on the counter (which holds what it last announced) until a worker
        wakes it (after its "ready" and after each done record), a signal or `timeout_s`; returns
        runners.audit.futex.wait's answer."""
        return futex.wait(self._base.data_ptr() + self.layout.control, self._announced, timeout_s)

    def close(self) -> None:
        self._shared_view.release()
        self._stage_view.release()
        self._base = torch.empty(0, dtype=torch.uint8)
        try:
            self._mapping.close()
        except (BufferError, ValueError):
            pass  # a view still alive; the mapping goes with it
        try:
            os.unlink(self.path)
        except OSError:
            pass


class DoneRecordBroken(Exception):
    """The worker shrank its done record's file: it reports nothing from then on."""


class DoneRecord:
    """One page the worker writes and the parent reads while it steps a sample: the number of the
    last call the worker finished (word NUMBER, a cache line of its own, which the parent polls)
    and (address, bytes) of each of that call's outputs (from word OUTPUTS on). A file in the
    worker's scratch directory, owned by its uid and mapped shared by the worker. The parent reads
    it with pread on its own descriptor, never through a mapping: the worker may truncate its own
    file, and a mapping of a truncated file faults (SIGBUS) on the next load, which killed the
    harness when an outside red team tried it; a read of a truncated file comes back short and
    fails the candidate. Reading the worker's memory through /proc instead would take its
    memory-map lock, which the kernel under measurement needs for every allocation."""

    NUMBER, OUTPUTS = 8, 16  # words: the polled line apart from the line the worker fills first

    def __init__(self, directory: str, outputs: int) -> None:
        self.outputs_count = outputs
        if self.words_for(outputs) * 8 > 4096:
            raise ValueError(f"{outputs} outputs do not fit one page")
        fd, self.path = tempfile.mkstemp(dir=directory, prefix="done-")
        try:
            os.ftruncate(fd, 4096)
            owner = os.stat(directory).st_uid
            if os.geteuid() == 0 and owner != 0:
                os.fchown(fd, owner, -1)
            os.fchmod(fd, 0o600)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._number_at = self.NUMBER * 8
        self._outputs_at, self._outputs_len = self.OUTPUTS * 8, 2 * outputs * 8

    @classmethod
    def words_for(cls, outputs: int) -> int:
        return cls.OUTPUTS + 2 * outputs

    def number(self) -> int:
        data = os.pread(self._fd, 8, self._number_at)
        if len(data) != 8:
            raise DoneRecordBroken("the worker truncated its done record")
        return int.from_bytes(data, "little")

    def outputs(self) -> list[tuple[int, int]]:
        """(address, bytes) of each output of the call `number()` names."""
        data = os.pread(self._fd, self._outputs_len, self._outputs_at)
        if len(data) != self._outputs_len:
            raise DoneRecordBroken("the worker truncated its done record")
        values = [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]
        return list(zip(values[0::2], values[1::2]))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def slots_for(calls: int) -> int:
    """Slots an audit needs for `calls` calls per sample: every call of a sample its own."""
    return max(2, int(calls))


def slot_bytes(spec: WorkloadSpec) -> int:
    return SlotLayout.for_spec(spec, 1).nbytes


def max_calls(spec: WorkloadSpec, protocol: Protocol) -> int:
    """Calls per sample at most: the protocol's cap, and as many distinct slots as fit in its
    input budget (at least one call)."""
    return max(1, min(protocol.max_calls, protocol.input_budget_bytes // max(1, slot_bytes(spec))))
