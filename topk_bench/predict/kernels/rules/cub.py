"""The temporary storage of the cub algorithms ATen calls (aten/src/ATen/cuda/cub.cuh ``CUB_WRAPPER``: the size
is queried, allocated from the caching allocator, used and freed within the call).

- ``DeviceRadixSort::SortPairs`` / ``SortKeys`` (cub/device/dispatch/dispatch_radix_sort.cuh), as
  ``at::cuda::cub::radix_sort_pairs`` / ``radix_sort_keys`` call them (keys in and out apart: not "overwrite
  okay"): up to one tile, a one-byte request; otherwise, for keys of 4 bytes and more, the onesweep pass
  (``InvokeOnesweep``), whose storage is the bins, the lookback, a third key and value buffer (when there is more
  than one pass) and the counters, each aligned to 256 bytes, plus 255 (``AliasTemporaries``); for smaller keys
  the many-tiles passes (``InvokePasses``): the third buffers (their spine, a few KiB, is not modelled). Tiles
  follow ``Policy800``'s onesweep policy (384 threads, 21 items of 4 bytes, scaled by the larger of key and
  value: ``RegBoundScaling``); sm90 is assumed to use the same (an error of at most one lookback row of 1 KiB
  per tile).
- ``DeviceScan::InclusiveSumByKey`` (dispatch_scan_by_key.cuh): the tile states of the decoupled look-back and
  the previous keys: a few KiB for the sizes TensorTopK.cu scans.
"""

from __future__ import annotations

ALIGN = 256
RADIX_DIGITS = 256  # 8-bit onesweep passes
SINGLE_TILE_ITEMS = 256 * 19
ONESWEEP_THREADS, ONESWEEP_ITEMS_4B = 384, 21
PORTION = (1 << 28) - 1


def _aliased(*sizes: int) -> int:
    """``AliasTemporaries``: each allocation rounded up to 256 bytes, plus 255 for the base alignment."""
    return sum(-(-s // ALIGN) * ALIGN for s in sizes) + ALIGN - 1


def _items_per_thread(nominal_4b: int, dominant_bytes: int) -> int:
    """``RegBoundScaling``: a nominal count of 4-byte items, scaled to the dominant type's size."""
    return max(1, min(nominal_4b * 4 // max(4, dominant_bytes), nominal_4b * 2))


def radix_sort_bytes(n: int, key_bytes: int, value_bytes: int = 0, bits: int | None = None) -> int:
    """Temporary storage of ``DeviceRadixSort::SortPairs`` (``value_bytes`` 0: ``SortKeys``) of ``n`` items
    over ``bits`` key bits (default: all of them)."""
    if n <= SINGLE_TILE_ITEMS:
        return 1  # the single-tile kernel: cub asks for one byte
    bits = 8 * key_bytes if bits is None else bits
    passes = -(-bits // 8)
    third = passes > 1
    if key_bytes < 4:  # no onesweep: the many-tiles passes; their spine (digit counts per block) is not modelled
        return _aliased(n * key_bytes if third else 0, n * value_bytes if third else 0)
    tile = ONESWEEP_THREADS * _items_per_thread(ONESWEEP_ITEMS_4B, max(key_bytes, value_bytes))
    portion = PORTION // tile * tile
    portions = -(-n // portion)
    blocks = -(-min(n, portion) // tile)
    return _aliased(
        portions * passes * RADIX_DIGITS * 4,
        blocks * RADIX_DIGITS * 4,
        n * key_bytes if third else 0,
        n * value_bytes if third else 0,
        portions * passes * 4,
    )


def segmented_radix_sort_bytes(n: int, key_bytes: int, value_bytes: int) -> int:
    """``DeviceSegmentedRadixSort::SortPairs`` (dispatch_segmented_sort / DispatchSegmentedRadixSort): the third
    key and value buffers."""
    return _aliased(n * key_bytes, n * value_bytes)


def scan_by_key_bytes(n: int, key_bytes: int = 4, value_bytes: int = 4) -> int:
    """Temporary storage of ``DeviceScan::InclusiveSumByKey`` over ``n`` items (128 threads x 8 items a tile)."""
    tiles = max(1, -(-n // (128 * 8)))
    descriptor = 2 * max(key_bytes, value_bytes) + 8  # a tile's status and its (key, value) aggregate
    return _aliased((tiles + 32) * descriptor, (tiles + 1) * key_bytes)
