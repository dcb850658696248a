/*
 * h2o.c - Heavy-Hitter Oracle scores (Zhang et al., NeurIPS 2023, arXiv 2306.14048)
 * and TOVA's (Oren et al., 2024, arXiv 2401.06104).
 *
 * H2O: each slot accumulates the attention it receives, in double: thousands of
 * float32 additions would lose exactly the low bits that decide which of two old
 * positions goes. TOVA: each slot holds the weight of the latest decode step, widened
 * exactly to double (assigned, not added). The selection itself is shared with
 * Scissorhands (select.c) and works on the scores' bit patterns, which order like
 * the scores for finite values >= 0 (so -0.0 is stored as 0.0). The kernels here are
 * the portable scalar forms, simd.c holds the AVX2 ones; sh_h2o_update and
 * sh_tova_update are the two kinds' updates (kinds.c).
 */
#include <float.h>
#include "sh_internal.h"

/* Adds w to *score, saturating at DBL_MAX so that a score never becomes infinite. */
static inline void accumulate_one(double *score, double w)
{
    double s = *score + w;
    *score = s > DBL_MAX ? DBL_MAX : s;
}

/* scores[i] += attn[i] for i < n, widening each float32 weight exactly; then the least
   slot of [lo, hi) (hi when the range is empty). Two plain passes, which the compiler
   vectorises for the baseline instruction set. */
size_t sh_h2o_accumulate_f32(double *scores, const float *attn, size_t n, size_t lo, size_t hi)
{
    for (size_t i = 0; i < n; i++)
        accumulate_one(&scores[i], (double)attn[i]);
    return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
}

/* scores[i] += attn[i] for i < n; then the least slot of [lo, hi). */
size_t sh_h2o_accumulate_f64(double *scores, const double *attn, size_t n, size_t lo, size_t hi)
{
    for (size_t i = 0; i < n; i++)
        accumulate_one(&scores[i], attn[i]);
    return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
}

/* scores[i] = attn[i] for i < n, widening each float32 weight exactly (+ 0.0 turns a
   -0.0 weight into 0.0, whose bits order as the selection needs); then the least slot
   of [lo, hi) (hi when the range is empty). */
size_t sh_tova_assign_f32(double *scores, const float *attn, size_t n, size_t lo, size_t hi)
{
    for (size_t i = 0; i < n; i++)
        scores[i] = (double)attn[i] + 0.0;
    return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
}

/* scores[i] = attn[i] (-0.0 as 0.0) for i < n; then the least slot of [lo, hi). */
size_t sh_tova_assign_f64(double *scores, const double *attn, size_t n, size_t lo, size_t hi)
{
    for (size_t i = 0; i < n; i++)
        scores[i] = attn[i] + 0.0;
    return lo < hi ? sh_least_f64(scores, lo, hi) : hi;
}

size_t sh_h2o_update(sh_policy *p, size_t h, int32_t dtype, const void *attn, size_t n,
                     size_t lo, size_t hi, int simd)
{
    if (dtype == SH_DTYPE_F32)
        return SH_KERNEL(simd, h2o_accumulate_f32)(sh_row_scores(p, h), attn, n, lo, hi);
    return SH_KERNEL(simd, h2o_accumulate_f64)(sh_row_scores(p, h), attn, n, lo, hi);
}

size_t sh_tova_update(sh_policy *p, size_t h, int32_t dtype, const void *attn, size_t n,
                      size_t lo, size_t hi, int simd)
{
    if (dtype == SH_DTYPE_F32)
        return SH_KERNEL(simd, tova_assign_f32)(sh_row_scores(p, h), attn, n, lo, hi);
    return SH_KERNEL(simd, tova_assign_f64)(sh_row_scores(p, h), attn, n, lo, hi);
}
