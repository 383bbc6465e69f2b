"""Count the SASS opcodes of ``topk_select_kernel`` (float32 and bfloat16 builds) without a GPU: how docs/triton.md
compares the selection designs' binaries (barriers, shared-memory traffic, shuffles).

    .venv/bin/python scripts/select_sass_counts.py                       # this checkout's kernel
    git show REV:topk_bench/attention/kernels/triton/training_kernels.py > /tmp/k.py
    PYTHONPATH=. .venv/bin/python scripts/select_sass_counts.py --kernels /tmp/k.py   # another revision's

sm_90, d = 64, k = 128 (K_PAD = 128), causal, 8 warps; constexprs the kernel does not declare are dropped, so a
revision with other tile parameters compiles too. Static counts over the whole kernel, not executed instructions.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import re
import subprocess
import tempfile

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

OPCODES = ("BAR", "STS", "LDS", "SHFL", "HMMA", "FFMA", "LDG", "STG")


def counts(fn, dtype: str) -> collections.Counter:
    import triton
    import triton.backends.nvidia as nvidia
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from topk_bench.attention.kernels import triton as tk

    config = tk.select_config(128, 64) | dict(CAUSAL=True, ROUND=dtype != "fp32", HALF_DOT=dtype != "fp32")
    warps = config.pop("num_warps")
    constexprs = {name: value for name, value in config.items() if name in fn.arg_names}
    pointers = {"Q": "*" + dtype, "K": "*" + dtype, "IDX": "*i32", "BUF": "*i64"}
    signature = {a: "constexpr" if a in constexprs else pointers.get(a, "i32") for a in fn.arg_names}
    source = ASTSource(fn, signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    cuobjdump = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    pattern = r"/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)"
    return collections.Counter(m.group(1).split(".")[0] for m in re.finditer(pattern, sass))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", help="a kernels.py to load instead of this checkout's")
    args = parser.parse_args()
    if args.kernels:
        spec = importlib.util.spec_from_file_location("kernels_under_test", args.kernels)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        from topk_bench.attention.kernels.triton import training_kernels as module
    for dtype in ("fp32", "bf16"):
        ops = counts(module.topk_select_kernel, dtype)
        print(f"{dtype}: {sum(ops.values())} instructions; " + ", ".join(f"{op} {ops[op]}" for op in OPCODES))


if __name__ == "__main__":
    main()
