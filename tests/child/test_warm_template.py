"""Children forked from a warm template are as isolated as fresh interpreters, and the template is safe to fork."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from locations import ROOT
from topk_bench.case import Budget, Case
from topk_bench.run import launcher
from topk_bench.run.launcher import run_isolated

PLUGINS = (str(ROOT / "tests" / "plugins" / "state_probe.py"), str(ROOT / "tests" / "plugins" / "failing_impls.py"))
CHILD_ENV = {"OMP_NUM_THREADS": "1"}
MIB = 1 << 20


def case(impl: str, **options) -> Case:
    return Case.make(
        suite="template",
        workload="mha",
        impl=impl,
        params={"seq_len": 16, "d_model": 16, "heads": 2},
        options=options,
        plugins=PLUGINS,
        warmup=0,
        repeats=1,
    )


def probe(report: Path, env=CHILD_ENV) -> dict:
    m = run_isolated(case("test_probe", report=str(report)), Budget(max_seconds=120), env=env)
    assert m.status == "ok", m.error
    return json.loads(report.read_text())


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(") ", 1)[-1].split()[0] != "Z"


def fresh_interpreter(code: str, env: dict | None = None) -> str:
    env = {**(env if env is not None else os.environ), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow
def test_the_template_forks_with_one_thread_and_no_cuda(tmp_path):
    state = probe(tmp_path / "probe.json")
    assert state["parent_pid"] != os.getpid()  # forked from the template, not from this process
    assert "topk_bench.child.worker" in state["parent_cmdline"] and "--template" in state["parent_cmdline"]
    # The template is idle between forks: what it has now, it had when it forked the probe.
    assert state["parent_threads"] == 1
    assert state["cuda_initialized"] is False
    assert state["python_threads"] == ["MainThread"]
    assert state["nvml_check"] == os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")  # the template's, undone


@pytest.mark.slow
def test_a_case_that_corrupts_process_state_does_not_affect_the_next_case(tmp_path):
    before = probe(tmp_path / "before.json")
    corrupt = run_isolated(case("test_corrupt", nbytes=128 * MIB), Budget(max_seconds=60), env=CHILD_ENV)
    # Its never-ending thread does not hold the child at exit: the case ends, measured.
    assert corrupt.status == "ok", corrupt.error
    assert corrupt.metadata["child_wall_s"] < 30
    after = probe(tmp_path / "after.json")
    assert after["parent_pid"] == before["parent_pid"] and after["pid"] != before["pid"]
    assert after["default_dtype"] == "torch.float32" and after["deterministic"] is False
    assert after["python_threads"] == ["MainThread"] and after["parent_threads"] == 1
    assert after["leaked_env"] is None and after["leaked_module"] is False and after["ballast"] == 0
    # The 256 MiB the corrupting case held (two iterations) went with its process, not into the template.
    assert after["parent_rss_kib"] - before["parent_rss_kib"] < 64 * 1024


@pytest.mark.slow
def test_a_child_gets_the_threads_a_fresh_interpreter_would(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    # The same template serves both: its own thread settings must be a fresh interpreter's, not the first child's.
    one = probe(tmp_path / "one.json", env={"OMP_NUM_THREADS": "1"})
    assert one["torch_threads"] == 1 and one["omp_num_threads"] == "1"
    default = int(fresh_interpreter("import torch; print(torch.get_num_threads())"))
    unset = probe(tmp_path / "default.json", env=None)
    assert unset["parent_pid"] == one["parent_pid"]
    assert unset["torch_threads"] == default and unset["omp_num_threads"] is None


@pytest.mark.parametrize(
    "env, threads",
    [
        ({}, None),
        ({"OMP_NUM_THREADS": "3"}, 3),
        ({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "2"}, 2),  # MKL's wins, as in ATen
        ({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "many"}, 3),  # a malformed one is ignored (torch warns)
        ({"OMP_NUM_THREADS": "0"}, None),
        ({"OMP_NUM_THREADS": "-2", "MKL_NUM_THREADS": ""}, None),
    ],
)
def test_a_childs_torch_threads_are_what_torch_reads_from_its_environment(env, threads):
    assert launcher.torch_threads(env) == threads


@pytest.mark.slow
def test_a_child_sees_the_gpu_of_its_job_slot_and_one_template_serves_every_slot(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    first = probe(tmp_path / "first.json", env={**CHILD_ENV, "CUDA_VISIBLE_DEVICES": "1"})
    second = probe(tmp_path / "second.json", env={**CHILD_ENV, "CUDA_VISIBLE_DEVICES": "GPU-8a1f"})
    unset = probe(tmp_path / "unset.json")
    assert (first["cuda_visible_devices"], second["cuda_visible_devices"], unset["cuda_visible_devices"]) == (
        "1",
        "GPU-8a1f",
        None,
    )
    assert first["parent_pid"] == second["parent_pid"] == unset["parent_pid"]


@pytest.mark.slow
def test_random_state_at_start_is_a_fresh_interpreters(tmp_path):
    first, second = probe(tmp_path / "first.json"), probe(tmp_path / "second.json")
    draw = "import json, torch; print(json.dumps(torch.rand(4).tolist()))"
    fresh = [json.loads(fresh_interpreter(draw)) for _ in range(2)]
    if fresh[0] == fresh[1]:  # torch seeds with a fixed value at import: so does each child
        assert first["import_draws"]["torch"] == second["import_draws"]["torch"] == fresh[0]
    else:  # torch seeds from the OS at import: each child its own stream, not its siblings'
        assert first["import_draws"]["torch"] != second["import_draws"]["torch"]
    # numpy seeds from the OS at import: the children do not share their template's.
    assert first["import_draws"]["numpy"] != second["import_draws"]["numpy"]


@pytest.mark.slow
def test_a_template_that_dies_fails_its_running_case_and_the_next_case_gets_a_new_one(tmp_path):
    pid_file = tmp_path / "child.pid"
    sleepy = case("test_sleep", seconds=120.0, pid_file=str(pid_file))
    results = []
    # A daemon thread: if run_isolated never returned, the test fails instead of hanging.
    waiter = threading.Thread(
        target=lambda: results.append(run_isolated(sleepy, Budget(max_seconds=300), env=CHILD_ENV)), daemon=True
    )
    waiter.start()
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and waiter.is_alive(), "the child never started sleeping"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    template = int(Path(f"/proc/{child}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    os.kill(template, signal.SIGKILL)
    waiter.join(60)
    assert results, "run_isolated did not return after its template died"
    result = results[0]
    assert result.status == "crashed" and "the template process died (killed by SIGKILL)" in result.error
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)  # PR_SET_PDEATHSIG: it died with the template
    again = probe(tmp_path / "again.json")
    assert again["parent_pid"] != template


@pytest.mark.slow  # a fresh interpreter importing torch
def test_fork_hazard_lets_fork_aware_pools_stop_and_refuses_other_threads():
    code = textwrap.dedent("""
        import threading, time
        from topk_bench.child import template
        print(repr(template.fork_hazard()), template.thread_count())
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        print(repr(template.fork_hazard()))
    """)
    # Importing torch starts OpenBLAS's pool (numpy's) when it may use more than one core.
    clean, refused = fresh_interpreter(
        code, env={k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    ).splitlines()
    assert clean == "'' 1"
    assert "the template has 2 threads" in refused


@pytest.mark.slow  # a fresh interpreter importing torch and warming up
@pytest.mark.parametrize("cuda_build", [True, False], ids=["cuda-build", "cpu-build"])
def test_the_template_warms_up_without_initialising_cuda(cuda_build):
    # FakeTensorMode asks torch.cuda.is_available(): in the template torch asks nobody (the driver,
    # cudaGetDeviceCount, initialises CUDA, and forked children could not use it; NVML starts a thread).
    # And in a CUDA build no backward: the autograd engine's first run counts the GPUs (initialising
    # the driver) and starts a thread per GPU (seen on an H100: threads `cuda00001800007` and
    # `pt_autograd_0`), and a template with threads must not fork. A CPU build warms backward up too.
    code = textwrap.dedent("""
        import os, socket, torch
        torch.backends.cuda.is_built = lambda: CUDA_BUILD
        calls = []
        def record(name):
            def fake(*args, **kwargs):
                calls.append((name, os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")))
                return False if name == "is_available" else 0
            return fake
        for name in ("is_available", "device_count", "init", "_lazy_init", "current_device"):
            setattr(torch.cuda, name, record(name))
        torch.autograd._engine_run_backward = record("backward")
        import topk_bench.attention
        from topk_bench.child import template, warmup

        class EveryImplementation(warmup.WarmUp):
            def start(self):
                super().start()
                for spec in topk_bench.attention.all_specs():
                    self._predict(spec.name)

        ours, parent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent.close()  # the template serves until end of file: at once
        warm_up = EveryImplementation()
        template.serve(ours.detach(), run=None, warmer=warm_up)
        assert sorted(warm_up.done) == sorted(s.name for s in topk_bench.attention.all_specs() if s.predictable)
        print(sorted(set(calls)), torch.cuda.is_initialized())
    """).replace("CUDA_BUILD", str(cuda_build))
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    backward = [] if cuda_build else [("backward", "1")]
    assert fresh_interpreter(code, env={**env, **CHILD_ENV}) == f"{backward} False"


@pytest.mark.slow  # a fresh interpreter importing torch and warming up
def test_the_template_warm_up_never_asks_nvml_which_starts_a_thread():
    """On an H100 (driver 580) NVML's device count started a thread, ``cuda00001800007``, inside the template's
    warm-up (FakeTensorMode asking torch.cuda.is_available()): the template could not fork, and every case
    paid a fresh interpreter (~10 s each). With the GPUs hidden instead, FakeTensorMode asks the CUDA device
    guard for its count, which initialises the driver. Here a CUDA build is stood in for: its NVML by a count
    that starts a thread as that one did, its device guard by a recorder. The template's warm-up must ask
    neither, and keep one thread."""
    code = textwrap.dedent("""
        import os, socket, threading, torch
        asked = []
        def nvml_count():
            asked.append("nvml")
            threading.Thread(target=threading.Event().wait, daemon=True, name="cuda00001800007").start()
            return 1
        torch.cuda._raw_device_count_nvml = nvml_count
        torch._C._ensureCUDADeviceGuardSet = lambda: asked.append("device guard")
        torch.backends.cuda.is_built = lambda: True
        cpu_build_is_available = torch.cuda.is_available
        def cuda_build_is_available():  # torch's own answer, as a CUDA build gives it
            torch.cuda._is_compiled = lambda: True
            try:
                return cpu_build_is_available()
            finally:
                torch.cuda._is_compiled = lambda: False
        torch.cuda.is_available = cuda_build_is_available
        from topk_bench.child import template, warmup

        ours, parent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent.close()  # the template serves until end of file: at once
        warm_up = warmup.WarmUp()
        template.serve(ours.detach(), run=None, warmer=warm_up)
        print(asked, template.fork_hazard() or "forks", torch.cuda.is_available is cuda_build_is_available)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    # torch's own is_available is back after the warm-up: the children ask it.
    assert fresh_interpreter(code, env={**env, **CHILD_ENV}) == "[] forks True"


def test_templates_are_forgotten_in_a_forked_copy_of_the_parent():
    read, write = os.pipe()
    with launcher._templates_lock:
        launcher._templates[("marker",)] = fake = _FakeTemplate()
    try:
        pid = os.fork()
        if pid == 0:  # the copy: no template of its parent, and its copy of their socket closed
            os.write(write, b"1" if not launcher._templates and fake.closed else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(read, 1) == b"1"
        assert launcher._templates[("marker",)] is fake and not fake.closed
    finally:
        launcher._templates.pop(("marker",), None)
        os.close(read)
        os.close(write)


class _FakeTemplate:
    def __init__(self):
        self.closed = False
        self._sock = self

    def close(self):
        self.closed = True


def test_the_cli_starts_the_template_early_only_for_the_local_executor(tmp_path, monkeypatch):
    from topk_bench.cli import run_cmd

    started = []
    monkeypatch.setattr(launcher, "prestart", lambda: started.append(True))
    slurm, broken = tmp_path / "slurm.toml", tmp_path / "broken.toml"
    slurm.write_text('[executor]\nkind = "slurm"\n')
    broken.write_text("[executor\n")
    monkeypatch.chdir(tmp_path)  # no bench.toml here: the defaults, local
    for config, flag, expected in [
        (None, None, 1),
        (None, "slurm", 0),
        (slurm, None, 0),
        (slurm, "local", 1),
        (broken, None, 0),
    ]:
        started.clear()
        run_cmd.start_template_early(config, flag)
        assert len(started) == expected, (config, flag)


@pytest.mark.slow
def test_a_template_that_must_not_fork_starts_fresh_interpreters_instead(tmp_path, capfd):
    # On the first H100 the template had 3 threads after importing a CUDA build of torch, and every
    # case came back 'crashed' ("the template refused to fork"). Now such a case runs, in a fresh
    # interpreter: as isolated as a fork, only slower. The variable forces the same path here.
    env = {**CHILD_ENV, "TOPK_BENCH_FRESH_INTERPRETER": "1"}
    state = probe(tmp_path / "probe.json", env=env)
    assert "--template" not in state["cmdline"] and "--ready-fd" in state["cmdline"]  # its own interpreter
    assert "--template" in state["parent_cmdline"]  # the template started it, by exec: not a fork of itself
    assert state["parent_pid"] != os.getpid()
    # A second case: the template is still there and serves it the same way; one notice in all.
    again = probe(tmp_path / "again.json", env=env)
    assert again["parent_pid"] == state["parent_pid"] and again["pid"] != state["pid"]
    assert capfd.readouterr().err.count("fresh interpreters") == 1
