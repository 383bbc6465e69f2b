"""Plug-ins: user modules that register implementations or workloads, imported in the parent and in each child.

A plug-in is a module name (importable from the current directory or
installed) or a ``.py`` file. The parent (:func:`resolve`) checks that each
imports, reporting a failure as bad input, and hands the child absolute paths;
the child (:func:`load`) imports them again before measuring.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Iterable

from topk_bench.errors import BadInput


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


def _load(plugin: str) -> None:
    if not _is_file(plugin):
        importlib.import_module(plugin)
        return
    path = Path(plugin).resolve()
    name = f"topk_bench_plugin_{path.stem}_{abs(hash(str(path))):x}"
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
        try:
            with contextlib.redirect_stdout(sys.stderr):  # a plug-in's prints must not mix into run's output
                load([plugin])
        except Exception as exc:  # any failure of user code is bad input, reported in one line
            raise BadInput(f"cannot import plug-in {plugin!r} ({type(exc).__name__}: {exc})",
                           file=suite_path, key=key) from None
        resolved.append(plugin)
    return resolved
