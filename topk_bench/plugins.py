"""Plug-ins: user modules that register implementations or workloads, imported in the parent and in each child.

A plug-in is a module name (importable from the current directory or
installed) or a ``.py`` file. The parent (:func:`resolve`) checks that each
imports, reporting a failure as bad input, and hands the child absolute paths;
the child (:func:`load`) imports them again before measuring.

A plug-in's import is user code that may end the process it runs in (``os._exit``)
or never return: the parent first imports each new one in a forked copy of itself
(:func:`_probe`, tens of milliseconds), and only then for real, so that such a
plug-in is one line of bad input, not a command that exits 0 with nothing said.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import select
import signal
import sys
from collections.abc import Iterable
from pathlib import Path

from topk_bench.errors import BadInput

# A plug-in still importing after this long in the probe is taken for hung (it may compile kernels: minutes).
IMPORT_LIMIT_S = 300.0
_IMPORTED, _RAISED = b"i", b"r"


def _is_file(plugin: str) -> bool:
    return plugin.endswith(".py") or os.sep in plugin or "/" in plugin


def load(plugins: Iterable[str]) -> None:
    """Import each plug-in, each only once per process. A plug-in that exits (``sys.exit``) raises ImportError:
    it must not end the run (parent) or the case (child) without a word."""
    for plugin in plugins:
        try:
            _load(plugin)
        except SystemExit as exc:
            raise ImportError(f"SystemExit({exc.code!r}) raised while importing {plugin}") from None


def _module_name(plugin: str) -> str:
    if not _is_file(plugin):
        return plugin
    path = Path(plugin).resolve()
    return f"topk_bench_plugin_{path.stem}_{abs(hash(str(path))):x}"


def _load(plugin: str) -> None:
    if not _is_file(plugin):
        importlib.import_module(plugin)
        return
    path = Path(plugin).resolve()
    name = _module_name(plugin)
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load plugin file {plugin}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _probe(plugin: str, limit_s: float | None = None) -> str | None:
    """Import ``plugin`` in a forked copy of this process first: why importing it here would end or hang this
    process (None: it returns, or raises, which the real import then reports)."""
    if _module_name(plugin) in sys.modules or not hasattr(os, "fork"):
        return None
    limit_s = IMPORT_LIMIT_S if limit_s is None else limit_s
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # else the copy would write this process's buffered output again
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: import, say how it went, end without running anything of ours
        os.close(read_end)
        word = _IMPORTED
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)  # its prints come once, from the real import
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(1)  # no OpenMP pool in a forked process
            load([plugin])
        except BaseException:  # noqa: BLE001 -- the real import reports it
            word = _RAISED
        os.write(write_end, word)
        os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], limit_s)
        answer = os.read(read_end, 1) if ready else None
    finally:
        os.close(read_end)
        if answer is None:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if answer is None:
        return f"did not finish importing within {limit_s:g} s"
    if answer:
        return None
    code = os.waitstatus_to_exitcode(status)
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    return f"importing it ended the process ({how}; os._exit at import?)"


def resolve(plugins: Iterable[str], suite_path: Path | None = None, key: str = "plugins") -> list[str]:
    """Import ``plugins`` here (so their entries register) and return them with files made absolute.

    Files are relative to the suite's directory; modules are looked up from the
    current directory too, as ``python -m`` would.
    """
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.append(cwd)
    resolved = []
    for plugin in plugins:
        if _is_file(plugin):
            file = Path(plugin)
            if not file.is_absolute() and suite_path is not None:
                file = Path(suite_path).resolve().parent / file
            if not file.is_file():
                raise BadInput(f"plug-in file not found: {file}", file=suite_path, key=key)
            plugin = str(file.resolve())
        problem = _probe(plugin)
        if problem:
            raise BadInput(f"cannot import plug-in {plugin!r}: {problem}", file=suite_path, key=key)
        try:
            with contextlib.redirect_stdout(sys.stderr):  # a plug-in's prints must not mix into run's output
                load([plugin])
        except Exception as exc:  # noqa: BLE001 -- any failure of user code is bad input, reported in one line
            raise BadInput(
                f"cannot import plug-in {plugin!r} ({type(exc).__name__}: {exc})", file=suite_path, key=key
            ) from None
        resolved.append(plugin)
    return resolved
