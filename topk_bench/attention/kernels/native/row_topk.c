/* Exact row-wise top-k of score tiles, for topk_bench/attention/kernels/native/__init__.py.
 *
 * A row is filtered against a threshold at or below its k-th highest score, one vectorised compare per score
 * (row_topk_scan.h), into a few candidate columns, in order; an exact select among the candidates (histograms
 * of their keys: integers in rank order) keeps the k highest.  The threshold: the groups' bound (a vectorised
 * maximum over strided groups of the row, then the bin of a histogram of the maxima where the k-th falls), or,
 * for a k that is a large share of the row, the rank a sample of the row puts it at (checked: when fewer than
 * k columns pass it, the groups' bound).  Should the candidates fill their buffer, they are cut to the k
 * highest and the threshold raised past the k-th.
 *
 * The values are torch.topk's (NaN ranks highest, -0 and +0 tie); the columns kept are the k highest, ties at
 * the k-th value going to the lowest columns, written in ascending column order: a stable descending sort's
 * first k, in column order.  The same on every path (the filter's vector level, the threshold's kind, a cut).
 *
 * Rows are addressed in two levels, so that the caller reads an [outer, inner, width] tile and
 * writes straight into slices of its [.., Lq, k] results:
 *   row r = o * inner + i  reads   in  + o * in_outer  + i * in_inner
 *                          writes  val + o * out_outer + i * out_inner (idx likewise, int32 or
 *                          int64 by index_bytes), an index being start + (o / groups) * base + column.
 * Built with -fopenmp where torch runs on GNU OpenMP (the library then shares torch's libgomp and
 * its threads: `threads` of the team take blocks of `block` rows in turn); else one thread.
 * Returns 0, 1 (bad arguments) or 2 (no memory for the scratch).
 *
 * Types: f32, f64; i16 (int16 ranks, as they are); h16 (bfloat16 or float16 scores ranked by their bits made
 * ordered: x ^ ((x >> 15) & 0x7FFF), as topk_bench/attention/methods/topk_fast.py's _ordered_bits ranks them).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef GROUPS_PER_K
#define GROUPS_PER_K 2 /* the groups' bound: G = 2k groups (a pass over 2k maxima, then ~1.4k candidates) */
#endif
#define SAMPLE_EXPECTED 64 /* a sample is sized to hold 64 of the row's top-k, on average */
#define SAMPLE_RUN 64 /* columns of a sample's runs */
#define SLACK 64 /* candidates a vectorised filter may write past its limit's last full vector */

/* How a row of `width` columns is cut to k: G == 0: every column a candidate (a short row); else G groups,
 * and a sample of `chunks` runs first when chunks > 0 (a sample of at most an eighth of the row).  cap: the
 * candidates' buffer. */
struct plan {
    int64_t G, chunks, cap;
};

static struct plan plan_for(int64_t width, int64_t k)
{
    struct plan p = {0, 0, width};
    if (width <= 2 * k || width < 256) return p;
    p.cap = 4 * k + 256 < width ? 4 * k + 256 : width;
    int64_t G = width / 2 < GROUPS_PER_K * k ? width / 2 : GROUPS_PER_K * k;
    G = G >= 256 ? G / 256 * 256 : G / 32 * 32; /* whole blocks of the vectorised maxima */
    p.G = G < k ? k : G;
    int64_t size = (SAMPLE_EXPECTED * width / k + SAMPLE_RUN - 1) / SAMPLE_RUN * SAMPLE_RUN;
    if (size * 8 <= width) p.chunks = size / SAMPLE_RUN;
    return p;
}

/* A thread's scratch: the candidates' columns (idx), scores (val) and keys, the sample's or the group maxima's
 * keys (km), the group maxima (gm: ranks, of the scores' size). */
struct scratch {
    int32_t *idx;
    void *val, *keys, *km, *gm;
};

static int scratch_alloc(struct scratch *s, const struct plan *p, size_t value_bytes, size_t key_bytes)
{
    int64_t sample = p->chunks * SAMPLE_RUN, maxima = p->G > sample ? p->G : sample;
    s->idx = (int32_t *)malloc((size_t)(p->cap + SLACK) * sizeof(int32_t));
    s->val = malloc((size_t)(p->cap + SLACK) * value_bytes);
    s->keys = malloc((size_t)(p->cap + SLACK) * key_bytes);
    s->km = malloc((size_t)(maxima > 0 ? maxima : 1) * key_bytes);
    s->gm = malloc((size_t)(p->G > 0 ? p->G : 1) * value_bytes);
    return s->idx && s->val && s->keys && s->km && s->gm;
}

static void scratch_free(struct scratch *s)
{
    free(s->idx); free(s->val); free(s->keys); free(s->km); free(s->gm);
}

static int64_t isqrt(int64_t v)
{
    int64_t r = 0;
    while ((r + 1) * (r + 1) <= v) r++;
    return r;
}

/* float32 and float64: keys flip negative values' bits, NaN highest, -0 as +0 (no arithmetic: a
 * flush-to-zero mode would change a denormal's key) */
static inline uint32_t f32_key(float r)
{
    uint32_t b;
    memcpy(&b, &r, sizeof b);
    b = b == 0x80000000u ? 0u : b;
    uint32_t key = b ^ ((uint32_t)((int32_t)b >> 31) | 0x80000000u);
    return r != r ? UINT32_MAX : key;
}

static inline float f32_unkey(uint32_t u)
{
    const uint32_t inf = 0xFF800000u; /* +inf's key */
    u = u > inf ? inf : u;
    uint32_t b = (u & 0x80000000u) ? (u ^ 0x80000000u) : ~u;
    float r;
    memcpy(&r, &b, sizeof r);
    return r;
}

static inline uint64_t f64_key(double r)
{
    uint64_t b;
    memcpy(&b, &r, sizeof b);
    b = b == 0x8000000000000000ull ? 0ull : b;
    uint64_t key = b ^ ((uint64_t)((int64_t)b >> 63) | 0x8000000000000000ull);
    return r != r ? UINT64_MAX : key;
}

static inline double f64_unkey(uint64_t u)
{
    const uint64_t inf = 0xFFF0000000000000ull;
    u = u > inf ? inf : u;
    uint64_t b = (u & 0x8000000000000000ull) ? (u ^ 0x8000000000000000ull) : ~u;
    double r;
    memcpy(&r, &b, sizeof r);
    return r;
}

/* 16-bit ranks: int16 as they are (i16), half floats' bits made ordered (h16; the map is its own inverse);
 * keys: the ranks' bits with the sign flipped */
static inline int16_t h16_rank(int16_t x) { return (int16_t)(x ^ ((x >> 15) & 0x7FFF)); }
static inline uint16_t s16_key(int16_t r) { return (uint16_t)((uint16_t)r ^ 0x8000u); }
static inline int16_t s16_unkey(uint16_t u) { return (int16_t)((uint16_t)u ^ 0x8000u); }

#include "row_topk_scan.h"

#define BELOW(r, t) ((r) < (t))

#define T float
#define R float
#define U uint32_t
#define F(name) f32_##name
#define RANK(x) (x)
#define KEY(r) f32_key(r)
#define UNKEY(u) f32_unkey(u)
#define R_LOWEST (-INFINITY)
#define SIMD_FILTER f32_filter_simd
#define SIMD_KEEP f32_keep_simd
#define SIMD_MAXIMA f32_maxima_simd
#include "row_topk_body.h"
#undef T
#undef R
#undef U
#undef F
#undef KEY
#undef UNKEY
#undef R_LOWEST
#undef SIMD_FILTER
#undef SIMD_KEEP
#undef SIMD_MAXIMA

#define T double
#define R double
#define U uint64_t
#define F(name) f64_##name
#define KEY(r) f64_key(r)
#define UNKEY(u) f64_unkey(u)
#define R_LOWEST (-INFINITY)
#include "row_topk_body.h"
#undef T
#undef R
#undef U
#undef F
#undef RANK
#undef KEY
#undef UNKEY
#undef R_LOWEST

#define T int16_t
#define R int16_t
#define U uint16_t
#define KEY(r) s16_key(r)
#define UNKEY(u) s16_unkey(u)
#define R_LOWEST INT16_MIN
#define SIMD_KEEP s16_keep_simd

#define F(name) i16_##name
#define RANK(x) (x)
#define SIMD_FILTER i16_filter_simd
#include "row_topk_body.h"
#undef F
#undef RANK
#undef SIMD_FILTER

#define F(name) h16_##name
#define RANK(x) h16_rank(x)
#define SIMD_FILTER h16_filter_simd
#include "row_topk_body.h"
