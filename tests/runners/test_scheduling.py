"""Where workers run and how the scheduler's interference is taken off a sample.

Pinning keeps baseline, candidate and A/A control on the same cores; the preemption discount
takes other processes' time off a whole CPU sample (stepped samples take nothing off) without letting a candidate earn a discount of
its own making.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import pytest
import torch

from runners import suite
from runners.audit.inputs import DoneRecord, SharedInputs
from runners.audit.sample import read_outputs, timed_sample
from runners.audit.session import WORKER_HANDLER
from runners.sandbox import Sandbox, SandboxConfig, _cpu_list, measurement_cpus, process_cpu_ns, thread_affinities

TWO_CORES = len(os.sched_getaffinity(0)) >= 2
needs_two_cores = pytest.mark.skipif(not TWO_CORES, reason="pinning leaves one core to the parent: needs two")

SPINNER = '''import threading
import torch.nn.functional as F

def kernel(x, weight):
    # A second thread of its own queues behind the calling one for the whole call.
    stop = threading.Event()
    def spin():
        while not stop.is_set():
            sum(range(2000))
    thread = threading.Thread(target=spin)
    thread.start()
    out = F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
    for _ in range(20000):
        pass
    stop.set()
    thread.join()
    return out
'''


LONG_CALL = '''import time
import torch.nn.functional as F

def kernel(x, weight):
    end = time.thread_time() + 0.03  # 30 ms of this thread's CPU, however long the hog holds the core
    while time.thread_time() < end:
        pass
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
'''


def test_it_reads_the_kernels_cpu_list_format():
    assert _cpu_list("0-2,5") == {0, 1, 2, 5}
    assert _cpu_list("3\n") == {3}
    assert _cpu_list("0,2-3") == {0, 2, 3}


def test_it_leaves_the_lowest_core_to_the_parent():
    cpus = measurement_cpus(threads=1)
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        assert cpus == []
    else:
        assert cpus == [allowed[1]] and allowed[0] not in measurement_cpus(threads=64)


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(threads=1, worker_handler=WORKER_HANDLER)) as box:
        yield box
    while _FILES:
        _FILES.pop().close()


_FILES: list[SharedInputs] = []


def _bound(sandbox: Sandbox, spec, role: str, source: str, calls: int):
    inputs = SharedInputs(sandbox.shared_dir, spec, calls)
    _FILES.append(inputs)
    inputs.fill(seed=1)
    worker = sandbox.spawn(role)
    worker.done = DoneRecord(worker.scratch, len(suite.output_shapes(spec)))
    bound = worker.call("bind", timeout=60, spec=spec.to_dict(), path=inputs.path, slots=calls, done_path=worker.done.path)
    assert bound.header["stepped"] is True
    worker.call("load", timeout=60, spec=spec.to_dict(), source=source, module=role)
    worker.inputs = inputs
    inputs.reveal_all()
    return worker, inputs


def _ready(sandbox: Sandbox, source: str, role: str = "baseline", calls: int = 64):
    worker, _ = _bound(sandbox, suite.find_spec("cpu-ci", "rmsnorm")[0], role, source, calls)
    return worker, list(range(calls))


def _timed(worker, slots, *, stepped=False, **options):
    if stepped:
        options.update(inputs=worker.inputs, done=worker.done)
    return timed_sample(worker, slots, device="cpu", timeout=60, freeze=False, **options)


@needs_two_cores
def test_it_reveals_each_call_only_when_the_previous_one_is_done(sandbox):
    """A stepped sample: every call computed on its own values (revealed one at a time), the outputs
    read the moment a call was reported done equal to what the frozen worker holds at the end."""
    spec = suite.find_spec("cpu-ci", "rmsnorm")[0]
    worker, inputs = _bound(sandbox, spec, "baseline", suite.baseline_source(spec), 8)
    try:
        inputs.fill(seed=7)
        sample = timed_sample(worker, list(range(8)), device="cpu", timeout=60, freeze=True, discount_preemption=False,
                              inputs=inputs, done=worker.done, snapshot=[2, 5])
        assert sample.stepped and sample.clock_problem is None, sample.clock_problem
        assert 0 < sample.reported_ns <= sample.window_ns
        for call in range(8):
            got = read_outputs(worker, spec, sample, call)
            assert got is not None and torch.allclose(got[0], suite.reference(spec, inputs.inputs(call)).float(), atol=1e-4, rtol=1e-4)
        # Held (the core fence), the last call is read as well: the worker cannot be replying then.
        assert sorted(sample.snapshots) == ([2, 5, 7] if sample.fenced else [2, 5])
        for call, taken in sample.snapshots.items():
            assert [address for address, _ in taken] == sample.pointers[call]
            assert all(data and worker.read_memory(address, len(data)) == data for address, data in taken)
    finally:
        worker.close()


@needs_two_cores
def test_the_parents_snapshot_reads_are_not_time_outside_the_workers_calls(sandbox):
    """What the hidden-work figure charges a worker (kernel._outside_s: the request less the
    parent's gaps less the calls' windows) does not grow with the snapshots the parent reads: a
    held sample reads the last call's outputs after it is done, and `cpu`'s rmsnorm outputs are
    4 MiB (1-1.5 ms a read); left out of the gaps, that read failed every honest candidate."""
    spec = suite.find_spec("cpu", "rmsnorm")[0]
    worker, inputs = _bound(sandbox, spec, "baseline", suite.baseline_source(spec), 4)
    try:
        def outside(snapshot):
            sample = timed_sample(worker, list(range(4)), device="cpu", timeout=60, freeze=False,
                                  discount_preemption=False, inputs=inputs, done=worker.done, snapshot=snapshot)
            assert sample.stepped and sample.clock_problem is None, sample.clock_problem
            return sample.request_ns - sample.gaps_ns - sample.window_ns, len(sample.snapshots)

        plain = [outside(())[0] for _ in range(5)]
        read = [outside([0, 1, 2]) for _ in range(5)]
        assert all(count >= 3 for _, count in read)
        excess = statistics.median(ns for ns, _ in read) - statistics.median(plain)
        assert excess < 400_000, (excess, plain, read)
    finally:
        worker.close()


@needs_two_cores
def test_it_pins_every_thread_of_a_worker_to_the_measurement_cores(sandbox):
    worker, _ = _ready(sandbox, suite.baseline_source(suite.find_spec("cpu-ci", "rmsnorm")[0]))
    try:
        masks = thread_affinities(worker.pid)
        assert masks and all(mask == set(sandbox.config.cpus) for mask in masks), masks
        assert worker.cpus_widened() == []
    finally:
        worker.close()


def _wait_until_spinning(pid: int, cpu_ns: int = 100_000_000, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process_cpu_ns(pid) > cpu_ns:
            return
        time.sleep(0.01)
    raise AssertionError("the hog never got going")


@needs_two_cores
@pytest.mark.parametrize("stepped", [False, True], ids=["whole-sample", "stepped"])
def test_it_takes_other_processes_time_off_a_whole_sample_and_none_off_a_stepped_one(sandbox, stepped):
    """A hog on the measurement core takes about half of every call; the kernel's run-queue
    accounting shows it, and the discounted whole sample keeps only the worker's own time. A stepped
    sample bills its windows as they are, in every arm alike: its discount could not be made the
    same for a worker whose calls thread also serves the requests (a red team's takeover kept a
    wait the trusted loop's request thread cancelled). (Calls here are long: each call starts on a
    wake-up, and the scheduler lets a short one run unpreempted.)"""
    worker, offsets = _ready(sandbox, LONG_CALL, calls=6)
    core = sandbox.config.cpus[0]
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, [{core}])\nwhile True: pass"])
    try:
        _wait_until_spinning(hog.pid)
        records = [_timed(worker, offsets, discount_preemption=True, stepped=stepped) for _ in range(6)]
    finally:
        hog.kill()
        hog.wait()
        worker.close()
    preempted = sorted(r.preempted_ns / r.reported_ns for r in records)
    if stepped:
        assert preempted == [0.0] * len(records)
    else:
        # The hog took a real share of the median sample: about half on a quiet box, but only ~10% with
        # one more busy process on the machine (seen in a loaded clean-clone run; the cause is not
        # pinned down, possibly time the VM's host takes, which the worker's CPU clock also counts and
        # the discount never goes below).
        assert preempted[len(preempted) // 2] > 0.05, preempted
    for record in records:
        sample_ns = record.per_call_s * record.calls * 1e9
        if stepped:  # every call's window bills, call 0's included (the request is read before "ready")
            assert sample_ns == pytest.approx(sum(record.call_windows), abs=1)
            assert record.reported_ns == sum(record.call_windows) and record.ready_ns > 0
        else:
            assert sample_ns == pytest.approx(record.reported_ns - record.preempted_ns, abs=1)
        assert record.stepped == stepped and record.clock_problem is None
        if not stepped:
            assert sample_ns >= min(record.cpu_run_ns, record.reported_ns) - 1  # never below the worker's own CPU
        # Never below the 30 ms of CPU each call spends (the very first call of a worker is untimed).
        assert sample_ns >= 0.9 * 0.03e9 * (record.calls - 1), (sample_ns, record.reported_ns, record.preempted_ns)


@needs_two_cores
@pytest.mark.parametrize("stepped", [False, True], ids=["whole-sample", "stepped"])
def test_it_gives_no_discount_for_waiting_behind_the_candidates_own_threads(sandbox, stepped):
    worker, offsets = _ready(sandbox, SPINNER, role="candidate")
    try:
        records = [_timed(worker, offsets[:4], discount_preemption=True, stepped=stepped) for _ in range(4)]
    finally:
        worker.close()
    for record in records:
        # The calling thread may wait behind the spinner, but a sample never drops below the CPU
        # the worker spent over it, the spinner's included: queueing its own threads buys nothing.
        sample_ns = record.per_call_s * record.calls * 1e9
        assert record.stepped == stepped
        if stepped:  # stepped samples take nothing off
            assert record.preempted_ns == 0, (record.preempted_ns, record.reported_ns)
        else:
            assert sample_ns >= min(record.cpu_run_ns, record.reported_ns) - 1, (sample_ns, record.cpu_run_ns)
    assert records and all(r.cpu_run_ns > 0 for r in records)


def test_it_takes_no_page_faults_per_sample_in_a_warm_worker_whatever_its_history(sandbox):
    """Two workers, one of which freed its large blocks first: once warm, neither takes page
    faults per sample. (This holds on this machine's glibc with or without the fixed thresholds in
    MALLOC_ENVIRONMENT, whose effect showed only over whole audits; test_sandbox checks that every
    worker gets them.)"""
    spec = suite.find_spec("cpu", "softmax")[0]  # 4 MiB outputs: above glibc's initial mmap threshold
    workers = []
    try:
        for _ in range(2):
            workers.append(_bound(sandbox, spec, "baseline", suite.baseline_source(spec), 4)[0])
        # One worker frees a large block first: with glibc's adaptive thresholds that alone moves
        # its later outputs from fresh mappings to the heap.
        _timed(workers[0], [0, 1, 2, 3], discount_preemption=False)
        workers[0].call("release", timeout=60)
        faults = []
        for worker in workers:
            counts = []
            for _ in range(10):  # calls run in a thread whose glibc arena warms over more samples than the main heap
                before = _minor_faults(worker.pid)
                _timed(worker, [0, 1, 2, 3], discount_preemption=False)
                counts.append(_minor_faults(worker.pid) - before)
            faults.append(sorted(counts[-3:])[1])
        # Once warm (a few rounds) neither worker takes page faults per call on its outputs or
        # inputs (mapped and populated once). A fresh 4 MiB mapping per call would be ~4 x 1024
        # faults in every sample; a warm heap leaves a few pages at the edges. Now and then the
        # heap's top still grows by one output (1025 faults once, in a CI run, when a random heap
        # spacer moved outputs): the median of the last three samples is judged.
        assert max(faults) < 512, faults
    finally:
        for worker in workers:
            worker.close()


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[7])


def test_the_parent_reads_the_scheduler_statistics_of_the_thread_that_runs_the_calls(sandbox):
    """Calls run in the worker's call lane (a thread of its own, so their fresh tensors come from a
    glibc arena of its own); the parent adopts that thread at the first bind, before any candidate
    code, and nothing the worker says later moves it."""
    spec = suite.find_spec("cpu-ci", "rmsnorm")[0]
    worker, _ = _bound(sandbox, spec, "baseline", suite.baseline_source(spec), 4)
    try:
        tid = worker.calls_tid
        assert tid is not None and tid != worker.pid
        assert open(f"/proc/{worker.pid}/task/{tid}/comm").read().strip() == "dyno-calls"
        assert worker.adopt_calls_thread(worker.pid) is False and worker.calls_tid == tid
        before = worker.main_thread_cpu_ns()
        _timed(worker, [0, 1, 2, 3], discount_preemption=False)
        assert worker.main_thread_cpu_ns() > before  # the lane ran the calls
    finally:
        worker.close()
