"""Where a measurement was taken: software versions, device, threads, project revision, host, and what makes
one machine's numbers differ from another's: the CPU's instruction set as ATen uses it, its bf16/AMX flags
(one pool of "AMD EPYC" machines mixes AVX2-only and AVX-512-BF16 ones: a bf16 decode step 3.3 s against
50 ms), and on CUDA the driver, cuDNN and the GPU's SM clock (current, at the end of the measurement, and
its maximum: a throttled GPU shows).

The keys other modules rely on are listed in docs/CONTRACTS.md, "Child and parent"; those a row carries as
context columns are named by their columns (``columns.MACHINE_COLUMNS``).
"""

from __future__ import annotations

import functools
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from topk_bench.attention import provenance
from topk_bench.results import columns as col
from topk_bench.types import DeviceKind

CPUINFO = Path("/proc/cpuinfo")
CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
# The /proc/cpuinfo flags that change what a bf16 (or int8) kernel can do on this CPU.
BF16_FLAGS = ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_int8", "amx_tile")

# The checkout (or installed tree) holding both packages: topk_bench/measure/metadata.py -> root.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _cpuinfo_field(name: str, path: Path = CPUINFO) -> str | None:
    """The first value of ``name`` in ``/proc/cpuinfo`` (Linux), None without one."""
    try:
        for line in path.read_text().splitlines():
            if line.split(":", 1)[0].strip() == name:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's marketing name from ``/proc/cpuinfo`` (Linux), else what ``platform`` knows."""
    return _cpuinfo_field("model name") or platform.processor() or platform.machine() or "unknown CPU"


@functools.lru_cache(maxsize=1)
def cpu_flags(path: Path = CPUINFO) -> str:
    """The bf16/AMX flags of :data:`BF16_FLAGS` this CPU has, ``;``-separated; ``none`` when it has none
    (AVX2-only machines), "" where ``/proc/cpuinfo`` says nothing (not Linux, not x86)."""
    flags = _cpuinfo_field("flags", path)
    if flags is None:
        return ""
    present = set(flags.split())
    return ";".join(f for f in BF16_FLAGS if f in present) or "none"


def cpu_kind(capability: str, flags: str) -> str:
    """A CPU kind as a file name: the instruction set ATen uses and the bf16/AMX flags (``avx512-avx512_bf16``,
    ``avx2``). Machines of one kind run the same kernels: a time measured on one holds for the others."""
    parts = [capability.lower() or "unknown", *(f for f in flags.split(";") if f and f != "none")]
    return "-".join(parts)


def cpu_capability() -> str:
    """The instruction set ATen's CPU kernels dispatch to (``DEFAULT``, ``AVX2``, ``AVX512``...)."""
    import torch

    try:
        return torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        return ""


def last_level_cache_bytes(caches: Path = CPU_CACHES) -> int | None:
    """The largest CPU cache (sysfs, Linux), for the CPU's cache flush; None where it is not said."""
    sizes = []
    for index in caches.glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


def device_name(device: str) -> str:
    """GPU model for a CUDA device (when one is visible), CPU model otherwise."""
    import torch  # lazily: a Slurm job's outer process must not pay for torch twice

    if DeviceKind.of(device) is DeviceKind.CUDA and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    if DeviceKind.of(device) is DeviceKind.CUDA:
        return "cuda (not available here)"
    return cpu_model()


@functools.lru_cache(maxsize=1)
def git_sha() -> str:
    """The project's commit, with ``-dirty`` when tracked files differ from it; "" outside a checkout."""
    try:
        sha = subprocess.run(
            ["git", "--no-optional-locks", "rev-parse", "HEAD"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if not sha:
            return ""
        dirty = subprocess.run(
            ["git", "--no-optional-locks", "diff", "--quiet", "HEAD", "--"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            timeout=10,
        ).returncode
        return sha + ("-dirty" if dirty == 1 else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def torch_version() -> str:
    import torch

    return torch.__version__


def gpu_state(device: str, nvml: Any = None) -> dict[str, Any]:
    """The CUDA device's driver version and SM clocks (now and its maximum, MHz) from NVML (``nvml``: the
    ``pynvml`` module, nvidia-ml-py; imported when not given), else ``nvidia-smi``; {} when neither answers.
    Neither initialises CUDA: NVML names the device by the UUID torch gives it."""
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(torch.device(device)).uuid)
    except Exception:  # noqa: BLE001 -- no device to ask about
        return {}
    uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    try:
        return _nvml_state(uuid, nvml)
    except Exception:  # noqa: BLE001 -- no NVML binding (or it failed): ask nvidia-smi
        return _smi_state(uuid)


def _nvml_state(uuid: str, nvml: Any = None) -> dict[str, Any]:
    if nvml is None:
        import pynvml

        nvml = pynvml
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        driver = nvml.nvmlSystemGetDriverVersion()
        return {
            col.DRIVER_VERSION: driver.decode() if isinstance(driver, bytes) else str(driver),
            col.GPU_SM_CLOCK_MHZ: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            col.GPU_SM_CLOCK_MAX_MHZ: int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)),
        }
    finally:
        nvml.nvmlShutdown()


def _smi_state(uuid: str) -> dict[str, Any]:
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                f"--id={uuid}",
                "--query-gpu=driver_version,clocks.sm,clocks.max.sm",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        driver, clock, top = (part.strip() for part in out.strip().splitlines()[0].split(","))
        return {col.DRIVER_VERSION: driver, col.GPU_SM_CLOCK_MHZ: int(clock), col.GPU_SM_CLOCK_MAX_MHZ: int(top)}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


def cudnn_version() -> str:
    import torch

    try:
        version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except RuntimeError:
        version = None
    return str(version) if version else ""


def collect(device: str = "cpu") -> dict[str, Any]:
    """``Measurement.metadata``: the keys other modules rely on are listed in docs/CONTRACTS.md, "Child and parent"."""
    import torch

    meta = {
        "torch_version": torch.__version__,
        col.CUDA_VERSION: torch.version.cuda or "",
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "hostname": socket.gethostname(),
        "git_sha": git_sha(),
        "python_version": platform.python_version(),
        col.CPU_CAPABILITY: cpu_capability(),
        col.CPU_FLAGS: cpu_flags(),
    }
    if DeviceKind.of(device) is DeviceKind.CUDA and torch.cuda.is_available():
        meta[col.CUDNN_VERSION] = cudnn_version()
        meta.update(gpu_state(device))
    return meta


def code_path(impl: str, ff_impl: str | None, device: str, dtype: Any) -> str:
    """What the machine decides of the code a case's implementations run (:mod:`topk_bench.attention.provenance`): the
    attention's choices, then the feed-forward implementation's, prefixed ``ff.``; "" for an implementation this
    process does not know."""
    parts = []
    for prefix, name in (("", impl), ("ff.", ff_impl)):
        if not name:
            continue
        try:
            path = provenance.code_path(name, device=device, dtype=dtype)
        except KeyError:  # not registered here (a plug-in that failed to import): the row's error says why
            continue
        parts += [prefix + pair for pair in path.split(";") if pair]
    return ";".join(parts)
