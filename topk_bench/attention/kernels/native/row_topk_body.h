/* The row top-k of one value type, included by row_topk.c once per type with:
 *   T           the value type
 *   F(name)     name prefixed by the type's suffix
 *   GT(a, b)    a ranks above b (floats: NaN above everything, as torch.topk)
 *   EQ(a, b)    a and b rank equal
 *   ABOVE(y, t) y may rank above t (a candidate past the threshold t): cheap, one compare;
 *               it may say yes to more than GT (floats: NaN, or any y when t is NaN)
 *   NEG_INF(y)  y is -inf (never for integers)
 *   POS_INF(y)  y is +inf (never for integers)
 *   IS_NAN(y)   y is NaN (never for integers)
 *   LOWEST      the lowest value (-inf; INT16_MIN)
 *   SCALE       the arithmetic of the histogram's bins (float for float and int16, double for double)
 */

/* Reorders v[0..m) (and ix with it) so that v[0..k) holds k values ranking highest. */
static void F(select)(T *v, int32_t *ix, int64_t m, int64_t k)
{
    int64_t lo = 0, hi = m - 1, want = k - 1;
    while (hi > lo) {
        int64_t mid = lo + (hi - lo) / 2;
        /* median of three moved to v[lo]: v[mid] >= v[lo] >= v[hi] */
        if (GT(v[lo], v[mid])) { SWAP(v, ix, lo, mid); }
        if (GT(v[hi], v[mid])) { SWAP(v, ix, hi, mid); }
        if (GT(v[hi], v[lo])) { SWAP(v, ix, hi, lo); }
        T pivot = v[lo];
        int64_t i = lo, j = hi + 1;
        for (;;) { /* Hoare partition, descending: [lo+1..j] >= pivot >= [j+1..hi] */
            do { i++; } while (i <= hi && GT(v[i], pivot));
            do { j--; } while (GT(pivot, v[j]));
            if (i >= j) break;
            SWAP(v, ix, i, j);
        }
        SWAP(v, ix, lo, j);
        if (j == want) return;
        if (j > want) hi = j - 1; else lo = j + 1;
    }
}

/* The lowest-ranking of v[0..k). */
static T F(kth)(const T *v, int64_t k)
{
    T t = v[0];
    for (int64_t j = 1; j < k; j++) if (GT(t, v[j])) t = v[j];
    return t;
}

/* Histogram of v[0..n) (n >= LANES: callers check) in up to BINS bins: bin[j] = 0 for -inf, 1..bins for finite
 * values, ascending; hist[0..bins] their counts.  Returns 0, or 1 when a value is NaN or +inf (no
 * histogram), or 2 when all are -inf.  Branch-free loops (LANES independent lanes: vertical
 * operations vectorise, a reduction over one accumulator does not without -ffast-math, which would
 * drop the NaN tests); the bins are only a guide, callers stay exact whatever a value's rounding. */
static int F(histogram)(const T *v, int64_t n, int32_t *bin, int32_t *hist, int32_t *bins_out, T *hi_out)
{
    T hl[LANES], ll[LANES];
    int bl[LANES];
    for (int l = 0; l < LANES; l++) { hl[l] = v[0]; ll[l] = v[0]; bl[l] = 0; }
    for (int64_t j0 = 0; j0 < n; j0 += LANES) {
        const T *y = v + (j0 + LANES <= n ? j0 : n - LANES); /* the last chunk overlaps */
        for (int l = 0; l < LANES; l++) { /* lo: the lowest value that is not -inf */
            bl[l] |= IS_NAN(y[l]);
            hl[l] = y[l] > hl[l] ? y[l] : hl[l];
            ll[l] = (y[l] < ll[l] || NEG_INF(ll[l])) && !NEG_INF(y[l]) ? y[l] : ll[l];
        }
    }
    T hi = hl[0], lo = ll[0];
    int bad = 0;
    for (int l = 0; l < LANES; l++) {
        bad |= bl[l];
        hi = hl[l] > hi ? hl[l] : hi;
        lo = (ll[l] < lo || NEG_INF(lo)) && !NEG_INF(ll[l]) ? ll[l] : lo;
    }
    if (bad || POS_INF(hi)) return 1;
    if (NEG_INF(hi)) return 2;
    int32_t bins = n / 2 < 16 ? 16 : n / 2 > BINS ? BINS : (int32_t)(n / 2); /* ~2 values a bin */
    double span = (double)hi - (double)lo;
    SCALE scale = span > 0 ? (SCALE)((bins - 1) / span) : 0;
    if (!(scale < INFINITY)) scale = 0;
    for (int64_t j = 0; j < n; j++) {
        SCALE b = ((SCALE)v[j] - (SCALE)lo) * scale;
        b = b < bins - 1 ? b : bins - 1;
        b = b > 0 ? b : 0;
        bin[j] = NEG_INF(v[j]) ? 0 : (int32_t)b + 1;
    }
    for (int b = 0; b <= bins; b++) hist[b] = 0;
    for (int64_t j = 0; j < n; j++) hist[bin[j]]++;
    *bins_out = bins;
    *hi_out = hi;
    return 0;
}

/* The highest bin b such that bins b..bins hold at least k values (0: only with -inf ones);
 * *above: how many the bins above b hold (< k). */
static int32_t F(top_bin)(const int32_t *hist, int32_t bins, int64_t k, int64_t *above)
{
    int64_t acc = 0;
    int32_t b = bins;
    for (; b > 0; b--) {
        if (acc + hist[b] >= k) break;
        acc += hist[b];
    }
    *above = acc;
    return b;
}

/* A lower bound t of the k-th highest of gm[0..G): the lowest of >= k values (so at least k values
 * rank >= t), and few more than k of them: the lowest value of the top bins of F(histogram) that
 * hold k (an exact select over G values would mispredict a branch per comparison).  NaN or +inf
 * among the values: the exact select. */
static T F(bound)(const T *gm, int64_t G, int64_t k, T *sc, int32_t *bin, int32_t *hist)
{
    int32_t bins;
    T hi;
    int status = G < LANES ? 1 : F(histogram)(gm, G, bin, hist, &bins, &hi);
    if (status == 2) return LOWEST;
    if (status == 1) {
        for (int64_t g = 0; g < G; g++) sc[g] = gm[g];
        F(select)(sc, bin, G, k); /* bin: scratch indices here */
        return F(kth)(sc, k);
    }
    int64_t above;
    int32_t b = F(top_bin)(hist, bins, k, &above);
    if (b == 0) return LOWEST; /* fewer than k finite values: -inf is the bound */
    T tl[LANES];
    for (int l = 0; l < LANES; l++) tl[l] = hi;
    for (int64_t g0 = 0; g0 < G; g0 += LANES) {
        int64_t at = g0 + LANES <= G ? g0 : G - LANES;
        for (int l = 0; l < LANES; l++) tl[l] = (bin[at + l] >= b && gm[at + l] < tl[l]) ? gm[at + l] : tl[l];
    }
    T t = hi;
    for (int l = 0; l < LANES; l++) t = tl[l] < t ? tl[l] : t;
    return t;
}

/* Reorders bv/bi[0..n) so that [0..k) holds the k highest: the values of the bins above the one
 * where the k-th falls (F(histogram)), then a select of the rest from that bin's few values.
 * tv/ti, bin: n of scratch each; hist: BINS + 1. */
static void F(finish)(T *bv, int32_t *bi, int64_t n, int64_t k, T *tv, int32_t *ti, int32_t *bin,
                      int32_t *hist)
{
    int32_t bins;
    T hi;
    if (n <= k) return;
    if (n < 4 * LANES || F(histogram)(bv, n, bin, hist, &bins, &hi) != 0) {
        F(select)(bv, bi, n, k);
        return;
    }
    int64_t above;
    int32_t b = F(top_bin)(hist, bins, k, &above);
    /* branch-free split: the bins above b to tv[0..above), bin b's values to tv[n - ...] (from the end) */
    int64_t a = 0, e = n - 1;
    for (int64_t j = 0; j < n; j++) {
        int up = bin[j] > b, at = bin[j] == b;
        tv[a] = bv[j]; ti[a] = bi[j];
        a += up;
        tv[e] = bv[j]; ti[e] = bi[j];
        e -= at;
    }
    int64_t boundary = n - 1 - e; /* bin b's values, in tv[e + 1 .. n) */
    F(select)(tv + e + 1, ti + e + 1, boundary, k - above);
    for (int64_t j = 0; j < above; j++) { bv[j] = tv[j]; bi[j] = ti[j]; }
    for (int64_t j = 0; j < k - above; j++) { bv[above + j] = tv[e + 1 + j]; bi[above + j] = ti[e + 1 + j]; }
}

/* Keeps the k highest of the n candidates; returns the threshold they set (the k-th highest). */
static T F(cut)(T *bv, int32_t *bi, int64_t *n, int64_t k)
{
    F(select)(bv, bi, *n, k);
    *n = k;
    return F(kth)(bv, k);
}

/* One row x[0..width): its k highest values (unsorted) into bv/bi[0..k).
 *
 * Groups g = {g, g+G, g+2G, ...} (s members; the last width - s*G columns are one more member of
 * groups 0, 1, ...).  With thr a lower bound of the k-th highest group maximum (F(bound)), at least
 * k values rank >= thr, so the top-k ranks >= thr and lies in the groups whose maximum ranks >= thr:
 * it is the values of those groups above thr, completed by values equal to thr when fewer than k
 * are above.  Work: a vectorised max over the row, a histogram of the G maxima, a branch-free visit
 * of the members of ~k groups, a select over the few values above thr.
 * Scratch: gm, sc (G values), bin, cand (G ints), hist (BINS + 1 ints), bv, bi, tv, ti, cbin (cap >= 2k + s + 1). */
static __attribute__((noinline)) void F(row)(const T *x, int64_t width, int64_t G, int64_t k, T *gm, T *sc, int32_t *bin,
                   int32_t *cand, int32_t *hist, T *bv, int32_t *bi, int64_t cap, T *tv, int32_t *ti,
                   int32_t *cbin)
{
    int64_t s = width / G, rem = width - s * G;
    for (int64_t g = 0; g < G; g++) gm[g] = x[g];
    for (int64_t m = 1; m < s; m++) {
        const T *xm = x + m * G;
        for (int64_t g = 0; g < G; g++) gm[g] = GT(xm[g], gm[g]) ? xm[g] : gm[g];
    }
    const T *xr = x + s * G;
    for (int64_t g = 0; g < rem; g++) gm[g] = GT(xr[g], gm[g]) ? xr[g] : gm[g];
    T thr = F(bound)(gm, G, k, sc, bin, hist);
    int64_t c = 0;
    for (int64_t g = 0; g < G; g++) { cand[c] = (int32_t)g; c += !GT(thr, gm[g]); }
    int64_t n = 0;
    for (int64_t j = 0; j < c; j++) {
        int64_t g = cand[j], members = s + (g < rem);
        if (n + members + 1 > cap) thr = F(cut)(bv, bi, &n, k);
        for (int64_t m = 0; m < members; m++) { /* written always, kept when above */
            T y = x[m * G + g];
            bv[n] = y;
            bi[n] = (int32_t)(m * G + g);
            n += ABOVE(y, thr);
        }
    }
    if (n < k) { /* no cut happened (a cut leaves k): the k-th highest is thr; add its ties */
        for (int64_t j = 0; j < c && n < k; j++) {
            int64_t g = cand[j], members = s + (g < rem);
            for (int64_t m = 0; m < members && n < k; m++) {
                T y = x[m * G + g];
                if (EQ(y, thr)) { bv[n] = y; bi[n] = (int32_t)(m * G + g); n++; }
            }
        }
    }
    F(finish)(bv, bi, n, k, tv, ti, cbin, hist);
}

/* Rows [r0, r1) of the tile into the results (F(row_topk)'s addressing). */
static int F(rows)(const T *in, int64_t inner, int64_t in_outer, int64_t in_inner, int64_t width, int64_t k,
                   T *val, void *idx, int64_t index_bytes, int64_t out_outer, int64_t out_inner, int64_t groups,
                   int64_t base, int64_t start, int64_t G, int64_t rows, int64_t block)
{
    int64_t cap = 4 * k + width / G + 2;
    /* scratch: gm, sc (G values); bin, cand (G ints); hist; bv, tv (cap values); bi, ti, cbin (cap ints) */
    T *values = (T *)malloc((2 * G + 2 * cap) * sizeof(T));
    int32_t *ints = (int32_t *)malloc((2 * G + BINS + 1 + 3 * cap) * sizeof(int32_t));
    int ok = values && ints; /* without scratch a thread takes no block (every thread meets the loop) */
    T *gm = values, *sc = values + G, *bv = values + 2 * G, *tv = bv + cap;
    int32_t *bin = ints, *cand = ints + G, *hist = ints + 2 * G, *bi = hist + BINS + 1, *ti = bi + cap,
            *cbin = ti + cap;
    /* blocks of rows in turn across the team (a thread that gets its core late takes fewer) */
    #pragma omp for schedule(dynamic, 1) nowait
    for (int64_t b = 0; b < (rows + block - 1) / block; b++) {
        if (!ok) continue;
        int64_t r1 = (b + 1) * block < rows ? (b + 1) * block : rows;
        for (int64_t r = b * block; r < r1; r++) {
            int64_t o = r / inner, i = r % inner;
            F(row)(in + o * in_outer + i * in_inner, width, G, k, gm, sc, bin, cand, hist, bv, bi, cap, tv, ti, cbin);
            T *ov = val + o * out_outer + i * out_inner;
            int64_t offset = start + (o / groups) * base, at = o * out_outer + i * out_inner;
            for (int64_t t = 0; t < k; t++) ov[t] = bv[t];
            if (index_bytes == 4) {
                int32_t *oi = (int32_t *)idx + at;
                for (int64_t t = 0; t < k; t++) oi[t] = (int32_t)(offset + bi[t]);
            } else {
                int64_t *oi = (int64_t *)idx + at;
                for (int64_t t = 0; t < k; t++) oi[t] = offset + bi[t];
            }
        }
    }
    free(values); free(ints);
    return ok ? 0 : 2;
}

int F(row_topk)(const T *in, int64_t inner, int64_t in_outer, int64_t in_inner, int64_t width, int64_t k,
                T *val, void *idx, int64_t index_bytes, int64_t out_outer, int64_t out_inner,
                int64_t groups, int64_t base, int64_t start, int64_t G, int64_t rows, int64_t block,
                int64_t threads)
{
    if (k < 1 || k > G || G > width || width > INT32_MAX || (index_bytes != 4 && index_bytes != 8) || block < 1)
        return 1;
    int status = 0;
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int code = F(rows)(in, inner, in_outer, in_inner, width, k, val, idx, index_bytes, out_outer, out_inner,
                           groups, base, start, G, rows, block);
        if (code) {
            #pragma omp atomic write
            status = code;
        }
    }
    return status;
}
