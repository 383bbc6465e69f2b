"""Job slots of a measured CUDA run each get a GPU of their own; CUDA starts before a child reports ready."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from topk_bench.case import Budget, Case, Measurement
from topk_bench.child import worker
from topk_bench.run import devices
from topk_bench.run import plan as planning
from topk_bench.run.executors import LocalExecutor, get_executor
from topk_bench.run.resolve import Flags
from topk_bench.suite.settings import ExecutorSettings


@pytest.mark.parametrize(
    "environ, count, gpus",
    [
        ({}, 0, []),
        ({}, 1, ["0"]),
        ({}, 3, ["0", "1", "2"]),
        ({"CUDA_VISIBLE_DEVICES": "2,5"}, 2, ["2", "5"]),
        ({"CUDA_VISIBLE_DEVICES": " 3 , GPU-8a1f "}, 2, ["3", "GPU-8a1f"]),
        ({"CUDA_VISIBLE_DEVICES": "1,7,2"}, 1, ["1"]),  # CUDA stops at the first invalid entry (7 of 2 GPUs)
        ({"CUDA_VISIBLE_DEVICES": ""}, 0, []),
    ],
)
def test_the_visible_gpus_are_this_processs_own_list_or_the_ordinals(environ, count, gpus):
    assert devices.visible_gpus(environ, count) == gpus


def test_slot_i_gets_gpu_i_mod_count_and_one_gpu_needs_no_choice():
    assert devices.slot_environments(4, ["2", "5"]) == [{"CUDA_VISIBLE_DEVICES": g} for g in ("2", "5", "2", "5")]
    assert devices.slot_environments(2, ["0", "1", "2"]) == [
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "1"},
    ]
    assert devices.slot_environments(1, ["0"]) is None
    assert devices.slot_environments(3, []) is None


def test_each_job_slot_runs_its_cases_with_its_own_variables():
    seen: dict[int, set] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(3, timeout=10)

    def run(case: Case, budget: Budget, env=None) -> Measurement:
        if case.param_dict["seq_len"] <= 48:
            barrier.wait()  # the first three cases run at once: one per slot
        with lock:
            seen.setdefault(threading.get_ident(), set()).add(env["CUDA_VISIBLE_DEVICES"])
        return Measurement(status="ok")

    executor = get_executor(ExecutorSettings(kind="local", jobs=3), run=run, gpus=["4", "6", "7"])
    handles = executor.submit(
        [Case.make(suite="s", workload="mha", impl="vanilla", params={"seq_len": 16 * (i + 1)}) for i in range(9)],
        Budget(),
    )
    assert all(h.result().status == "ok" for h in handles)
    executor.close()
    # Each slot (thread) always used the same GPU, and the three slots used the three GPUs.
    assert sorted(next(iter(g)) for g in seen.values()) == ["4", "6", "7"]
    assert all(len(g) == 1 for g in seen.values())
    assert LocalExecutor(jobs=2, run=run)._slots is None  # no GPUs: the run function is called as before


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "s"\nworkload = "mha"\n[shape]\nd_model = 16\nheads = 2\n[sweep]\nseq_len = [16]\n'
        '[[impl]]\nname = "vanilla"\n'
    )
    return path


def fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_a_measured_cuda_run_on_one_gpu_keeps_one_job_and_says_so_once(suite, monkeypatch):
    fake_gpus(monkeypatch, 1)
    the_plan = planning.plan(suite, Flags(device="cuda", jobs=4))
    assert the_plan.executor.jobs == 1 and the_plan.gpus == ["0"]
    assert [n for n in the_plan.notes if "GPU" in n] == [
        "one GPU visible: --jobs 4 lowered to 1 for this measured CUDA run "
        "(cases sharing a GPU corrupt each other's times and peaks)"
    ]
    assert planning.plan(suite, Flags(device="cuda", threads=1)).notes == []  # one job asked: nothing to say


def test_a_measured_cuda_run_spreads_its_jobs_over_the_gpus(suite, monkeypatch):
    fake_gpus(monkeypatch, 2)
    the_plan = planning.plan(suite, Flags(device="cuda", jobs=2, threads=1))  # threads given: no note of auto's
    assert the_plan.executor.jobs == 2 and the_plan.gpus == ["0", "1"] and the_plan.notes == []
    crowded = planning.plan(suite, Flags(device="cuda", jobs=3))
    assert crowded.executor.jobs == 3 and any("share GPUs" in n for n in crowded.notes)
    # A prediction, for the CPU or for CUDA, runs on fake tensors: no GPU to choose, every job asked for.
    for device in ("cpu", "cuda"):
        predicted = planning.plan(suite, Flags(predict=True, device=device, jobs=3))
        assert predicted.gpus == [] and predicted.executor.jobs == 3 and predicted.notes == []
    fake_gpus(monkeypatch, 1)
    assert planning.plan(suite, Flags(predict=True, device="cuda", jobs=3)).executor.jobs == 3


def test_a_cuda_case_initialises_cuda_before_it_reports_ready(tmp_path, monkeypatch):
    calls = []
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)

    def synchronize(device):
        try:
            reported = os.read(read_fd, 1)
        except BlockingIOError:
            reported = b""
        calls.append((str(device), reported))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(worker, "execute", lambda case, budget: Measurement(status="ok"))
    for device, method in (("cuda", "measured"), ("cpu", "measured"), ("cuda:1", "predicted")):
        case = Case.make(
            suite="s", workload="mha", impl="vanilla", device=device, method=method, params={"seq_len": 16}
        )
        (tmp_path / "case.json").write_text(case.to_json())
        fd = os.dup(write_fd)
        assert worker.main([str(tmp_path / "case.json"), str(tmp_path / "result.json"), "--ready-fd", str(fd)]) == 0
    os.close(write_fd)
    # Only the measured CUDA case, and before its ready byte (the pipe was still empty).
    assert calls == [("cuda", b"")]
    assert os.read(read_fd, 8) == b"rrr"  # and every case reported ready
    os.close(read_fd)
