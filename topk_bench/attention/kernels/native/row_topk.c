/* Exact row-wise top-k (unsorted) of score tiles, for topk_bench/attention/kernels/native/__init__.py.
 *
 * torch.topk on CPU copies each row into (value, index) pairs and runs nth_element on all of
 * them: a branch mispredicted per comparison, ~9 ns a value.  Here a row is read once by a
 * vectorised max over strided groups, and only the members of about k groups are visited
 * (row_topk_body.h).  The values are torch.topk's; on ties at the k-th value the columns met
 * first are kept.
 *
 * Rows are addressed in two levels, so that the caller reads an [outer, inner, width] tile and
 * writes straight into slices of its [.., Lq, k] results:
 *   row r = o * inner + i  reads   in  + o * in_outer  + i * in_inner
 *                          writes  val + o * out_outer + i * out_inner (idx likewise, int32 or
 *                          int64 by index_bytes), an index being start + (o / groups) * base + column.
 * Built with -fopenmp where torch runs on GNU OpenMP (the library then shares torch's libgomp and
 * its threads: `threads` of the team take blocks of `block` rows in turn); else one thread.
 * Returns 0, 1 (bad arguments) or
 * 2 (no memory for the scratch).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define BINS 512
#define LANES 16 /* lanes of the histogram's passes (fewer values than this: an exact select) */
#define SWAP(v, ix, a, b) do { T t_ = v[a]; v[a] = v[b]; v[b] = t_; \
                               int32_t u_ = ix[a]; ix[a] = ix[b]; ix[b] = u_; } while (0)

/* floats: NaN ranks above everything (as torch.topk); a candidate is anything not <= thr */
#define GT(a, b) ((a) > (b) || ((a) != (a) && (b) == (b)))
#define EQ(a, b) ((a) == (b) || ((a) != (a) && (b) != (b)))
#define ABOVE(y, t) (!((y) <= (t)))
#define NEG_INF(y) ((y) == -INFINITY)
#define POS_INF(y) ((y) == INFINITY)
#define IS_NAN(y) ((y) != (y))
#define LOWEST (-INFINITY)

#define T float
#define SCALE float
#define F(name) f32_##name
#include "row_topk_body.h"
#undef T
#undef F
#undef SCALE

#define T double
#define SCALE double
#define F(name) f64_##name
#include "row_topk_body.h"
#undef T
#undef F
#undef SCALE

#undef GT
#undef EQ
#undef ABOVE
#undef NEG_INF
#undef POS_INF
#undef IS_NAN
#undef LOWEST

/* int16: half scores ranked by their ordered bits (topk_bench/attention/methods/topk_fast.py, _ordered_bits) */
#define GT(a, b) ((a) > (b))
#define EQ(a, b) ((a) == (b))
#define ABOVE(y, t) ((y) > (t))
#define NEG_INF(y) 0
#define POS_INF(y) 0
#define IS_NAN(y) 0
#define LOWEST INT16_MIN
#define T int16_t
#define SCALE float
#define F(name) i16_##name
#include "row_topk_body.h"
