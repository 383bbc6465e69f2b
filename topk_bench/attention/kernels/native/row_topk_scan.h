/* The row top-k's vectorised passes (row_topk_body.h calls them, each returning "not done here" when this CPU's
 * build lacks it or row_topk_isa capped it below its level): the threshold filter, the group maxima, the
 * candidates' compaction.  Levels: 0 portable (the body's own loops), 1 AVX2, 2 AVX-512 (16-bit scores:
 * AVX-512BW and VBMI2's 16-bit compress).  Every level keeps the same columns in the same order.
 *
 * The filter appends the columns j of x[j..j1) whose rank is not below t, in order, to idx[*n..] (int32) and
 * their scores to val[*n..], one compare per score:
 *   f32: rank = the value; not below t = !(x < t) (NaN is never below: it ranks highest);
 *   s16: 16-bit ranks (i16: int16 as they are; h16: half floats' bits made ordered).
 * It returns the column it stopped at: j1, or earlier when a vector's lanes no longer fit below `limit` (the
 * body's portable loop takes the last columns, or cuts the candidates first); -1: not done here.  `ahead`: the
 * next row of the tile (or NULL), whose same columns it asks the L2 cache to fetch while it scans this row
 * (which the maxima have just read): the next row then comes from the cache, not from memory, whose wait is
 * otherwise as long as all the work on a row.
 */
#if defined(__x86_64__) && (defined(__AVX2__) || defined(__AVX512F__))
#include <immintrin.h>
#endif

#define PREFETCH(p) __builtin_prefetch((p), 0, 2) /* into L2 */

#define ISA_PORTABLE 0
#define ISA_AVX2 1
#define ISA_AVX512 2

#if defined(__x86_64__) && defined(__AVX512F__)
#define HAVE_F32_AVX512 1
#endif
#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512VBMI2__)
#define HAVE_S16_AVX512 1
#endif
#if defined(__x86_64__) && defined(__AVX2__)
#define HAVE_AVX2 1
#endif

static int isa_level = ISA_AVX512; /* the highest level used (row_topk_isa) */

static int compiled_level(int bits)
{
    int level = ISA_PORTABLE;
    (void)bits;
#ifdef HAVE_AVX2
    level = ISA_AVX2;
#endif
#ifdef HAVE_F32_AVX512
    if (bits == 32) level = ISA_AVX512;
#endif
#ifdef HAVE_S16_AVX512
    if (bits == 16) level = ISA_AVX512;
#endif
    return level;
}

static int level_for(int bits)
{
    int compiled = compiled_level(bits);
    return compiled < isa_level ? compiled : isa_level;
}

/* Caps the filters' level at `cap` (cap < 0: unchanged); returns the levels in use, as two digits: 32-bit
 * scores' level, then 16-bit scores'.  Not to be called while a row_topk runs. */
int row_topk_isa(int64_t cap)
{
    if (cap >= 0) isa_level = cap > ISA_AVX512 ? ISA_AVX512 : (int)cap;
    return level_for(32) * 10 + level_for(16);
}

#ifdef HAVE_AVX2
/* AVX2 has no compress: the set bits of a lane mask, one store each (few: the filter keeps few). */
#define APPEND_BITS(m, x, j, idx, val, n)         \
    do {                                          \
        uint32_t m_ = (m);                        \
        while (m_) {                              \
            int64_t c_ = (j) + __builtin_ctz(m_); \
            (idx)[n] = (int32_t)c_;               \
            (val)[n] = (x)[c_];                   \
            (n)++;                                \
            m_ &= m_ - 1;                         \
        }                                         \
    } while (0)
#endif

#ifdef HAVE_F32_AVX512
static inline int64_t f32_append_avx512(__mmask16 m, __m512 v, __m512i at, int32_t *idx, float *val, int64_t n)
{
    _mm512_storeu_si512(idx + n, _mm512_maskz_compress_epi32(m, at));
    _mm512_storeu_ps(val + n, _mm512_maskz_compress_ps(m, v));
    return n + __builtin_popcount(m);
}

static int64_t f32_filter_avx512(const float *x, const float *ahead, int64_t j, int64_t j1, float t, int32_t *idx,
                                 float *val, int64_t *n_io, int64_t limit)
{
    int64_t n = *n_io;
    const __m512 tv = _mm512_set1_ps(t);
    __m512i at = _mm512_add_epi32(_mm512_set1_epi32((int32_t)j),
                                  _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m512i step = _mm512_set1_epi32(16), step2 = _mm512_set1_epi32(32);
    for (; j + 32 <= j1 && n + 32 <= limit; j += 32) { /* two vectors a test: most pairs hold no candidate */
        if (ahead) {
            PREFETCH(ahead + j);
            PREFETCH(ahead + j + 16);
        }
        __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + 16);
        __mmask16 ma = _mm512_cmp_ps_mask(a, tv, _CMP_NLT_UQ), mb = _mm512_cmp_ps_mask(b, tv, _CMP_NLT_UQ);
        if (ma | mb) {
            n = f32_append_avx512(ma, a, at, idx, val, n);
            n = f32_append_avx512(mb, b, _mm512_add_epi32(at, step), idx, val, n);
        }
        at = _mm512_add_epi32(at, step2);
    }
    *n_io = n;
    return j; /* the last < 32 columns: the portable loop */
}
#endif

#ifdef HAVE_AVX2
static int64_t f32_filter_avx2(const float *x, const float *ahead, int64_t j, int64_t j1, float t, int32_t *idx,
                               float *val, int64_t *n_io, int64_t limit)
{
    int64_t n = *n_io;
    const __m256 tv = _mm256_set1_ps(t);
    for (; j + 16 <= j1 && n + 16 <= limit; j += 16) {
        if (ahead) PREFETCH(ahead + j);
        uint32_t a = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), tv, _CMP_NLT_UQ));
        uint32_t b = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j + 8), tv, _CMP_NLT_UQ));
        if (a | b) APPEND_BITS(a | (b << 8), x, j, idx, val, n);
    }
    *n_io = n;
    return j;
}
#endif

#ifdef HAVE_S16_AVX512
static int64_t s16_filter_avx512(const int16_t *x, const int16_t *ahead, int64_t j, int64_t j1, int16_t t, int half,
                                 int32_t *idx, int16_t *val, int64_t *n_io, int64_t limit)
{
    int64_t n = *n_io;
    const __m512i tv = _mm512_set1_epi16(t), low15 = _mm512_set1_epi16(0x7FFF);
    __m512i at = _mm512_add_epi32(_mm512_set1_epi32((int32_t)j),
                                  _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m512i step = _mm512_set1_epi32(16), step2 = _mm512_set1_epi32(32);
    for (; j + 32 <= j1 && n + 32 <= limit; j += 32) {
        if (ahead) PREFETCH(ahead + j);
        __m512i v = _mm512_loadu_si512(x + j), r = v;
        if (half) r = _mm512_xor_si512(r, _mm512_and_si512(_mm512_srai_epi16(r, 15), low15));
        __mmask32 m = _mm512_cmpge_epi16_mask(r, tv);
        if (m) {
            __mmask16 a = (__mmask16)m, b = (__mmask16)(m >> 16);
            _mm512_storeu_si512(val + n, _mm512_maskz_compress_epi16(m, v));
            _mm512_storeu_si512(idx + n, _mm512_maskz_compress_epi32(a, at));
            n += __builtin_popcount(a);
            _mm512_storeu_si512(idx + n, _mm512_maskz_compress_epi32(b, _mm512_add_epi32(at, step)));
            n += __builtin_popcount(b);
        }
        at = _mm512_add_epi32(at, step2);
    }
    *n_io = n;
    return j;
}
#endif

#ifdef HAVE_AVX2
static inline __m256i ordered16_avx2(__m256i v, int half)
{
    return half ? _mm256_xor_si256(v, _mm256_and_si256(_mm256_srai_epi16(v, 15), _mm256_set1_epi16(0x7FFF))) : v;
}

static int64_t s16_filter_avx2(const int16_t *x, const int16_t *ahead, int64_t j, int64_t j1, int16_t t, int half,
                               int32_t *idx, int16_t *val, int64_t *n_io, int64_t limit)
{
    int64_t n = *n_io;
    if (t == INT16_MIN) return -1; /* everything passes: t - 1 below does not exist */
    const __m256i below = _mm256_set1_epi16((int16_t)(t - 1));
    for (; j + 32 <= j1 && n + 32 <= limit; j += 32) {
        if (ahead) PREFETCH(ahead + j);
        __m256i a = _mm256_cmpgt_epi16(ordered16_avx2(_mm256_loadu_si256((const __m256i *)(x + j)), half), below);
        __m256i b = _mm256_cmpgt_epi16(ordered16_avx2(_mm256_loadu_si256((const __m256i *)(x + j + 16)), half), below);
        /* 32 lanes to 32 bytes, in order (packs interleaves the 128-bit halves; the permute undoes it) */
        uint32_t m = (uint32_t)_mm256_movemask_epi8(_mm256_permute4x64_epi64(_mm256_packs_epi16(a, b), 0xD8));
        if (m) APPEND_BITS(m, x, j, idx, val, n);
    }
    *n_io = n;
    return j;
}
#endif

/* The group maxima (row_topk_body.h's F(groups_bound)) of float32 rows, for G a multiple of 256: 16 vectors of
 * maxima in registers while the row streams past, no store per vector (a read of a row the cache no longer
 * holds then runs at the speed of a plain read).  Returns 0 when it does not apply. */
#ifdef HAVE_F32_AVX512
static int f32_maxima_avx512(const float *x, int64_t width, int64_t G, float *gm)
{
    int64_t s = width / G, rem = width - s * G;
    for (int64_t g0 = 0; g0 < G; g0 += 256) {
        __m512 acc[16];
        for (int v = 0; v < 16; v++) acc[v] = _mm512_set1_ps(-INFINITY);
        for (int64_t m = 0; m < s; m++) {
            const float *xm = x + m * G + g0;
            for (int v = 0; v < 16; v++) acc[v] = _mm512_max_ps(_mm512_loadu_ps(xm + 16 * v), acc[v]);
        }
        for (int v = 0; v < 16; v++) _mm512_storeu_ps(gm + g0 + 16 * v, acc[v]);
    }
    for (int64_t g = 0; g < rem; g++) gm[g] = x[s * G + g] > gm[g] ? x[s * G + g] : gm[g];
    return 1;
}
#endif

static int f32_maxima_simd(const float *x, int64_t width, int64_t G, float *gm)
{
#ifdef HAVE_F32_AVX512
    if (level_for(32) >= ISA_AVX512 && G % 256 == 0) return f32_maxima_avx512(x, width, G, gm);
#endif
    (void)x; (void)width; (void)G; (void)gm;
    return 0;
}

/* The candidates' compaction (row_topk_body.h's F(keep)), vectorised: keeps, in order, (idx, val)[j] whose key
 * is above t, or equal to t with j < last; returns how many, or -1 (the portable loop). */
#define LIVE16(j, n) ((n) - (j) >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << ((n) - (j))) - 1))

#ifdef HAVE_F32_AVX512
static int64_t f32_keep_avx512(int32_t *idx, float *val, const uint32_t *keys, int64_t n, uint32_t t, int64_t last)
{
    const __m512i tv = _mm512_set1_epi32((int32_t)t);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t m = 0;
    for (int64_t j = 0; j < n; j += 16) { /* m <= j: the stores stay behind the loads */
        __mmask16 live = LIVE16(j, n);
        __m512i key = _mm512_maskz_loadu_epi32(live, keys + j);
        __mmask16 early = _mm512_cmplt_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32((int32_t)j)),
                                                  _mm512_set1_epi32((int32_t)(last < n ? last : n)));
        __mmask16 take = live & (_mm512_cmpgt_epu32_mask(key, tv) | (_mm512_cmpeq_epi32_mask(key, tv) & early));
        __m512i at = _mm512_maskz_compress_epi32(take, _mm512_maskz_loadu_epi32(live, idx + j));
        __m512 v = _mm512_maskz_compress_ps(take, _mm512_maskz_loadu_ps(live, val + j));
        int c = __builtin_popcount(take);
        _mm512_mask_storeu_epi32(idx + m, LIVE16(0, c), at);
        _mm512_mask_storeu_ps(val + m, LIVE16(0, c), v);
        m += c;
    }
    return m;
}
#endif

#ifdef HAVE_S16_AVX512
static int64_t s16_keep_avx512(int32_t *idx, int16_t *val, const uint16_t *keys, int64_t n, uint16_t t, int64_t last)
{
    const __m256i tv = _mm256_set1_epi16((int16_t)t);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t m = 0;
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 live = LIVE16(j, n);
        __m256i key = _mm256_maskz_loadu_epi16(live, keys + j);
        __mmask16 early = _mm512_cmplt_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32((int32_t)j)),
                                                  _mm512_set1_epi32((int32_t)(last < n ? last : n)));
        __mmask16 take = live & (_mm256_cmpgt_epu16_mask(key, tv) | (_mm256_cmpeq_epi16_mask(key, tv) & early));
        __m512i at = _mm512_maskz_compress_epi32(take, _mm512_maskz_loadu_epi32(live, idx + j));
        __m256i v = _mm256_maskz_compress_epi16(take, _mm256_maskz_loadu_epi16(live, val + j));
        int c = __builtin_popcount(take);
        _mm512_mask_storeu_epi32(idx + m, LIVE16(0, c), at);
        _mm256_mask_storeu_epi16(val + m, LIVE16(0, c), v);
        m += c;
    }
    return m;
}
#endif

static int64_t f32_keep_simd(int32_t *idx, float *val, const uint32_t *keys, int64_t n, uint32_t t, int64_t last)
{
#ifdef HAVE_F32_AVX512
    if (level_for(32) >= ISA_AVX512) return f32_keep_avx512(idx, val, keys, n, t, last);
#endif
    (void)idx; (void)val; (void)keys; (void)n; (void)t; (void)last;
    return -1;
}

static int64_t s16_keep_simd(int32_t *idx, int16_t *val, const uint16_t *keys, int64_t n, uint16_t t, int64_t last)
{
#ifdef HAVE_S16_AVX512
    if (level_for(16) >= ISA_AVX512) return s16_keep_avx512(idx, val, keys, n, t, last);
#endif
    (void)idx; (void)val; (void)keys; (void)n; (void)t; (void)last;
    return -1;
}

/* The vectorised filters at the level in use; -1: none (the portable loop). */
static int64_t f32_filter_simd(const float *x, const float *ahead, int64_t j, int64_t j1, float t, int32_t *idx,
                               float *val, int64_t *n, int64_t limit)
{
    int level = level_for(32);
#ifdef HAVE_F32_AVX512
    if (level >= ISA_AVX512) return f32_filter_avx512(x, ahead, j, j1, t, idx, val, n, limit);
#endif
#ifdef HAVE_AVX2
    if (level >= ISA_AVX2) return f32_filter_avx2(x, ahead, j, j1, t, idx, val, n, limit);
#endif
    (void)x; (void)ahead; (void)j; (void)j1; (void)t; (void)idx; (void)val; (void)n; (void)limit; (void)level;
    return -1;
}

static int64_t s16_filter_simd(const int16_t *x, const int16_t *ahead, int64_t j, int64_t j1, int16_t t, int half,
                               int32_t *idx, int16_t *val, int64_t *n, int64_t limit)
{
    int level = level_for(16);
#ifdef HAVE_S16_AVX512
    if (level >= ISA_AVX512) return s16_filter_avx512(x, ahead, j, j1, t, half, idx, val, n, limit);
#endif
#ifdef HAVE_AVX2
    if (level >= ISA_AVX2) return s16_filter_avx2(x, ahead, j, j1, t, half, idx, val, n, limit);
#endif
    (void)x; (void)ahead; (void)j; (void)j1; (void)t; (void)half; (void)idx; (void)val; (void)n; (void)limit;
    (void)level;
    return -1;
}

static int64_t i16_filter_simd(const int16_t *x, const int16_t *ahead, int64_t j, int64_t j1, int16_t t, int32_t *idx,
                               int16_t *val, int64_t *n, int64_t limit)
{
    return s16_filter_simd(x, ahead, j, j1, t, 0, idx, val, n, limit);
}

static int64_t h16_filter_simd(const int16_t *x, const int16_t *ahead, int64_t j, int64_t j1, int16_t t, int32_t *idx,
                               int16_t *val, int64_t *n, int64_t limit)
{
    return s16_filter_simd(x, ahead, j, j1, t, 1, idx, val, n, limit);
}
