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
 * The plain vote has a portable scalar form and, on x86-64, an AVX2 twin with
 * bit-identical results, chosen once per call (SH_KERNEL); sh_kind_scissorhands is
 * the kind's entry.
 */
/* sh-kind: 3 */
#include <string.h>

#include "../sh_internal.h"
#include "../sh_avx2.h"

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

/* Scissorhands' vote over n slots: votes[i] gains one (saturating at UINT32_MAX)
   when attn[i] > t (float32: t = the largest float whose double is <= 1 / n, so
   the comparison is exactly the double one) or attn[i] > share (float64). Then the
   least slot of [lo, hi) after the update (hi <= n; hi when the range is empty). The
   scalar form takes two plain passes, which the compiler vectorises for the baseline
   instruction set. */
static size_t sh_vote_f32(uint32_t *votes, const float *attn, size_t n, float t, size_t lo, size_t hi)
{
    for (size_t i = 0; i < n; i++)
        votes[i] += (uint32_t)((attn[i] > t) & (votes[i] != UINT32_MAX));
    return lo < hi ? sh_least_u32(votes, lo, hi) : hi;
}

static size_t sh_vote_f64(uint32_t *votes, const double *attn, size_t n, double share, size_t lo,
                          size_t hi)
{
    for (size_t i = 0; i < n; i++)
        votes[i] += (uint32_t)((attn[i] > share) & (votes[i] != UINT32_MAX));
    return lo < hi ? sh_least_u32(votes, lo, hi) : hi;
}

#if SH_HAVE_AVX2

/* ---------------------------------------------------------------- the AVX2 twins */

/* 8 vote counts after one step: one more where `above` is set, unless saturated. */
AVX2 static inline __m256i vote8(__m256i v, __m256i above)
{
    __m256i full = _mm256_cmpeq_epi32(v, _mm256_set1_epi32(-1));
    return _mm256_sub_epi32(v, _mm256_andnot_si256(full, above));
}

/* Where 8 float32 weights are above the threshold t. */
AVX2 static inline __m256i above8_f32(const float *a, __m256 t)
{
    return _mm256_castps_si256(_mm256_cmp_ps(_mm256_loadu_ps(a), t, _CMP_GT_OQ));
}

/* Where 8 float64 weights are above the share, as 8 32-bit lanes. */
AVX2 static inline __m256i above8_f64(const double *a, __m256d share)
{
    __m256d m0 = _mm256_cmp_pd(_mm256_loadu_pd(a), share, _CMP_GT_OQ);
    __m256d m1 = _mm256_cmp_pd(_mm256_loadu_pd(a + 4), share, _CMP_GT_OQ);
    /* Per 128-bit half: the low words of m0's two lanes, then m1's ... */
    __m256 packed = _mm256_shuffle_ps(_mm256_castpd_ps(m0), _mm256_castpd_ps(m1),
                                      _MM_SHUFFLE(2, 0, 2, 0));
    /* ... then the 64-bit pairs back in slot order: m0 0-1, m0 2-3, m1 0-1, m1 2-3. */
    return _mm256_permute4x64_epi64(_mm256_castps_si256(packed), _MM_SHUFFLE(3, 1, 2, 0));
}

/* The vote over slots [from, to) without looking for the least. */
AVX2 static void vote_span_f32(uint32_t *votes, const float *attn, size_t from, size_t to,
                               float t)
{
    const __m256 t8 = _mm256_set1_ps(t);
    size_t i = from;
    for (; i + 8 <= to; i += 8)
        store8(votes + i, vote8(load8(votes + i), above8_f32(attn + i, t8)));
    for (; i < to; i++)
        votes[i] += (uint32_t)((attn[i] > t) & (votes[i] != UINT32_MAX));
}

AVX2 static void vote_span_f64(uint32_t *votes, const double *attn, size_t from, size_t to,
                               double share)
{
    const __m256d s4 = _mm256_set1_pd(share);
    size_t i = from;
    for (; i + 8 <= to; i += 8)
        store8(votes + i, vote8(load8(votes + i), above8_f64(attn + i, s4)));
    for (; i < to; i++)
        votes[i] += (uint32_t)((attn[i] > share) & (votes[i] != UINT32_MAX));
}

AVX2 static size_t sh_avx2_vote_f32(uint32_t *votes, const float *attn, size_t n, float t, size_t lo,
                                    size_t hi)
{
    if (lo >= hi || hi - lo < 16) {
        vote_span_f32(votes, attn, 0, n, t);
        return lo < hi ? sh_least_u32(votes, lo, hi) : hi;
    }
    const __m256 t8 = _mm256_set1_ps(t);
    vote_span_f32(votes, attn, 0, lo, t);
    __m256i v = vote8(load8(votes + lo), above8_f32(attn + lo, t8));
    store8(votes + lo, v);
    least_u32x8 m;
    least_u32x8_start(&m, v, lo);
    size_t i = lo + 8;
    for (; i + 8 <= hi; i += 8) {
        v = vote8(load8(votes + i), above8_f32(attn + i, t8));
        store8(votes + i, v);
        least_u32x8_add(&m, v);
    }
    uint32_t least;
    size_t at = least_u32x8_end(&m, &least);
    for (; i < hi; i++) {
        uint32_t x = votes[i] + (uint32_t)((attn[i] > t) & (votes[i] != UINT32_MAX));
        votes[i] = x;
        if (x < least) {
            least = x;
            at = i;
        }
    }
    vote_span_f32(votes, attn, hi, n, t);
    return at;
}

AVX2 static size_t sh_avx2_vote_f64(uint32_t *votes, const double *attn, size_t n, double share,
                                    size_t lo, size_t hi)
{
    if (lo >= hi || hi - lo < 16) {
        vote_span_f64(votes, attn, 0, n, share);
        return lo < hi ? sh_least_u32(votes, lo, hi) : hi;
    }
    const __m256d s4 = _mm256_set1_pd(share);
    vote_span_f64(votes, attn, 0, lo, share);
    __m256i v = vote8(load8(votes + lo), above8_f64(attn + lo, s4));
    store8(votes + lo, v);
    least_u32x8 m;
    least_u32x8_start(&m, v, lo);
    size_t i = lo + 8;
    for (; i + 8 <= hi; i += 8) {
        v = vote8(load8(votes + i), above8_f64(attn + i, s4));
        store8(votes + i, v);
        least_u32x8_add(&m, v);
    }
    uint32_t least;
    size_t at = least_u32x8_end(&m, &least);
    for (; i < hi; i++) {
        uint32_t x = votes[i] + (uint32_t)((attn[i] > share) & (votes[i] != UINT32_MAX));
        votes[i] = x;
        if (x < least) {
            least = x;
            at = i;
        }
    }
    vote_span_f64(votes, attn, hi, n, share);
    return at;
}

#endif /* SH_HAVE_AVX2 */

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

/* The kind's update (sh_update_fn; step.c's steady step tests for it): one vote per
   weight above 1 / n, or the history window's registers; with a vote rate every
   slot's steps held first. */
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

/* uint32 votes, optionally over a history window and ranked by rate */
const sh_kind_ops sh_kind_scissorhands = {
    .values = SH_VALUES_U32,
    .takes = SH_TAKES_RECENT_WINDOW | SH_TAKES_SINKS | SH_TAKES_VOTE_OPTIONS,
    .update = sh_scissorhands_update,
    .evict = sh_evict_by_key,
};
