/* The row top-k of one score type, included by row_topk.c once per type with:
 *   T             the scores' type as stored
 *   R             the type ranks are compared in (floats: the value; 16-bit: an int16 in rank order)
 *   U             the key type: an unsigned integer in rank order, equal keys for equal ranks
 *   F(name)       name prefixed by the type's suffix
 *   RANK(x)       x's rank (an R)
 *   KEY(r)        r's key (floats: NaN highest, -0 as +0, as torch.topk ranks them)
 *   UNKEY(u)      an R whose rank is u's, or the lowest rank above it (floats: keys above +inf's give +inf)
 *   BELOW(r, t)   r ranks below t, one compare (floats: r < t, never for NaN)
 *   R_LOWEST      the lowest rank (-inf; INT16_MIN): nothing ranks below it
 *   SIMD_FILTER   (optional) row_topk_scan.h's vectorised F(filter) for this type
 *   SIMD_KEEP     (optional) row_topk_scan.h's vectorised compaction of F(keep)
 *   SIMD_MAXIMA   (optional) row_topk_scan.h's vectorised group maxima of F(groups_bound)
 */

/* How many of the keys a[0..n) are >= t (vectorised by the compiler; a 32-bit count: 16 lanes of AVX-512). */
static inline int64_t F(at_least)(const U *a, int64_t n, U t)
{
    uint32_t c = 0;
    for (int64_t j = 0; j < n; j++) c += a[j] >= t;
    return c;
}

/* A key t with at least k of a[0..n) >= t (1 <= k <= n) and at most k + slack: a lower bound of the k-th highest
 * key, the k-th highest itself when slack is 0, then *above says how many keys are above it (-1: exactly k keys
 * are >= t, no tie to cut).  Found by narrowing [lo, hi) with counts, each guess where the count would reach
 * k + slack/2 were it linear in between, a halving after a guess that did not halve. */
static U F(threshold)(const U *a, int64_t n, int64_t k, int64_t slack, int64_t *above)
{
    U lo = a[0], hi = a[0];
    for (int64_t j = 1; j < n; j++) {
        lo = a[j] < lo ? a[j] : lo;
        hi = a[j] > hi ? a[j] : hi;
    }
    int64_t at_lo = n, at_hi = F(at_least)(a, n, hi);
    if (at_hi >= k) { /* the highest key has k copies: nothing above it */
        *above = 0;
        return hi;
    }
    int halve = 0; /* at_lo = count(>= lo) >= k > at_hi = count(>= hi) */
    while ((U)(hi - lo) > 1 && at_lo - k > slack) {
        U span = (U)(hi - lo), step = (U)(span / 2);
        if (!halve) {
            double f = (double)(at_lo - k - slack / 2) / (double)(at_lo - at_hi);
            double guess = (double)span * f;
            step = guess < 1.0 ? (U)1 : guess >= (double)span ? (U)(span - 1) : (U)guess;
        }
        U mid = (U)(lo + step);
        int64_t at = F(at_least)(a, n, mid);
        if (at >= k) {
            lo = mid;
            at_lo = at;
        } else {
            hi = mid;
            at_hi = at;
        }
        halve = !halve && (U)(hi - lo) > span / 2;
    }
    *above = at_lo == k ? -1 : at_hi;
    return lo;
}

/* Keeps, in order, the candidates (idx, val) whose key is above t, and those equal to t up to the one where k
 * are kept (above < 0: every one >= t): the lowest columns win ties.  Returns how many are kept. */
static int64_t F(keep)(int32_t *idx, T *val, const U *keys, int64_t n, U t, int64_t k, int64_t above)
{
    int64_t last = n; /* candidates equal to t from `last` on are dropped */
    if (above >= 0) {
        int64_t need = k - above, seen = 0, j = 0;
        for (; j + 64 <= n; j += 64) { /* blocks of 64: a vectorised count, then the block that holds it */
            uint32_t c = 0;
            for (int64_t i = 0; i < 64; i++) c += keys[j + i] == t;
            if (seen + c >= need) break;
            seen += c;
        }
        for (; j < n; j++) {
            seen += keys[j] == t;
            if (seen == need) break;
        }
        last = j + 1;
    }
#ifdef SIMD_KEEP
    int64_t kept = SIMD_KEEP(idx, val, keys, n, t, last);
    if (kept >= 0) return kept;
#endif
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++) { /* written always, kept when taken */
        int64_t take = (keys[j] > t) | ((keys[j] == t) & (j < last));
        idx[m] = idx[j];
        val[m] = val[j];
        m += take;
    }
    return m;
}

/* Cuts the candidates (idx, val)[0..*n) to their k highest, still in order; returns the k-th's key.  keys: *n
 * of scratch. */
static U F(cut)(int32_t *idx, T *val, U *keys, int64_t *n, int64_t k)
{
    int64_t above;
    for (int64_t j = 0; j < *n; j++) keys[j] = KEY(RANK(val[j]));
    U t = F(threshold)(keys, *n, k, 0, &above);
    *n = F(keep)(idx, val, keys, *n, t, k, above);
    return t;
}

/* Appends the columns j of x[j..j1) that do not rank below t, and their scores, to idx and val [*n..), while
 * *n < limit; returns the column reached (j1 unless the buffers are full).  ahead: the next row (or NULL), to
 * fetch into the cache meanwhile. */
static int64_t F(filter)(const T *x, const T *ahead, int64_t j, int64_t j1, R t, int32_t *idx, T *val,
                         int64_t *n_io, int64_t limit)
{
#ifdef SIMD_FILTER
    int64_t reached = SIMD_FILTER(x, ahead, j, j1, t, idx, val, n_io, limit);
    if (reached >= 0) j = reached;
#endif
    int64_t n = *n_io;
    while (j < j1 && n < limit) {
        int64_t end = j + (limit - n) < j1 ? j + (limit - n) : j1;
        for (; j < end; j++) { /* written always, kept when not below */
            if (ahead && (j & 31) == 0) PREFETCH(ahead + j);
            idx[n] = (int32_t)j;
            val[n] = x[j];
            n += !BELOW(RANK(x[j]), t);
        }
    }
    *n_io = n;
    return j;
}

/* The candidates of row x[0..width): every column not below t, in order, cut to the k highest whenever the
 * buffers fill (cap), the threshold then raised past the k-th (a later tie ranks below the kept one: its
 * column is higher).  Into s->idx, s->val; returns how many: >= k unless fewer than k columns rank >= t.
 * ahead: F(filter)'s. */
static int64_t F(scan)(const T *x, const T *ahead, int64_t width, int64_t k, R t, const struct scratch *s,
                       int64_t cap)
{
    int64_t n = 0, j = 0;
    for (;;) {
        j = F(filter)(x, ahead, j, width, t, s->idx, (T *)s->val, &n, cap);
        if (j >= width) return n;
        U kth = F(cut)(s->idx, (T *)s->val, (U *)s->keys, &n, k);
        if (kth == (U)~(U)0) return n; /* nothing ranks above the k kept, and later ties lose */
        t = UNKEY((U)(kth + 1));
    }
}

/* The maxima of G strided groups of the row, g = {g, g+G, ...} (the last width - s*G columns one more member of
 * groups 0, 1, ...), as ranks: a NaN member is skipped (the maximum stays a value of the group, or the lowest). */
static void F(maxima)(const T *x, int64_t width, int64_t G, R *gm)
{
#ifdef SIMD_MAXIMA
    if (SIMD_MAXIMA(x, width, G, gm)) return;
#endif
    int64_t s = width / G, rem = width - s * G;
    for (int64_t g = 0; g < G; g++) gm[g] = R_LOWEST;
    for (int64_t m = 0; m < s; m++) { /* vectorised by the compiler: a max of vectors */
        const T *xm = x + m * G;
        for (int64_t g = 0; g < G; g++) {
            R r = RANK(xm[g]);
            gm[g] = r > gm[g] ? r : gm[g];
        }
    }
    for (int64_t g = 0; g < rem; g++) {
        R r = RANK(x[s * G + g]);
        gm[g] = r > gm[g] ? r : gm[g];
    }
}

/* A threshold at most the k-th highest rank of the row: a key that at least k and at most k + k/8 of the G group
 * maxima reach (k groups, so k columns, rank at or above it).  gm: G ranks, km: G keys of scratch. */
static R F(groups_bound)(const T *x, int64_t width, int64_t G, int64_t k, R *gm, U *km)
{
    int64_t above;
    F(maxima)(x, width, G, gm);
    for (int64_t g = 0; g < G; g++) km[g] = KEY(gm[g]);
    return UNKEY(F(threshold)(km, G, k, k / 8, &above));
}

/* A threshold from a sample of the row (`chunks` runs of SAMPLE_RUN columns, evenly spread): a key about as
 * many sampled scores reach as the row's top-k should put in the sample, and 4 standard deviations more.  No
 * guarantee: the caller checks that k columns pass it.  sk: the sample's keys. */
static R F(sample_bound)(const T *x, int64_t width, int64_t k, int64_t chunks, U *sk)
{
    int64_t size = chunks * SAMPLE_RUN, m = 0, above;
    for (int64_t c = 0; c < chunks; c++) {
        const T *run = x + (chunks > 1 ? c * (width - SAMPLE_RUN) / (chunks - 1) : 0);
        for (int64_t i = 0; i < SAMPLE_RUN; i++) sk[m++] = KEY(RANK(run[i]));
    }
    int64_t expected = k * size / width;
    int64_t r = expected + 4 * isqrt(expected) + 1;
    r = r < size ? r : size;
    return UNKEY(F(threshold)(sk, size, r, r / 8, &above));
}

/* One row x[0..width): its k highest columns, in order, into s->idx[0..k) and their scores into s->val (ties at
 * the k-th: the lowest columns).  The threshold: none (a short row: every column a candidate), else a
 * sample's (p->chunks > 0), else, or when the sample's lets fewer than k through, the groups' bound.  next:
 * the row after it (or NULL), fetched into the cache meanwhile. */
static void F(row)(const T *x, const T *next, int64_t width, int64_t k, const struct plan *p, struct scratch *s)
{
    U *km = (U *)s->km;
    int64_t n = -1;
    if (p->G == 0) {
        n = F(scan)(x, next, width, k, R_LOWEST, s, p->cap);
    } else {
        if (p->chunks > 0) n = F(scan)(x, next, width, k, F(sample_bound)(x, width, k, p->chunks, km), s, p->cap);
        if (n < k) n = F(scan)(x, next, width, k, F(groups_bound)(x, width, p->G, k, (R *)s->gm, km), s, p->cap);
    }
    if (n > k) F(cut)(s->idx, (T *)s->val, (U *)s->keys, &n, k);
}

/* Rows [0, rows) of the tile into the results (F(row_topk)'s addressing), each thread with its own scratch. */
static int F(rows)(const T *in, int64_t inner, int64_t in_outer, int64_t in_inner, int64_t width, int64_t k,
                   T *val, void *idx, int64_t index_bytes, int64_t out_outer, int64_t out_inner, int64_t groups,
                   int64_t base, int64_t start, int64_t rows, int64_t block)
{
    struct plan p = plan_for(width, k);
    struct scratch s;
    int ok = scratch_alloc(&s, &p, sizeof(T), sizeof(U)); /* without it a thread takes no block */
    #pragma omp for schedule(dynamic, 1) nowait
    for (int64_t b = 0; b < (rows + block - 1) / block; b++) {
        if (!ok) continue;
        int64_t r1 = (b + 1) * block < rows ? (b + 1) * block : rows;
        for (int64_t r = b * block; r < r1; r++) {
            int64_t o = r / inner, i = r % inner;
            const T *x = in + o * in_outer + i * in_inner;
            int64_t o1 = (r + 1) / inner, i1 = (r + 1) % inner; /* the next row of the tile, if any */
            F(row)(x, r + 1 < rows ? in + o1 * in_outer + i1 * in_inner : NULL, width, k, &p, &s);
            const int32_t *kept = s.idx;
            const T *kv = (const T *)s.val;
            T *ov = val + o * out_outer + i * out_inner;
            int64_t offset = start + (o / groups) * base, at = o * out_outer + i * out_inner;
            for (int64_t t = 0; t < k; t++) ov[t] = kv[t];
            if (index_bytes == 4) {
                int32_t *oi = (int32_t *)idx + at;
                for (int64_t t = 0; t < k; t++) oi[t] = (int32_t)(offset + kept[t]);
            } else {
                int64_t *oi = (int64_t *)idx + at;
                for (int64_t t = 0; t < k; t++) oi[t] = offset + kept[t];
            }
        }
    }
    scratch_free(&s);
    return ok ? 0 : 2;
}

int F(row_topk)(const T *in, int64_t inner, int64_t in_outer, int64_t in_inner, int64_t width, int64_t k,
                T *val, void *idx, int64_t index_bytes, int64_t out_outer, int64_t out_inner,
                int64_t groups, int64_t base, int64_t start, int64_t rows, int64_t block, int64_t threads)
{
    if (k < 1 || k > width || width > INT32_MAX - 64 || (index_bytes != 4 && index_bytes != 8) || block < 1)
        return 1;
    int status = 0;
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int code = F(rows)(in, inner, in_outer, in_inner, width, k, val, idx, index_bytes, out_outer, out_inner,
                           groups, base, start, rows, block);
        if (code) {
            #pragma omp atomic write
            status = code;
        }
    }
    return status;
}
