"""What a row says of the machine it ran on: the CPU's instruction set and bf16/AMX flags, and on CUDA the
driver, cuDNN and the GPU's SM clocks (issue 26: one pool of "AMD EPYC" machines mixes AVX2-only and
AVX-512-BF16 CPUs, 3.3 s against 50 ms for one bf16 decode step)."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import torch

from topk_bench.measure import metadata
from topk_bench.results import columns as col

AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE = "model name\t: Intel Xeon\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16\n"


def test_the_cpu_flags_that_change_bf16_kernels(tmp_path):
    for text, expected in ((AVX2_ONLY, "none"), (SAPPHIRE, "avx512_bf16;avx512_fp16;amx_bf16;amx_int8;amx_tile")):
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        assert metadata.cpu_flags.__wrapped__(path) == expected
    assert metadata.cpu_flags.__wrapped__(tmp_path / "absent") == ""  # nothing said: nothing claimed


def test_the_largest_cpu_cache(tmp_path):
    for index, (_level, size) in enumerate([(1, "32K"), (2, "512K"), (3, "32768K")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "size").write_text(f"{size}\n")
    assert metadata.last_level_cache_bytes(tmp_path) == 32 * 2**20
    assert metadata.last_level_cache_bytes(tmp_path / "none") is None


def test_a_cpu_measurement_records_the_instruction_set_and_no_gpu_fields():
    meta = metadata.collect("cpu")
    assert meta[col.CPU_CAPABILITY] == torch.backends.cpu.get_cpu_capability() != ""
    assert meta[col.CPU_FLAGS] == metadata.cpu_flags()
    assert not {col.DRIVER_VERSION, col.CUDNN_VERSION, col.GPU_SM_CLOCK_MHZ} & set(meta)


class FakeNvml:
    NVML_CLOCK_SM = 1

    def __init__(self):
        self.asked = []

    def nvmlInit(self):
        self.asked.append("init")

    def nvmlShutdown(self):
        self.asked.append("shutdown")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.asked.append(uuid)
        return "handle"

    def nvmlSystemGetDriverVersion(self):
        return b"580.159.04"

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1755

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return 1980


def test_gpu_clocks_and_driver_from_nvml_by_the_device_uuid(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(uuid="5f1e-ab"))
    nvml = FakeNvml()
    state = metadata.gpu_state("cuda:0", nvml)
    assert state == {col.DRIVER_VERSION: "580.159.04", col.GPU_SM_CLOCK_MHZ: 1755, col.GPU_SM_CLOCK_MAX_MHZ: 1980}
    assert nvml.asked == ["init", "GPU-5f1e-ab", "shutdown"]  # NVML's own name of the device; never CUDA's


def test_without_nvml_nvidia_smi_answers(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "$1" > "$(dirname "$0")/asked"\necho "580.159.04, 1410, 1980"\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(uuid="GPU-77"))

    class Broken:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    assert metadata.gpu_state("cuda:0", Broken()) == {
        col.DRIVER_VERSION: "580.159.04",
        col.GPU_SM_CLOCK_MHZ: 1410,
        col.GPU_SM_CLOCK_MAX_MHZ: 1980,
    }
    assert (tmp_path / "asked").read_text().strip() == "--id=GPU-77"


def test_no_device_to_ask_about_gives_nothing(monkeypatch):
    def missing(device):
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "get_device_properties", missing)
    assert metadata.gpu_state("cuda:0") == {}


def test_a_row_carries_the_machine(tmp_path):
    from topk_bench.case import Budget, Case
    from topk_bench.child.execute import execute
    from topk_bench.results.row import make_row

    case = Case.make(
        suite="t", workload="mha", impl="vanilla", params={"seq_len": 8, "d_model": 8, "heads": 2}, repeats=1
    )
    row = make_row(case, execute(case, Budget()))
    assert row[col.CPU_CAPABILITY] == torch.backends.cpu.get_cpu_capability()
    assert row[col.CPU_FLAGS] == metadata.cpu_flags() and row[col.CUDA_VERSION] == (torch.version.cuda or "")
    assert row[col.TIMER] == "perf_counter" and row[col.FLUSH_L2] is False and row[col.OPS_PER_ITER] > 0
