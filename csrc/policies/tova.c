/*
 * tova.c - TOVA's scores (Oren et al., 2024, arXiv 2401.06104, "Transformers are
 * Multi-State RNNs"): the float64 weight of the latest decode step.
 *
 * TOVA keeps H2O's score array and selection but assigns instead of adding: each
 * decode step that carries attention sets every held slot's score to that step's
 * weight (widened exactly; -0.0 stored as 0.0, whose bits order as the selection
 * needs), and the new position joins with a score of 0; a step without attention
 * changes no score, and a chunk (prefill, extend) applies its tokens one by one, so a
 * slot ends it with the weight of the last token that read it. The step's weights
 * never include the newest token's weight on itself, so a new position has no score
 * yet: the kind needs recent_window >= 1 (the newest position is always kept). Over
 * budget the lowest scores outside the sinks and the recent window go, equal scores
 * evicting the lower position, exactly as in H2O (select.c: sh_evict_by_key).
 *
 * The assignment has a portable scalar form and, on x86-64, an AVX2 twin with
 * bit-identical results, chosen once per call (SH_KERNEL); sh_kind_tova is the kind's
 * entry.
 */
/* sh-kind: 4 */
#include "../sh_internal.h"
#include "../sh_avx2.h"

/* TOVA's assignment over n slots: scores[i] = attn[i], widening each float32 weight
   exactly (+ 0.0 turns a -0.0 weight into 0.0); then the least slot of [lo, hi)
   (hi <= n; hi when the range is empty). */
static size_t sh_tova_assign_f32(double *scores, const float *attn, size_t n, size_t lo, size_t hi)
{
    for (size_t i = 0; i < n; i++)
        scores[i] = (double)attn[i] + 0.0;
    return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
}

/* scores[i] = attn[i] (-0.0 as 0.0) for i < n; then the least slot of [lo, hi). */
static size_t sh_tova_assign_f64(double *scores, const double *attn, size_t n, size_t lo, size_t hi)
{
    for (size_t i = 0; i < n; i++)
        scores[i] = attn[i] + 0.0;
    return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
}

#if SH_HAVE_AVX2

/* ---------------------------------------------------------------- the AVX2 twins */

/* 4 scores after one step: the weights themselves, + 0.0 so that -0.0 becomes 0.0 (as
   the scalar form). */
AVX2 static inline __m256d set4(double *s, __m256d w)
{
    __m256d x = _mm256_add_pd(w, _mm256_setzero_pd());
    _mm256_storeu_pd(s, x);
    return x;
}

AVX2 static void set_span_f32(double *s, const float *a, size_t from, size_t to)
{
    size_t i = from;
    for (; i + 4 <= to; i += 4)
        set4(s + i, widen4(a + i));
    for (; i < to; i++)
        s[i] = (double)a[i] + 0.0;
}

AVX2 static void set_span_f64(double *s, const double *a, size_t from, size_t to)
{
    size_t i = from;
    for (; i + 4 <= to; i += 4)
        set4(s + i, _mm256_loadu_pd(a + i));
    for (; i < to; i++)
        s[i] = a[i] + 0.0;
}

AVX2 static size_t sh_avx2_tova_assign_f32(double *scores, const float *attn, size_t n, size_t lo,
                                          size_t hi)
{
    if (lo >= hi || hi - lo < 8) {
        set_span_f32(scores, attn, 0, n);
        return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
    }
    set_span_f32(scores, attn, 0, lo);
    least_f64x4 m;
    least_f64x4_start(&m, set4(scores + lo, widen4(attn + lo)), lo);
    size_t i = lo + 4;
    for (; i + 4 <= hi; i += 4)
        least_f64x4_add(&m, set4(scores + i, widen4(attn + i)));
    double least;
    size_t at = least_f64x4_end(&m, &least);
    for (; i < hi; i++) {
        double x = (double)attn[i] + 0.0;
        scores[i] = x;
        if (x < least) {
            least = x;
            at = i;
        }
    }
    set_span_f32(scores, attn, hi, n);
    return at;
}

AVX2 static size_t sh_avx2_tova_assign_f64(double *scores, const double *attn, size_t n, size_t lo,
                                          size_t hi)
{
    if (lo >= hi || hi - lo < 8) {
        set_span_f64(scores, attn, 0, n);
        return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
    }
    set_span_f64(scores, attn, 0, lo);
    least_f64x4 m;
    least_f64x4_start(&m, set4(scores + lo, _mm256_loadu_pd(attn + lo)), lo);
    size_t i = lo + 4;
    for (; i + 4 <= hi; i += 4)
        least_f64x4_add(&m, set4(scores + i, _mm256_loadu_pd(attn + i)));
    double least;
    size_t at = least_f64x4_end(&m, &least);
    for (; i < hi; i++) {
        double x = attn[i] + 0.0;
        scores[i] = x;
        if (x < least) {
            least = x;
            at = i;
        }
    }
    set_span_f64(scores, attn, hi, n);
    return at;
}

#endif /* SH_HAVE_AVX2 */

/* The kind's update (sh_update_fn): the assignment, and the least slot of [lo, hi). */
static size_t sh_tova_update(sh_policy *p, size_t h, int32_t dtype, const void *attn, size_t n,
                             size_t lo, size_t hi, int simd)
{
    if (dtype == SH_DTYPE_F32)
        return SH_KERNEL(simd, tova_assign_f32)(sh_row_scores(p, h), attn, n, lo, hi);
    return SH_KERNEL(simd, tova_assign_f64)(sh_row_scores(p, h), attn, n, lo, hi);
}

/* the latest step's weight in float64; the newest position has no score until a
   later token reads it, so the recent window always keeps it */
const sh_kind_ops sh_kind_tova = {
    .values = SH_VALUES_F64,
    .takes = SH_TAKES_RECENT_WINDOW | SH_TAKES_SINKS,
    .min_recent_window = 1,
    .update = sh_tova_update,
    .evict = sh_evict_by_key,
};
