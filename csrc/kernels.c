/*
 * kernels.c - the portable scalar forms of the kernels every policy file and simd.c
 * share (sh_internal.h states their contracts): weight validation, and the least,
 * the largest, the radix histogram and the take-and-compact pass over a row's keys,
 * uint32 votes or the bits of float64 scores. simd.c's AVX2 forms fall back to these
 * for the slots after their last full vector; this file calls nothing of ours.
 */
#include <float.h>
#include <string.h>

#include "sh_internal.h"

/* ---------------------------------------------------------------- validation */

/* 1 when every weight is finite and >= 0 (NaN fails both comparisons). */
int sh_valid_f32(const float *a, size_t n)
{
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= (a[i] >= 0.0f) & (a[i] <= FLT_MAX);
    return ok;
}

int sh_valid_f64(const double *a, size_t n)
{
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= (a[i] >= 0.0) & (a[i] <= DBL_MAX);
    return ok;
}

/* ---------------------------------------------------------------- uint32 keys (votes) */

/* The first slot of [lo, hi) holding the fewest votes (hi > lo): the least, then
   where it first occurs. */
size_t sh_least_u32(const uint32_t *v, size_t lo, size_t hi)
{
    uint32_t least = UINT32_MAX;
    size_t i;
    for (i = lo; i < hi; i++)
        least = v[i] < least ? v[i] : least;
    for (i = lo; v[i] != least; i++)
        ;
    return i;
}

/* The most votes in [lo, hi) (hi > lo). */
uint32_t sh_max_u32(const uint32_t *v, size_t lo, size_t hi)
{
    uint32_t most = 0;
    for (size_t i = lo; i < hi; i++)
        most = v[i] > most ? v[i] : most;
    return most;
}

/* One pass of the radix select: counts, by the byte at `shift`, the votes of
   [lo, hi) that agree with prefix on the bytes already chosen (mask). */
void sh_hist_u32(const uint32_t *v, size_t lo, size_t hi, uint32_t mask, uint32_t prefix,
                 unsigned shift, size_t hist[256])
{
    for (size_t i = lo; i < hi; i++) {
        if ((v[i] & mask) == prefix)
            hist[(v[i] >> shift) & 0xff]++;
    }
}

/* The bulk selection's last pass: takes every slot of [lo, hi) whose masked votes
   are below prefix and the `need` lowest slots whose masked votes equal it, and
   closes the gaps they leave in one pass (the slots after hi move down by the count
   taken). */
size_t sh_take_u32(uint32_t *pos, uint32_t *v, size_t n, size_t lo, size_t hi, uint32_t mask,
                   uint32_t prefix, size_t need, uint32_t *victims, int64_t *slots)
{
    return sh_take_u32_from(pos, v, n, lo, lo, hi, mask, prefix, need, victims, slots, 0);
}

size_t sh_take_u32_from(uint32_t *pos, uint32_t *v, size_t n, size_t w, size_t i, size_t hi,
                        uint32_t mask, uint32_t prefix, size_t need, uint32_t *victims,
                        int64_t *slots, size_t j)
{
    for (; i < hi; i++) {
        uint32_t m = v[i] & mask;
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
        v[w] = v[i];
        w++;
    }
    memmove(pos + w, pos + hi, (n - hi) * sizeof *pos);
    memmove(v + w, v + hi, (n - hi) * sizeof *v);
    return j;
}

/* ---------------------------------------------------------------- float64 keys (scores) */

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
