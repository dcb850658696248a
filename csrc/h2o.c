/*
 * h2o.c - Heavy-Hitter Oracle scores (Zhang et al., NeurIPS 2023, arXiv 2306.14048)
 * and TOVA's (Oren et al., 2024, arXiv 2401.06104).
 *
 * H2O: each slot accumulates the attention it receives, in double: thousands of
 * float32 additions would lose exactly the low bits that decide which of two old
 * positions goes. TOVA: each slot holds the weight of the latest decode step, widened
 * exactly to double (assigned, not added). The selection itself is shared with
 * Scissorhands (scissorhands.c) and works on the scores' bit patterns, which order like
 * the scores for finite values >= 0 (so -0.0 is stored as 0.0). These are the portable
 * scalar forms; simd.c holds the AVX2 ones.
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

/* The first slot of [lo, hi) holding the least score (hi > lo): the least, then where
   it first occurs. */
size_t sh_least_f64(const double *s, size_t lo, size_t hi)
{
    double least = DBL_MAX;
    size_t i;
    for (i = lo; i < hi; i++)
        least = s[i] < least ? s[i] : least;
    for (i = lo; s[i] != least; i++)
        ;
    return i;
}

/* The largest score's bits in [lo, hi) (hi > lo; finite scores >= 0 order as their
   bits do). */
uint64_t sh_max_f64_bits(const double *s, size_t lo, size_t hi)
{
    uint64_t most = 0;
    for (size_t i = lo; i < hi; i++) {
        uint64_t b = sh_h2o_key(s, i);
        most = b > most ? b : most;
    }
    return most;
}

/* One radix pass over the scores' bits (see sh_hist_u32). */
void sh_hist_f64_bits(const double *s, size_t lo, size_t hi, uint64_t mask, uint64_t prefix,
                      unsigned shift, size_t hist[256])
{
    for (size_t i = lo; i < hi; i++) {
        uint64_t b = sh_h2o_key(s, i);
        if ((b & mask) == prefix)
            hist[(b >> shift) & 0xff]++;
    }
}

/* The bulk selection's last pass over H2O scores (see sh_take_u32). */
size_t sh_take_f64(uint32_t *pos, double *s, size_t n, size_t lo, size_t hi, uint64_t mask,
                   uint64_t prefix, size_t need, uint32_t *victims, int64_t *slots)
{
    return sh_take_f64_from(pos, s, n, lo, lo, hi, mask, prefix, need, victims, slots, 0);
}

size_t sh_take_f64_from(uint32_t *pos, double *s, size_t n, size_t w, size_t i, size_t hi,
                        uint64_t mask, uint64_t prefix, size_t need, uint32_t *victims,
                        int64_t *slots, size_t j)
{
    for (; i < hi; i++) {
        uint64_t m = sh_h2o_key(s, i) & mask;
        int victim = m < prefix || (m == prefix && need > 0);
        if (victim) {
            need -= (size_t)(m == prefix);
            victims[j] = pos[i];
            if (slots != NULL)
                slots[j] = (int64_t)i;
            j++;
            continue;
        }
        pos[w] = pos[i];
        s[w] = s[i];
        w++;
    }
    memmove(pos + w, pos + hi, (n - hi) * sizeof *pos);
    memmove(s + w, s + hi, (n - hi) * sizeof *s);
    return j;
}
