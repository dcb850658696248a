/*
 * sh_internal.h - the policy object's layout and what the C files share:
 * scissorhands.c (the object, admission, the step, selection, Scissorhands' votes),
 * h2o.c (H2O's cumulative scores, TOVA's latest weights), streaming_llm.c (sinks +
 * recency), simd.c (the AVX2 forms of the hot loops and the switch between them and
 * the scalar forms) and parallel.c (a step's rows on several threads). Not part of
 * the public API or the cdef.
 */
#ifndef SH_INTERNAL_H
#define SH_INTERNAL_H

#include <string.h>

#include "scissorhands.h"

/* Row h of an array with `capacity` slots per row starts at h * capacity. kind,
   vote_rate, history_window and threads are narrow so that the whole header stays
   within SH_HEADER_BYTES. The values allocation holds, in order: the heads * capacity
   votes or scores, with vote_rate the heads * capacity steps-held counters (same
   row layout), then heads * capacity bytes of selection scratch. Row h holds
   counts[h] positions; with one row, counts points at `count` inside the header. */
struct sh_policy {
    int8_t kind;
    uint8_t vote_rate;      /* Scissorhands: evict by votes per step held */
    uint8_t history_window; /* Scissorhands: steps a vote counts for, 1..64; 0 = forever */
    uint8_t threads;        /* threads a step may use for its rows, 1..SH_MAX_THREADS */
    uint32_t heads;
    uint32_t budget;
    uint32_t recent_window;
    uint32_t sinks;
    uint32_t last_position; /* the largest position ever admitted */
    uint32_t capacity;      /* slots allocated per row */
    uint32_t count;         /* the count of the only row when heads == 1 */
    uint32_t *counts;       /* positions held per row: &count, or heads entries */
    uint32_t *positions;    /* heads * capacity, ascending within each row */
    void *values;           /* uint32 votes (Scissorhands; then uint32 steps held with
                               vote_rate), double scores (H2O, TOVA), then the scratch bytes;
                               or NULL */
    uint64_t *history;      /* vote bits of the last history_window steps per slot, or NULL */
};

/* ---------------------------------------------------------------- kernels
   Each hot loop has a portable scalar form (sh_*) and, where SH_HAVE_AVX2, an AVX2
   form (sh_avx2_*) with the same contract and bit-identical results; the caller
   picks one per call with sh_simd_active(). "The least slot of [lo, hi)" is the
   first slot holding the least key (ties go to the lower slot); hi when the range is
   empty. */

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define SH_HAVE_AVX2 1
#else
#define SH_HAVE_AVX2 0
#endif

/* Whether a call starting now uses the AVX2 kernels (the CPU has AVX2 and
   sh_set_simd has not turned them off). */
int sh_simd_active(void);

/* 1 when each of the n weights is finite and >= 0 (NaN fails). */
int sh_valid_f32(const float *a, size_t n);
int sh_valid_f64(const double *a, size_t n);

/* Scissorhands' vote over n slots: votes[i] gains one (saturating at UINT32_MAX)
   when attn[i] > t (float32: t = the largest float whose double is <= 1 / n, so
   the comparison is exactly the double one) or attn[i] > share (float64). Returns
   the least slot of [lo, hi) after the update (hi <= n). */
size_t sh_vote_f32(uint32_t *votes, const float *attn, size_t n, float t, size_t lo, size_t hi);
size_t sh_vote_f64(uint32_t *votes, const double *attn, size_t n, double share, size_t lo,
                   size_t hi);

/* H2O's add over n slots: scores[i] += attn[i] in double, saturating at DBL_MAX.
   Returns the least slot of [lo, hi) after the update (hi <= n). */
size_t sh_h2o_accumulate_f32(double *scores, const float *attn, size_t n, size_t lo, size_t hi);
size_t sh_h2o_accumulate_f64(double *scores, const double *attn, size_t n, size_t lo, size_t hi);

/* TOVA's assignment over n slots: scores[i] = attn[i] widened to double, -0.0 stored
   as 0.0. Returns the least slot of [lo, hi) after the update (hi <= n). */
size_t sh_tova_assign_f32(double *scores, const float *attn, size_t n, size_t lo, size_t hi);
size_t sh_tova_assign_f64(double *scores, const double *attn, size_t n, size_t lo, size_t hi);

/* The least slot of [lo, hi) (hi > lo): of uint32 votes, or of H2O/TOVA scores (finite,
   >= 0). */
size_t sh_least_u32(const uint32_t *v, size_t lo, size_t hi);
size_t sh_least_f64(const double *s, size_t lo, size_t hi);

/* The largest key of [lo, hi) (hi > lo): votes, or the bits of H2O scores. */
uint32_t sh_max_u32(const uint32_t *v, size_t lo, size_t hi);
uint64_t sh_max_f64_bits(const double *s, size_t lo, size_t hi);

/* Adds to hist[(key >> shift) & 0xff] one for each key of [lo, hi) with
   (key & mask) == prefix: one pass of the bulk selection's radix select. */
void sh_hist_u32(const uint32_t *v, size_t lo, size_t hi, uint32_t mask, uint32_t prefix,
                 unsigned shift, size_t hist[256]);
void sh_hist_f64_bits(const double *s, size_t lo, size_t hi, uint64_t mask, uint64_t prefix,
                      unsigned shift, size_t hist[256]);

/* The bulk selection's last pass over a row of n slots (positions and one per-slot
   value array, nothing else per slot): the victims among [lo, hi) are every slot
   whose key & mask is below prefix, then the `need` lowest slots whose key & mask
   equals it. Writes them ascending to victims (and their slots to slots when not
   NULL), removes them from pos and the values keeping the order of the rest, and
   returns how many it took. */
size_t sh_take_u32(uint32_t *pos, uint32_t *v, size_t n, size_t lo, size_t hi, uint32_t mask,
                   uint32_t prefix, size_t need, uint32_t *victims, int64_t *slots);
size_t sh_take_f64(uint32_t *pos, double *s, size_t n, size_t lo, size_t hi, uint64_t mask,
                   uint64_t prefix, size_t need, uint32_t *victims, int64_t *slots);
/* The same from slot i on, with the slots kept so far written below w and j victims
   already taken: what remains after a vector loop. */
size_t sh_take_u32_from(uint32_t *pos, uint32_t *v, size_t n, size_t w, size_t i, size_t hi,
                        uint32_t mask, uint32_t prefix, size_t need, uint32_t *victims,
                        int64_t *slots, size_t j);
size_t sh_take_f64_from(uint32_t *pos, double *s, size_t n, size_t w, size_t i, size_t hi,
                        uint64_t mask, uint64_t prefix, size_t need, uint32_t *victims,
                        int64_t *slots, size_t j);

#if SH_HAVE_AVX2
int sh_avx2_valid_f32(const float *a, size_t n);
int sh_avx2_valid_f64(const double *a, size_t n);
size_t sh_avx2_vote_f32(uint32_t *votes, const float *attn, size_t n, float t, size_t lo,
                        size_t hi);
size_t sh_avx2_vote_f64(uint32_t *votes, const double *attn, size_t n, double share, size_t lo,
                        size_t hi);
size_t sh_avx2_h2o_accumulate_f32(double *scores, const float *attn, size_t n, size_t lo,
                                  size_t hi);
size_t sh_avx2_h2o_accumulate_f64(double *scores, const double *attn, size_t n, size_t lo,
                                  size_t hi);
size_t sh_avx2_tova_assign_f32(double *scores, const float *attn, size_t n, size_t lo,
                               size_t hi);
size_t sh_avx2_tova_assign_f64(double *scores, const double *attn, size_t n, size_t lo,
                               size_t hi);
size_t sh_avx2_least_u32(const uint32_t *v, size_t lo, size_t hi);
size_t sh_avx2_least_f64(const double *s, size_t lo, size_t hi);
uint32_t sh_avx2_max_u32(const uint32_t *v, size_t lo, size_t hi);
uint64_t sh_avx2_max_f64_bits(const double *s, size_t lo, size_t hi);
void sh_avx2_hist_u32(const uint32_t *v, size_t lo, size_t hi, uint32_t mask, uint32_t prefix,
                      unsigned shift, size_t hist[256]);
void sh_avx2_hist_f64_bits(const double *s, size_t lo, size_t hi, uint64_t mask,
                           uint64_t prefix, unsigned shift, size_t hist[256]);
size_t sh_avx2_take_u32(uint32_t *pos, uint32_t *v, size_t n, size_t lo, size_t hi,
                        uint32_t mask, uint32_t prefix, size_t need, uint32_t *victims,
                        int64_t *slots);
size_t sh_avx2_take_f64(uint32_t *pos, double *s, size_t n, size_t lo, size_t hi, uint64_t mask,
                        uint64_t prefix, size_t need, uint32_t *victims, int64_t *slots);
#endif

/* The bit pattern of a finite score >= 0, which orders exactly as the scores do
   (memcpy: no aliasing). Inline: the selection calls it once per slot. */
static inline uint64_t sh_h2o_key(const double *scores, size_t i)
{
    uint64_t bits;
    memcpy(&bits, &scores[i], sizeof bits);
    return bits;
}

/* Of `need` or more candidate lanes in bits (bit j = lane j), the lowest `need`; all
   of them when there are fewer. The bulk selection's ties at the threshold. */
static inline unsigned sh_lowest_bits(unsigned bits, size_t need)
{
    unsigned taken = 0;
    while (bits != 0 && need != 0) {
        unsigned low = bits & (0u - bits);
        taken |= low;
        bits ^= low;
        need--;
    }
    return taken;
}

/* ---------------------------------------------------------------- policies */

/* StreamingLLM: the k oldest positions after the sinks leave the row (streaming_llm.c).
   Writes them (ascending) to victims and their slots to slots (if not NULL), and
   compacts the row; n is the count before the eviction. */
void sh_streaming_evict_row(uint32_t *positions, size_t n, size_t sinks, size_t k,
                            uint32_t *victims, int64_t *slots);

/* ---------------------------------------------------------------- threads */

/* One part of a call's rows: fn(ctx, part) for part in [0, parts). */
typedef void (*sh_part_fn)(void *ctx, size_t part);

/* Runs fn(ctx, part) for every part in [0, parts) (parts <= SH_MAX_THREADS): part 0
   on the calling thread, the others on threads of their own, and returns when all
   are done. A part whose thread cannot be started runs on the calling thread
   instead, so the call cannot fail and the parts' results do not depend on where
   they ran. */
void sh_run_parts(sh_part_fn fn, void *ctx, size_t parts);

#endif /* SH_INTERNAL_H */
