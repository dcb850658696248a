/*
 * scissorhands.c - Scissorhands' votes (Liu et al., NeurIPS 2023, arXiv 2305.17118).
 *
 * Each decode step, every held position whose attention weight strictly exceeds its
 * fair share 1 / count earns one vote (uint32, saturating); over budget the
 * least-voted positions outside the sinks and the recent window leave (select.c),
 * equal votes evicting the lower position.
 *
 * With a history window of w steps (1..64) each slot also keeps a 64-bit register of
 * its vote bits: every decode step that carries attention shifts each held slot's
 * register left by one, adds the new bit and masks to w bits, and the slot's vote
 * count becomes the register's popcount, so the selection is unchanged.
 *
 * With a vote rate each slot also counts the decode steps that carried attention
 * since it was admitted (uint32, saturating), and the selection ranks it by votes /
 * steps held (steps capped at the history window, and at least 1) as a double
 * (sh_key_at): an old position's head start in votes stops protecting it.
 *
 * The plain vote kernels here are the portable scalar forms; simd.c holds the AVX2
 * ones.
 */
#include <string.h>

#include "sh_internal.h"

/* The largest float t with (double)t <= share, so that for any float a,
   (double)a > share exactly when a > t: the float32 comparison then needs no
   widening. share > 0. */
static float float_threshold(double share)
{
    float t = (float)share;
    if ((double)t > share) {
        uint32_t bits;
        memcpy(&bits, &t, sizeof bits);
        bits -= 1; /* t > share > 0: the next float towards zero */
        memcpy(&t, &bits, sizeof t);
    }
    return t;
}

/* One vote for every weight strictly above 1 / n, compared as if in double on the
   value as given; votes saturate at UINT32_MAX. Then the least slot of [lo, hi)
   (hi when the range is empty). The scalar form takes two plain passes, which the
   compiler vectorises for the baseline instruction set. */
size_t sh_vote_f32(uint32_t *votes, const float *attn, size_t n, float t, size_t lo, size_t hi)
{
    for (size_t i = 0; i < n; i++)
        votes[i] += (uint32_t)((attn[i] > t) & (votes[i] != UINT32_MAX));
    return lo < hi ? sh_least_u32(votes, lo, hi) : hi;
}

size_t sh_vote_f64(uint32_t *votes, const double *attn, size_t n, double share, size_t lo,
                   size_t hi)
{
    for (size_t i = 0; i < n; i++)
        votes[i] += (uint32_t)((attn[i] > share) & (votes[i] != UINT32_MAX));
    return lo < hi ? sh_least_u32(votes, lo, hi) : hi;
}

/* The register bits a history window of w steps keeps (w in 1..64). */
static uint64_t history_mask(uint32_t w)
{
    return w >= 64 ? UINT64_MAX : ((uint64_t)1 << w) - 1;
}

/* Bits set in x. */
static inline uint32_t popcount64(uint64_t x)
{
#if defined(__GNUC__) || defined(__clang__)
    return (uint32_t)__builtin_popcountll(x);
#else
    x = x - ((x >> 1) & 0x5555555555555555u);
    x = (x & 0x3333333333333333u) + ((x >> 2) & 0x3333333333333333u);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fu;
    return (uint32_t)((x * 0x0101010101010101u) >> 56);
#endif
}

/* With a history window: each register shifts in its vote bit (weight strictly
   above 1 / n, compared as sh_vote_f32 and sh_vote_f64 do), keeps the last w bits,
   and the vote count becomes its popcount. */
static void vote_history_f32(uint32_t *votes, uint64_t *history, uint64_t mask,
                             const float *attn, size_t n)
{
    float t = float_threshold(1.0 / (double)n);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = ((history[i] << 1) | (uint64_t)(attn[i] > t)) & mask;
        history[i] = r;
        votes[i] = popcount64(r);
    }
}

static void vote_history_f64(uint32_t *votes, uint64_t *history, uint64_t mask,
                             const double *attn, size_t n)
{
    double share = 1.0 / (double)n;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = ((history[i] << 1) | (uint64_t)(attn[i] > share)) & mask;
        history[i] = r;
        votes[i] = popcount64(r);
    }
}

/* One more step held for each of n slots, saturating at UINT32_MAX. */
static void count_step(uint32_t *held, size_t n)
{
    for (size_t i = 0; i < n; i++)
        held[i] += (uint32_t)(held[i] != UINT32_MAX);
}

size_t sh_scissorhands_update(sh_policy *p, size_t h, int32_t dtype, const void *attn,
                              size_t n, size_t lo, size_t hi, int simd)
{
    if (p->vote_rate)
        count_step(sh_row_held(p, h), n);
    if (sh_has_history(p)) {
        uint64_t mask = history_mask(p->history_window);
        if (dtype == SH_DTYPE_F32)
            vote_history_f32(sh_row_votes(p, h), sh_row_history(p, h), mask, attn, n);
        else
            vote_history_f64(sh_row_votes(p, h), sh_row_history(p, h), mask, attn, n);
        return hi;
    }
    double share = 1.0 / (double)n;
    if (dtype == SH_DTYPE_F32)
        return SH_KERNEL(simd, vote_f32)(sh_row_votes(p, h), attn, n, float_threshold(share),
                                         lo, hi);
    return SH_KERNEL(simd, vote_f64)(sh_row_votes(p, h), attn, n, share, lo, hi);
}

void sh_scissorhands_unvote(uint32_t *votes, const float *w, size_t n)
{
    float t = float_threshold(1.0 / (double)n);
    for (size_t i = 0; i < n; i++)
        votes[i] -= (uint32_t)(w[i] > t);
}
