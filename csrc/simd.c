/*
 * simd.c - the AVX2 forms of the shared hot loops (sh_internal.h states their
 * contracts) and the process-wide switch between them and the portable scalar forms.
 * A policy's own kernels keep their AVX2 twins in its file (csrc/policies/); what the
 * twins share is in sh_avx2.h.
 *
 * The package is built for the baseline instruction set (no -march=native): each
 * AVX2 function, here and in the policy files, carries __attribute__((target("avx2"))) and runs only after
 * sh_simd_active() has seen the CPU report AVX2 (__builtin_cpu_supports, which also
 * checks that the operating system saves the YMM registers).
 *
 * Every result equals the scalar form's bit for bit: the comparisons are the same
 * IEEE comparisons on the same values (float32 weights against the same float
 * threshold), the float64 add is the same single rounding (no FMA, no
 * reassociation: each lane adds its own slot), and a search for the least key keeps,
 * per lane, the first slot holding that lane's least key, then takes the lowest slot
 * among the lanes that hold the overall least - the first slot holding it, as the
 * scalar loops find.
 */
#include <float.h>
#include <stdint.h>

#include "sh_avx2.h"

/* 1: calls may use the AVX2 kernels (when the CPU has them); 0: scalar only. */
static int simd_allowed = 1;

int sh_set_simd(int enabled)
{
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_exchange_n(&simd_allowed, enabled != 0, __ATOMIC_RELAXED);
#else
    int old = simd_allowed;
    simd_allowed = enabled != 0;
    return old;
#endif
}

/* Whether this CPU (and OS) runs AVX2 code. */
static int cpu_has_avx2(void)
{
#if SH_HAVE_AVX2
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
#else
    return 0;
#endif
}

int sh_simd_active(void)
{
#if defined(__GNUC__) || defined(__clang__)
    int allowed = __atomic_load_n(&simd_allowed, __ATOMIC_RELAXED);
#else
    int allowed = simd_allowed;
#endif
    return allowed && cpu_has_avx2();
}

int sh_simd_level(void)
{
    return sh_simd_active() ? SH_SIMD_AVX2 : SH_SIMD_SCALAR;
}

#if SH_HAVE_AVX2

/* ---------------------------------------------------------------- validation */

AVX2 int sh_avx2_valid_f32(const float *a, size_t n)
{
    const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(FLT_MAX);
    __m256 ok0 = _mm256_cmp_ps(zero, zero, _CMP_EQ_OQ), ok1 = ok0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(a + i + 8);
        ok0 = _mm256_and_ps(ok0, _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_GE_OQ),
                                               _mm256_cmp_ps(x, top, _CMP_LE_OQ)));
        ok1 = _mm256_and_ps(ok1, _mm256_and_ps(_mm256_cmp_ps(y, zero, _CMP_GE_OQ),
                                               _mm256_cmp_ps(y, top, _CMP_LE_OQ)));
    }
    int ok = _mm256_movemask_ps(_mm256_and_ps(ok0, ok1)) == 0xff;
    for (; i < n; i++)
        ok &= (a[i] >= 0.0f) & (a[i] <= FLT_MAX);
    return ok;
}

AVX2 int sh_avx2_valid_f64(const double *a, size_t n)
{
    const __m256d zero = _mm256_setzero_pd(), top = _mm256_set1_pd(DBL_MAX);
    __m256d ok0 = _mm256_cmp_pd(zero, zero, _CMP_EQ_OQ), ok1 = ok0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d x = _mm256_loadu_pd(a + i), y = _mm256_loadu_pd(a + i + 4);
        ok0 = _mm256_and_pd(ok0, _mm256_and_pd(_mm256_cmp_pd(x, zero, _CMP_GE_OQ),
                                               _mm256_cmp_pd(x, top, _CMP_LE_OQ)));
        ok1 = _mm256_and_pd(ok1, _mm256_and_pd(_mm256_cmp_pd(y, zero, _CMP_GE_OQ),
                                               _mm256_cmp_pd(y, top, _CMP_LE_OQ)));
    }
    int ok = _mm256_movemask_pd(_mm256_and_pd(ok0, ok1)) == 0xf;
    for (; i < n; i++)
        ok &= (a[i] >= 0.0) & (a[i] <= DBL_MAX);
    return ok;
}

/* ---------------------------------------------------------------- least key, largest, histogram: uint32 */

AVX2 size_t sh_avx2_least_u32(const uint32_t *v, size_t lo, size_t hi)
{
    if (hi - lo < 16)
        return sh_least_u32(v, lo, hi);
    least_u32x8 m;
    least_u32x8_start(&m, load8(v + lo), lo);
    size_t i = lo + 8;
    for (; i + 8 <= hi; i += 8)
        least_u32x8_add(&m, load8(v + i));
    uint32_t least;
    size_t at = least_u32x8_end(&m, &least);
    for (; i < hi; i++) {
        if (v[i] < least) {
            least = v[i];
            at = i;
        }
    }
    return at;
}

AVX2 uint32_t sh_avx2_max_u32(const uint32_t *v, size_t lo, size_t hi)
{
    __m256i most = _mm256_setzero_si256();
    size_t i = lo;
    for (; i + 8 <= hi; i += 8)
        most = _mm256_max_epu32(most, load8(v + i));
    uint32_t best = max_lane(most, 0);
    for (; i < hi; i++)
        best = v[i] > best ? v[i] : best;
    return best;
}

AVX2 void sh_avx2_hist_u32(const uint32_t *v, size_t lo, size_t hi, uint32_t mask,
                           uint32_t prefix, unsigned shift, size_t hist[256])
{
    if (mask == 0) { /* every slot is a candidate: a plain count */
        sh_hist_u32(v, lo, hi, mask, prefix, shift, hist);
        return;
    }
    const __m256i mk = _mm256_set1_epi32((int32_t)mask), pf = _mm256_set1_epi32((int32_t)prefix);
    size_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        __m256i match = _mm256_cmpeq_epi32(_mm256_and_si256(load8(v + i), mk), pf);
        for (unsigned bits = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(match)); bits != 0;
             bits &= bits - 1)
            hist[(v[i + (unsigned)__builtin_ctz(bits)] >> shift) & 0xff]++;
    }
    sh_hist_u32(v, i, hi, mask, prefix, shift, hist);
}

/* ---------------------------------------------------------------- least key, largest, histogram: float64 */

AVX2 size_t sh_avx2_least_f64(const double *s, size_t lo, size_t hi)
{
    if (hi - lo < 8)
        return sh_least_f64(s, lo, hi);
    least_f64x4 m;
    least_f64x4_start(&m, _mm256_loadu_pd(s + lo), lo);
    size_t i = lo + 4;
    for (; i + 4 <= hi; i += 4)
        least_f64x4_add(&m, _mm256_loadu_pd(s + i));
    double least;
    size_t at = least_f64x4_end(&m, &least);
    for (; i < hi; i++) {
        if (s[i] < least) {
            least = s[i];
            at = i;
        }
    }
    return at;
}

/* The scores' bits as 4 unsigned 64-bit lanes, biased so that a signed comparison
   orders them as unsigned. */
AVX2 static inline __m256i biased_bits(const double *s, __m256i bias)
{
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)s), bias);
}

AVX2 uint64_t sh_avx2_max_f64_bits(const double *s, size_t lo, size_t hi)
{
    const __m256i bias = _mm256_set1_epi64x(INT64_MIN);
    __m256i most = bias; /* 0, biased */
    size_t i = lo;
    for (; i + 4 <= hi; i += 4) {
        __m256i x = biased_bits(s + i, bias);
        most = _mm256_blendv_epi8(most, x, _mm256_cmpgt_epi64(x, most));
    }
    uint64_t l[4];
    _mm256_storeu_si256((__m256i *)l, _mm256_xor_si256(most, bias));
    uint64_t best = 0;
    for (int j = 0; j < 4; j++)
        best = l[j] > best ? l[j] : best;
    for (; i < hi; i++) {
        uint64_t b = sh_h2o_key(s, i);
        best = b > best ? b : best;
    }
    return best;
}

AVX2 void sh_avx2_hist_f64_bits(const double *s, size_t lo, size_t hi, uint64_t mask,
                                uint64_t prefix, unsigned shift, size_t hist[256])
{
    if (mask == 0) {
        sh_hist_f64_bits(s, lo, hi, mask, prefix, shift, hist);
        return;
    }
    const __m256i mk = _mm256_set1_epi64x((long long)mask);
    const __m256i pf = _mm256_set1_epi64x((long long)prefix);
    size_t i = lo;
    for (; i + 4 <= hi; i += 4) {
        __m256i bits4 = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i match = _mm256_cmpeq_epi64(_mm256_and_si256(bits4, mk), pf);
        for (unsigned bits = (unsigned)_mm256_movemask_pd(_mm256_castsi256_pd(match)); bits != 0;
             bits &= bits - 1)
            hist[(sh_h2o_key(s, i + (unsigned)__builtin_ctz(bits)) >> shift) & 0xff]++;
    }
    sh_hist_f64_bits(s, i, hi, mask, prefix, shift, hist);
}

/* ---------------------------------------------------------------- bulk take */

/* For a 4-bit mask of lanes to keep, their lane numbers in order (then zeros). */
static const uint8_t KEEP4[16][4] = {
    {0, 0, 0, 0}, {0, 0, 0, 0}, {1, 0, 0, 0}, {0, 1, 0, 0},
    {2, 0, 0, 0}, {0, 2, 0, 0}, {1, 2, 0, 0}, {0, 1, 2, 0},
    {3, 0, 0, 0}, {0, 3, 0, 0}, {1, 3, 0, 0}, {0, 1, 3, 0},
    {2, 3, 0, 0}, {0, 2, 3, 0}, {1, 2, 3, 0}, {0, 1, 2, 3},
};

/* The permutation that packs the kept 32-bit lanes of 4 to the front. */
AVX2 static inline __m128i keep_lanes(unsigned keep)
{
    int32_t packed;
    memcpy(&packed, KEEP4[keep], sizeof packed);
    return _mm_cvtepu8_epi32(_mm_cvtsi32_si128(packed));
}

/* The same for 4 64-bit lanes, as a permutation of their 8 32-bit halves. */
AVX2 static inline __m256i keep_lanes64(unsigned keep)
{
    __m128i lanes = _mm_slli_epi32(keep_lanes(keep), 1);
    __m128i next = _mm_add_epi32(lanes, _mm_set1_epi32(1));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi32(lanes, next)),
                                   _mm_unpackhi_epi32(lanes, next), 1);
}

AVX2 static inline __m128i pack4(__m128i x, __m128i lanes)
{
    return _mm_castps_si128(_mm_permutevar_ps(_mm_castsi128_ps(x), lanes));
}

/* Which of 4 lanes (bits) are taken: every one below the prefix, then ties at it
   while *need lasts. */
static inline unsigned taken4(unsigned below, unsigned at, size_t *need)
{
    if (at == 0 || *need == 0)
        return below;
    unsigned ties = sh_lowest_bits(at, *need);
    *need -= (size_t)__builtin_popcount(ties);
    return below | ties;
}

/* Writes the positions of the taken lanes of the 4 slots from i to victims + *j. */
static inline void emit4(const uint32_t *pos, size_t i, unsigned taken, uint32_t *victims,
                         int64_t *slots, size_t *j)
{
    for (unsigned bits = taken; bits != 0; bits &= bits - 1) {
        size_t slot = i + (unsigned)__builtin_ctz(bits);
        victims[*j] = pos[slot];
        if (slots != NULL)
            slots[*j] = (int64_t)slot;
        (*j)++;
    }
}

AVX2 size_t sh_avx2_take_u32(uint32_t *pos, uint32_t *v, size_t n, size_t lo, size_t hi,
                             uint32_t mask, uint32_t prefix, size_t need, uint32_t *victims,
                             int64_t *slots)
{
    const __m128i bias = _mm_set1_epi32(INT32_MIN);
    const __m128i mk = _mm_set1_epi32((int32_t)mask), pf = _mm_set1_epi32((int32_t)prefix);
    const __m128i pf_biased = _mm_xor_si128(pf, bias);
    size_t w = lo, j = 0, i = lo;
    for (; i + 4 <= hi; i += 4) {
        __m128i x = _mm_loadu_si128((const __m128i *)(v + i));
        __m128i p4 = _mm_loadu_si128((const __m128i *)(pos + i));
        __m128i m = _mm_and_si128(x, mk);
        unsigned below = (unsigned)_mm_movemask_ps(
            _mm_castsi128_ps(_mm_cmpgt_epi32(pf_biased, _mm_xor_si128(m, bias))));
        unsigned at = (unsigned)_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(m, pf)));
        unsigned taken = taken4(below, at, &need);
        unsigned keep = ~taken & 0xfu;
        if (taken != 0) {
            emit4(pos, i, taken, victims, slots, &j);
            __m128i lanes = keep_lanes(keep);
            p4 = pack4(p4, lanes);
            x = pack4(x, lanes);
        }
        /* Slots [w, w + 4) lie below i + 4: nothing not yet read is overwritten. */
        _mm_storeu_si128((__m128i *)(pos + w), p4);
        _mm_storeu_si128((__m128i *)(v + w), x);
        w += (size_t)__builtin_popcount(keep);
    }
    return sh_take_u32_from(pos, v, n, w, i, hi, mask, prefix, need, victims, slots, j);
}

AVX2 size_t sh_avx2_take_f64(uint32_t *pos, double *s, size_t n, size_t lo, size_t hi,
                             uint64_t mask, uint64_t prefix, size_t need, uint32_t *victims,
                             int64_t *slots)
{
    const __m256i bias = _mm256_set1_epi64x(INT64_MIN);
    const __m256i mk = _mm256_set1_epi64x((long long)mask);
    const __m256i pf = _mm256_set1_epi64x((long long)prefix);
    const __m256i pf_biased = _mm256_xor_si256(pf, bias);
    size_t w = lo, j = 0, i = lo;
    for (; i + 4 <= hi; i += 4) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(s + i));
        __m128i p4 = _mm_loadu_si128((const __m128i *)(pos + i));
        __m256i m = _mm256_and_si256(x, mk);
        unsigned below = (unsigned)_mm256_movemask_pd(
            _mm256_castsi256_pd(_mm256_cmpgt_epi64(pf_biased, _mm256_xor_si256(m, bias))));
        unsigned at = (unsigned)_mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(m, pf)));
        unsigned taken = taken4(below, at, &need);
        unsigned keep = ~taken & 0xfu;
        if (taken != 0) {
            emit4(pos, i, taken, victims, slots, &j);
            p4 = pack4(p4, keep_lanes(keep));
            x = _mm256_castps_si256(
                _mm256_permutevar8x32_ps(_mm256_castsi256_ps(x), keep_lanes64(keep)));
        }
        _mm_storeu_si128((__m128i *)(pos + w), p4);
        _mm256_storeu_si256((__m256i *)(s + w), x);
        w += (size_t)__builtin_popcount(keep);
    }
    return sh_take_f64_from(pos, s, n, w, i, hi, mask, prefix, need, victims, slots, j);
}

/* ---------------------------------------------------------------- the GQA gather's row */

/* mean[c] for c in the whole blocks of 8 of [0, extent): the sum in head order of all
   but the last of the group's heads (nothing when group == 1). Each head is read as
   one sequential stream: from memory, one stream of weights at a time arrives faster
   than the group's side by side (docs/bench.md, the heads read one after another). */
AVX2 static inline __attribute__((always_inline)) void head_sum(const float *first, size_t group, size_t extent,
                                                                float *mean)
{
    const size_t blocks = extent & ~(size_t)7;
    if (group < 2)
        return;
    for (size_t k = 0; k < blocks; k += 8)
        _mm256_storeu_ps(mean + k, _mm256_loadu_ps(first + k));
    for (size_t g = 1; g + 1 < group; g++) {
        const float *w = first + g * extent;
        for (size_t k = 0; k < blocks; k += 8)
            _mm256_storeu_ps(mean + k, _mm256_add_ps(_mm256_loadu_ps(mean + k), _mm256_loadu_ps(w + k)));
    }
}

/* sh_avx2_gqa_row's work. With votes (else NULL), also *most: the largest of
   votes[0, width), read in the pass over the weights; with ahead (else NULL), one
   cache line of [ahead, ahead + 4 * width) and of the columns asked of memory every
   16 weights of that pass, so that the row's state the step reads next arrives beside
   the weights rather than after them. */
AVX2 static inline __attribute__((always_inline)) int gqa_row_body(const float *first, size_t group, size_t extent,
                                                                   const int32_t *col, size_t width, float *mean,
                                                                   float *dst, const uint32_t *votes, uint32_t *most,
                                                                   const void *ahead)
{
    /* Per weight the scalar form's operations in its order: the heads added one after
       another in float32, then one IEEE division by the group's size. All heads but
       the last are summed into mean first (head_sum), then the last is added with the
       division, the checks and the votes. */
    const float divisor = (float)group;
    head_sum(first, group, extent, mean);
    const float *last = first + (group - 1) * extent;
    const __m256 by = _mm256_set1_ps(divisor);
    const __m256 zero = _mm256_setzero_ps(), most_f = _mm256_set1_ps(FLT_MAX);
    __m256 ok = _mm256_cmp_ps(zero, zero, _CMP_EQ_OQ); /* every mean so far finite and >= 0 */
    __m256i top = _mm256_setzero_si256();
    const size_t voted = votes != NULL ? width : 0, lines = ahead != NULL ? width : 0;
    size_t c = 0;
    for (; c + 8 <= extent; c += 8) {
        if ((c & 15) == 0 && c < lines) {
            _mm_prefetch((const char *)ahead + 4 * c, _MM_HINT_T0);
            _mm_prefetch((const char *)(col + c), _MM_HINT_T0);
        }
        __m256 s = _mm256_loadu_ps(last + c);
        if (group > 1)
            s = _mm256_add_ps(_mm256_loadu_ps(mean + c), s);
        s = _mm256_div_ps(s, by);
        _mm256_storeu_ps(mean + c, s);
        ok = _mm256_and_ps(ok, _mm256_and_ps(_mm256_cmp_ps(s, zero, _CMP_GE_OQ),
                                             _mm256_cmp_ps(s, most_f, _CMP_LE_OQ)));
        if (c + 8 <= voted)
            top = _mm256_max_epu32(top, load8(votes + c));
    }
    if (votes != NULL) { /* the blocks read above, then the rest of the votes */
        size_t read = c < (voted & ~(size_t)7) ? c : (voted & ~(size_t)7);
        *most = max_lane(top, sh_avx2_max_u32(votes, read, voted));
    }
    int whole = _mm256_movemask_ps(ok) == 0xff;
    for (; c < extent; c++) {
        float s = first[c];
        for (size_t g = 1; g < group; g++)
            s += first[g * extent + c];
        s /= divisor;
        mean[c] = s;
        whole &= (s >= 0.0f) & (s <= FLT_MAX);
    }
    /* A column outside [0, extent) (negative: a large unsigned) reads mean[extent]. */
    const __m256i end = _mm256_set1_epi32((int32_t)extent);
    size_t j = 0;
    for (; j + 8 <= width; j += 8) {
        __m256i at = _mm256_min_epu32(_mm256_loadu_si256((const __m256i *)(const void *)(col + j)), end);
        _mm256_storeu_ps(dst + j, _mm256_i32gather_ps(mean, at, 4));
    }
    for (; j < width; j++) {
        uint32_t at = (uint32_t)col[j];
        dst[j] = mean[at < extent ? at : extent];
    }
    return whole;
}

AVX2 int sh_avx2_gqa_row(const float *first, size_t group, size_t extent, const int32_t *col, size_t width,
                         float *mean, float *dst)
{
    return gqa_row_body(first, group, extent, col, width, mean, dst, NULL, NULL, NULL);
}

AVX2 int sh_avx2_gqa_row_votes(const float *first, size_t group, size_t extent, const int32_t *col, size_t width,
                               float *mean, float *dst, const uint32_t *votes, uint32_t *most, const void *ahead)
{
    return gqa_row_body(first, group, extent, col, width, mean, dst, votes, most, ahead);
}

#endif /* SH_HAVE_AVX2 */

