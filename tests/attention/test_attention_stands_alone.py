"""``topk_bench.attention`` is the package of the things measured: a user imports it without the harness (nothing
else of topk_bench, no pandas, no plotting), and its old name, ``implementations``, still works for one release
with a FutureWarning."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from locations import ROOT

ATTENTION = ROOT / "topk_bench" / "attention"


def test_no_module_of_the_package_imports_the_harness():
    found = []
    for path in sorted(ATTENTION.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names
                      if n.startswith("topk_bench") and not n.startswith("topk_bench.attention")]  # fmt: skip
    assert found == []


def test_importing_it_loads_nothing_of_the_harness():
    code = (
        "import sys; from topk_bench import attention; attention.get('vanilla'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('topk_bench', 'pandas', 'matplotlib', 'typer')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    modules = set(eval(loaded.stdout))  # a printed list of names
    assert {m for m in modules if not m.startswith("topk_bench.attention")} == {"topk_bench"}, modules


def test_the_old_name_works_with_a_warning_and_gives_the_same_modules():
    code = (
        "import warnings; warnings.simplefilter('error', FutureWarning)\n"
        "try:\n    import implementations\nexcept FutureWarning as w:\n    print('warned:', w)\n"
        "warnings.simplefilter('ignore', FutureWarning)\n"
        "import implementations\n"
        "from implementations.masking import allowed_keys\n"
        "from implementations.triton_kernels import defaults\n"
        "import implementations.registry as old\n"
        "from topk_bench.attention import registry, shared\n"
        "print(old is registry, allowed_keys is shared.masking.allowed_keys, defaults.__name__, "
        "implementations.get('vanilla') is registry.get('vanilla'), implementations.native.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    warned, same = done.stdout.strip().splitlines()
    assert "'implementations' is now 'topk_bench.attention'" in warned
    assert same == "True True topk_bench.attention.kernels.triton.defaults True topk_bench.attention.kernels.native"


def test_every_module_has_its_old_name_in_the_shim():
    sys.modules.pop("implementations", None)
    with pytest.warns(FutureWarning):
        import implementations
    moved = set(implementations.MOVED.values())
    modules = {
        ".".join(("topk_bench", "attention", *p.relative_to(ATTENTION).with_suffix("").parts)).removesuffix(".__init__")
        for p in ATTENTION.rglob("*.py")
    }
    rooms = {f"topk_bench.attention.{folder}" for folder in ("methods", "shared", "kernels")}
    assert modules - moved == {"topk_bench.attention", *rooms}  # new: no old name
    assert moved <= modules
