/*
 * h2o.c - Heavy-Hitter Oracle scores (Zhang et al., NeurIPS 2023, arXiv 2306.14048).
 *
 * Each slot accumulates the attention it receives, in double: thousands of float32
 * additions would lose exactly the low bits that decide which of two old positions
 * goes. The selection itself is the shared one (select.c: sh_evict_by_key) and works
 * on the scores' bit patterns, which order like the scores for finite values >= 0.
 * The add has a portable scalar form and, on x86-64, an AVX2 twin with bit-identical
 * results, chosen once per call (SH_KERNEL); sh_kind_h2o is the kind's entry.
 */
/* sh-kind: 2 */
#include <float.h>

#include "../sh_internal.h"
#include "../sh_avx2.h"

/* Adds w to *score, saturating at DBL_MAX so that a score never becomes infinite. */
static inline void accumulate_one(double *score, double w)
{
    double s = *score + w;
    *score = s > DBL_MAX ? DBL_MAX : s;
}

/* H2O's add over n slots: scores[i] += attn[i] in double, saturating at DBL_MAX,
   widening each float32 weight exactly; then the least slot of [lo, hi) (hi <= n; hi
   when the range is empty). Two plain passes, which the compiler vectorises for the
   baseline instruction set. */
static size_t sh_h2o_accumulate_f32(double *scores, const float *attn, size_t n, size_t lo, size_t hi)
{
    for (size_t i = 0; i < n; i++)
        accumulate_one(&scores[i], (double)attn[i]);
    return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
}

/* scores[i] += attn[i] for i < n; then the least slot of [lo, hi). */
static size_t sh_h2o_accumulate_f64(double *scores, const double *attn, size_t n, size_t lo, size_t hi)
{
    for (size_t i = 0; i < n; i++)
        accumulate_one(&scores[i], attn[i]);
    return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
}

#if SH_HAVE_AVX2

/* ---------------------------------------------------------------- the AVX2 twins */

/* 4 scores after one step: the weights added in double, saturating at DBL_MAX
   (min_pd(x, DBL_MAX) is x < DBL_MAX ? x : DBL_MAX, as the scalar form). */
AVX2 static inline __m256d add4(double *s, __m256d w)
{
    __m256d x = _mm256_min_pd(_mm256_add_pd(_mm256_loadu_pd(s), w), _mm256_set1_pd(DBL_MAX));
    _mm256_storeu_pd(s, x);
    return x;
}

AVX2 static inline double add1(double *s, double w)
{
    double x = *s + w;
    x = x > DBL_MAX ? DBL_MAX : x;
    *s = x;
    return x;
}

AVX2 static void add_span_f32(double *s, const float *a, size_t from, size_t to)
{
    size_t i = from;
    for (; i + 4 <= to; i += 4)
        add4(s + i, widen4(a + i));
    for (; i < to; i++)
        add1(&s[i], (double)a[i]);
}

AVX2 static void add_span_f64(double *s, const double *a, size_t from, size_t to)
{
    size_t i = from;
    for (; i + 4 <= to; i += 4)
        add4(s + i, _mm256_loadu_pd(a + i));
    for (; i < to; i++)
        add1(&s[i], a[i]);
}

AVX2 static size_t sh_avx2_h2o_accumulate_f32(double *scores, const float *attn, size_t n, size_t lo,
                                              size_t hi)
{
    if (lo >= hi || hi - lo < 8) {
        add_span_f32(scores, attn, 0, n);
        return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
    }
    add_span_f32(scores, attn, 0, lo);
    least_f64x4 m;
    least_f64x4_start(&m, add4(scores + lo, widen4(attn + lo)), lo);
    size_t i = lo + 4;
    for (; i + 4 <= hi; i += 4)
        least_f64x4_add(&m, add4(scores + i, widen4(attn + i)));
    double least;
    size_t at = least_f64x4_end(&m, &least);
    for (; i < hi; i++) {
        double x = add1(&scores[i], (double)attn[i]);
        if (x < least) {
            least = x;
            at = i;
        }
    }
    add_span_f32(scores, attn, hi, n);
    return at;
}

AVX2 static size_t sh_avx2_h2o_accumulate_f64(double *scores, const double *attn, size_t n, size_t lo,
                                              size_t hi)
{
    if (lo >= hi || hi - lo < 8) {
        add_span_f64(scores, attn, 0, n);
        return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
    }
    add_span_f64(scores, attn, 0, lo);
    least_f64x4 m;
    least_f64x4_start(&m, add4(scores + lo, _mm256_loadu_pd(attn + lo)), lo);
    size_t i = lo + 4;
    for (; i + 4 <= hi; i += 4)
        least_f64x4_add(&m, add4(scores + i, _mm256_loadu_pd(attn + i)));
    double least;
    size_t at = least_f64x4_end(&m, &least);
    for (; i < hi; i++) {
        double x = add1(&scores[i], attn[i]);
        if (x < least) {
            least = x;
            at = i;
        }
    }
    add_span_f64(scores, attn, hi, n);
    return at;
}

#endif /* SH_HAVE_AVX2 */

/* The kind's update (sh_update_fn): the add, and the least slot of [lo, hi). */
static size_t sh_h2o_update(sh_policy *p, size_t h, int32_t dtype, const void *attn, size_t n,
                            size_t lo, size_t hi, int simd)
{
    if (dtype == SH_DTYPE_F32)
        return SH_KERNEL(simd, h2o_accumulate_f32)(sh_row_scores(p, h), attn, n, lo, hi);
    return SH_KERNEL(simd, h2o_accumulate_f64)(sh_row_scores(p, h), attn, n, lo, hi);
}

/* cumulative attention in float64 */
const sh_kind_ops sh_kind_h2o = {
    .values = SH_VALUES_F64,
    .takes = SH_TAKES_RECENT_WINDOW | SH_TAKES_SINKS,
    .update = sh_h2o_update,
    .evict = sh_evict_by_key,
};
