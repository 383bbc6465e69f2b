/* The entries of a top-k selection sorted by key, stably, by a counting sort (O(n + keys)).
 *
 * keys[e] (int32 or int64 by key_bytes) is entry e's key, in [lo, lo + nkeys).  Writes order[0..n)
 * (int64): the entries by ascending key, ascending entry within a key (what a stable sort gives),
 * and starts[0..nkeys] (int64): key j's entries are order[starts[j] .. starts[j + 1]).  starts is
 * the only scratch (the counts, then the running write positions).  Returns 1 when a key is out of
 * range (nothing written past the arrays), else 0.
 *
 * torch.sort of 4.2M int32 keys took 150-170 ms on an AVX2 EPYC (one thread), this ~15 ms.
 */
#include <stdint.h>

static inline int64_t key_at(const void *keys, int64_t key_bytes, int64_t e)
{
    return key_bytes == 4 ? (int64_t)((const int32_t *)keys)[e] : ((const int64_t *)keys)[e];
}

int key_order(const void *keys, int64_t key_bytes, int64_t n, int64_t lo, int64_t nkeys, int64_t *order,
              int64_t *starts)
{
    for (int64_t j = 0; j <= nkeys; j++) starts[j] = 0;
    for (int64_t e = 0; e < n; e++) {
        int64_t j = key_at(keys, key_bytes, e) - lo;
        if (j < 0 || j >= nkeys) return 1;
        starts[j + 1]++;
    }
    for (int64_t j = 0; j < nkeys; j++) starts[j + 1] += starts[j]; /* starts[j]: key j's first slot */
    for (int64_t e = 0; e < n; e++) order[starts[key_at(keys, key_bytes, e) - lo]++] = e;
    /* starts[j] is now key j's end = key j + 1's start: shift back by one key */
    for (int64_t j = nkeys; j > 0; j--) starts[j] = starts[j - 1];
    starts[0] = 0;
    return 0;
}
