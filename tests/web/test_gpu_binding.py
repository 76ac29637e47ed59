"""One worker per GPU: a worker that serves a GPU hardware class sees exactly one GPU, and the
host's device lock is keyed on the physical GPU, not on the index a worker sees it at."""

from __future__ import annotations

import pytest


def test_a_gpu_worker_must_see_exactly_one_gpu(monkeypatch):
    import runs.runner
    from fleet.worker import gpu_binding_problem

    monkeypatch.setattr(runs.runner.torch.cuda, "is_available", lambda: True)
    problem = gpu_binding_problem(["gpu-h200"], visible=None, device_count=8)
    assert "sees 8 GPUs" in problem and "CUDA_VISIBLE_DEVICES=0" in problem
    assert "sees 0 GPUs" in gpu_binding_problem(["gpu-h200", "control"], visible="", device_count=0)
    assert gpu_binding_problem(["gpu-h200"], visible="3", device_count=1) is None
    assert gpu_binding_problem(["cpu", "control"], visible=None, device_count=8) is None  # CPU workers: no GPU needed


def test_the_device_lock_follows_the_physical_gpu(monkeypatch):
    import runs.runner

    uuids = {0: "GPU-1111", 1: "GPU-2222"}
    seen = {"index": 0}
    monkeypatch.setattr(runs.runner.torch.cuda, "current_device", lambda: seen["index"])
    monkeypatch.setattr(runs.runner, "gpu_uuid", lambda index: uuids.get(index))
    # Two workers started with CUDA_VISIBLE_DEVICES=0 and =1 both see their GPU at index 0.
    monkeypatch.setitem(uuids, 0, "GPU-1111")
    first = runs.runner.device_lock_name("cuda")
    monkeypatch.setitem(uuids, 0, "GPU-2222")
    second = runs.runner.device_lock_name("cuda")
    assert (first, second) == ("cuda-GPU-1111", "cuda-GPU-2222")
    assert runs.runner.device_lock_name("cpu") == "cpu0"


@pytest.mark.django_db
def test_the_fleet_page_names_each_runners_gpu(admin_client):
    from django.utils import timezone

    from fleet.models import Runner

    now = timezone.now()
    Runner.objects.create(hostname="gpu0@box", hardware="gpu-h200", queues=["gpu-h200"], registered_at=now,
                          last_heartbeat=now,
                          fingerprint={"device": "cuda", "cpu_model": "x", "torch": "2.11", "triton": "3.6",
                                       "gpu": {"name": "NVIDIA H200", "uuid": "GPU-abcd-1234"}})
    page = admin_client.get("/fleet")
    assert page.status_code == 200 and b"GPU-abcd-1234" in page.content and b"NVIDIA H200" in page.content


def test_a_runner_refuses_to_start_with_a_compile_variant_the_optimizer_does_not_know():
    from fleet.worker import compile_variants_problem

    problem = compile_variants_problem(["cpp-wrapper-fixed-modules", "turbo"])
    assert "DYNO_OPTIMIZER_COMPILE_VARIANTS" in problem and "'turbo'" in problem and "known: default" in problem
    assert compile_variants_problem(["cpp-wrapper-fixed-modules"]) is None and compile_variants_problem([]) is None
