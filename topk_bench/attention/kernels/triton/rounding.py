"""Rounding a float32 score to a half dtype inside a Triton kernel, as a half-precision product rounds."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rounded(s, dtype: tl.constexpr):
    """Float32 ``s`` rounded to ``dtype`` (to nearest, ties to even), as a half-precision product rounds. The
    interpreter's float32 to bfloat16 conversion truncates, so bfloat16 is rounded on the bits first (then the
    conversion is exact: the compiled kernel computes the same)."""
    if dtype == tl.bfloat16:
        bits = s.to(tl.int32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & -65536
        s = bits.to(tl.float32, bitcast=True)
    return s.to(dtype)
