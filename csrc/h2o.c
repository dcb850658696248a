/*
 * h2o.c - Heavy-Hitter Oracle scores (Zhang et al., NeurIPS 2023, arXiv 2306.14048).
 *
 * Each slot accumulates the attention it receives, in double: thousands of float32
 * additions would lose exactly the low bits that decide which of two old positions
 * goes. The selection itself is shared with Scissorhands (scissorhands.c) and works
 * on the scores' bit patterns, which order like the scores for finite values >= 0.
 */
#include <float.h>
#include "sh_internal.h"

/* Adds w to *score, saturating at DBL_MAX so that a score never becomes infinite. */
static inline void accumulate_one(double *score, double w)
{
    double s = *score + w;
    *score = s > DBL_MAX ? DBL_MAX : s;
}

/* scores[i] += attn[i] for i < n, widening each float32 weight exactly. */
void sh_h2o_accumulate_f32(double *scores, const float *attn, size_t n)
{
    for (size_t i = 0; i < n; i++)
        accumulate_one(&scores[i], (double)attn[i]);
}

/* scores[i] += attn[i] for i < n. */
void sh_h2o_accumulate_f64(double *scores, const double *attn, size_t n)
{
    for (size_t i = 0; i < n; i++)
        accumulate_one(&scores[i], attn[i]);
}
