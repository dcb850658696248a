/*
 * sh_internal.h - the policy object's layout and what the C files share; not part
 * of the public API or the cdef. docs/architecture.md maps the files. Calls and
 * references go one way, each file using only those listed before it:
 *
 *   kernels.c         the portable scalar kernels (validation; least, largest,
 *                     histogram, take over uint32 or float64 keys)
 *   simd.c            their AVX2 forms and the run-time switch (falls back to kernels.c)
 *   scissorhands.c    Scissorhands' vote update (plain, history window, vote rate)
 *   h2o.c             H2O's cumulative scores and TOVA's latest weights
 *   pins.c            pinned spans: the object's spans, the pinned slots of a row,
 *                     whether a budget leaves enough to evict
 *   streaming_llm.c   StreamingLLM's eviction: the oldest after the sinks
 *   select.c          eviction by key: the first minimum, the radix selection,
 *                     compaction (takes the kind's operations as an argument)
 *   kinds.c           the per-kind table of operations, sh_kinds
 *   policy.c          the object: configuration, storage, growth, rows
 *   state.c           export, import and lookups
 *   parallel.c        a step's rows on several threads
 *   step.c            a decode step (admit, evict, both) over every row
 *   pools.c           a step whose rows share budgets
 *   observe.c         eviction by an observation window's pooled attention (SnapKV)
 *   extend.c          a chunk of tokens (extend, prefill)
 */
#ifndef SH_INTERNAL_H
#define SH_INTERNAL_H

#include <string.h>

#include "scissorhands.h"

/* Row h of an array with `capacity` slots per row starts at h * capacity. kind,
   vote_rate, history_window and threads are narrow so that the whole header stays
   within SH_HEADER_BYTES. The values allocation holds, in order: the heads * capacity
   votes or scores, with vote_rate the heads * capacity steps-held counters (same
   row layout), then heads * capacity bytes of selection scratch, then, with a
   history window, the heads * capacity vote registers (from the next multiple of 8
   bytes). Row h holds counts[h] positions; with one row, counts points at `count`
   inside the header. The pinned spans are the object's, shared by every row
   (pins.c). */
struct sh_policy {
    int8_t kind;            /* enum sh_kind: the index of its operations in sh_kinds */
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
                               vote_rate), double scores (H2O, TOVA), then the scratch
                               bytes, then the vote registers with a history window; or
                               NULL */
    uint32_t *pins;         /* NULL, or the pinned spans: pins[0] = their number m, then
                               m (start, stop) pairs, half-open, merged, ascending */
};

/* Asks for every cache line of [p, p + bytes) to be brought into the caches (a hint:
   nothing without the compiler's). */
static inline void sh_prefetch(const void *p, size_t bytes)
{
#if defined(__GNUC__) || defined(__clang__)
    const char *c = (const char *)p;
    for (size_t at = 0; at < bytes; at += 64)
        __builtin_prefetch(c + at, 0, 3);
#else
    (void)p;
    (void)bytes;
#endif
}

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

/* One policy row of a decode step's GQA gather (gqa.c): mean[c] for c < extent, the
   group's weights first[g * extent + c] added in head order in float32, then divided
   by the group's size; then dst[j] = mean[col[j]] for a column in [0, extent), else
   mean[extent] (the caller's 0). Returns 1 when every mean[c], c < extent, is finite
   and >= 0 (sh_valid_f32).
   The AVX2 form needs extent <= INT32_MAX (its gather's indices are int32). */
int sh_gqa_row(const float *first, size_t group, size_t extent, const int32_t *col, size_t width,
               float *mean, float *dst);
/* sh_gqa_row that also sets *most to the largest of votes[0, width) when votes is not
   NULL (the AVX2 form reads them in its pass over the weights), and may ask for the
   cache lines of [ahead, ahead + 4 * width) and of the columns early (a hint; ahead
   may be NULL): the steady step's row (layout.c). */
int sh_gqa_row_votes(const float *first, size_t group, size_t extent, const int32_t *col, size_t width,
                     float *mean, float *dst, const uint32_t *votes, uint32_t *most, const void *ahead);
/* sh_gqa_gather_layers (gqa.c) that also sets *valid (when not NULL) to 1 when every
   weight written is finite and >= 0: what sh_step's checked argument vouches for. */
int sh_gqa_gather_checked(const float *const *weights, size_t layers, size_t rows, size_t group, size_t extent,
                          const int32_t *columns, size_t col_stride, size_t width, float *out, int *finite,
                          int *valid);
#if SH_HAVE_AVX2
int sh_avx2_gqa_row(const float *first, size_t group, size_t extent, const int32_t *col, size_t width,
                    float *mean, float *dst);
int sh_avx2_gqa_row_votes(const float *first, size_t group, size_t extent, const int32_t *col, size_t width,
                          float *mean, float *dst, const uint32_t *votes, uint32_t *most, const void *ahead);
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

/* The scalar or the AVX2 form of kernel `name`, as `simd` (sh_simd_active() when the
   call started) says: chosen once per call and row, never per slot. */
#if SH_HAVE_AVX2
#define SH_KERNEL(simd, name) ((simd) ? sh_avx2_##name : sh_##name)
#else
#define SH_KERNEL(simd, name) ((void)(simd), sh_##name)
#endif

/* Bytes of one weight of dtype (SH_DTYPE_F32 or SH_DTYPE_F64). */
static inline size_t sh_dtype_size(int32_t dtype)
{
    return dtype == SH_DTYPE_F32 ? sizeof(float) : sizeof(double);
}

/* 1 when each of the n weights of dtype is finite and >= 0. */
static inline int sh_weights_valid(int32_t dtype, const void *attn, size_t n, int simd)
{
    return dtype == SH_DTYPE_F32 ? SH_KERNEL(simd, valid_f32)(attn, n)
                                 : SH_KERNEL(simd, valid_f64)(attn, n);
}

/* ---------------------------------------------------------------- kinds

   Everything that differs between the policy kinds is one entry of sh_kinds
   (kinds.c), indexed by the kind; the shared code reads the entry and never tests
   the kind itself. A new policy is its own file (its update or its eviction) plus
   one entry. */

/* A slot's value besides its position; its type fixes the selection's key. */
enum sh_values {
    SH_VALUES_NONE = 0, /* positions only: the kind evicts by position */
    SH_VALUES_U32 = 1,  /* uint32 counts (votes): the key is the count */
    SH_VALUES_F64 = 2   /* float64 scores, finite and >= 0: the key is their bit pattern,
                           which orders as the scores do (-0.0 is stored as 0.0) */
};

/* Which of sh_config's parameters a kind takes (0 is always accepted). */
enum sh_takes {
    SH_TAKES_RECENT_WINDOW = 1,
    SH_TAKES_SINKS = 2,
    SH_TAKES_VOTE_OPTIONS = 4 /* history_window and vote_rate (SH_VALUES_U32 only) */
};

#define SH_KIND_COUNT 5

typedef struct sh_kind_ops sh_kind_ops;

/* Applies the n >= 1 weights of row h (of dtype) to the row's per-slot state. When
   the row keeps nothing but its positions and values (no vote register, no steps
   held) the same pass finds the least slot of [lo, hi) (hi <= n) and returns it (hi
   when the range is empty); otherwise it returns hi. */
typedef size_t (*sh_update_fn)(sh_policy *p, size_t h, int32_t dtype, const void *attn,
                               size_t n, size_t lo, size_t hi, int simd);

/* Evicts k slots from row h, which holds n (k <= n minus the protected slots: the
   sinks, the recent window and the pinned positions, which it must skip through
   sh_next_pinned): the kind's victims, ascending, to victims (and their slots before
   the eviction to slots when not NULL), closing the gaps in order; the caller sets
   the count. */
typedef void (*sh_evict_fn)(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n,
                            size_t k, uint32_t *victims, int64_t *slots, int simd);

struct sh_kind_ops {
    uint8_t values;            /* enum sh_values */
    uint8_t takes;             /* enum sh_takes, or-ed */
    uint8_t min_recent_window; /* the least recent_window allowed */
    uint32_t initial_capacity; /* 0: min(budget + 1, SH_INITIAL_CAPACITY_LIMIT) */
    sh_update_fn update;       /* NULL: attention is never read */
    sh_evict_fn evict;         /* NULL: never evicts */
};

extern const sh_kind_ops sh_kinds[SH_KIND_COUNT];

/* The operations of p's kind (kinds.c; the files before it take them as arguments). */
static inline const sh_kind_ops *sh_ops(const sh_policy *p)
{
    return &sh_kinds[p->kind];
}

/* Bytes of a slot's value: 0, 4 or 8. */
static inline size_t sh_value_bytes(const sh_kind_ops *ops)
{
    return ops->values == SH_VALUES_U32 ? sizeof(uint32_t)
           : ops->values == SH_VALUES_F64 ? sizeof(double)
                                          : 0;
}

/* ---------------------------------------------------------------- layout */

static inline uint32_t *sh_row_positions(const sh_policy *p, size_t h)
{
    return p->positions + h * p->capacity;
}

static inline uint32_t *sh_row_votes(const sh_policy *p, size_t h)
{
    return (uint32_t *)p->values + h * p->capacity;
}

static inline double *sh_row_scores(const sh_policy *p, size_t h)
{
    return (double *)p->values + h * p->capacity;
}

/* Whether each slot keeps a register of its last history_window vote bits. */
static inline int sh_has_history(const sh_policy *p)
{
    return p->history_window != 0;
}

/* Where the vote registers start in a values block of `slots` slots: after the votes
   (only counts keep registers), the steps held with a vote rate and the scratch,
   rounded up to 8 bytes. */
static inline size_t sh_history_offset(size_t slots, int with_held)
{
    size_t bytes = slots * (sizeof(uint32_t) + (with_held ? sizeof(uint32_t) : 0) + 1);
    return (bytes + 7) & ~(size_t)7;
}

/* The vote registers of a values block laid out for heads rows of capacity slots. */
static inline uint64_t *sh_history_block(void *values, size_t heads, size_t capacity,
                                         int with_held)
{
    return (uint64_t *)(void *)((char *)values + sh_history_offset(heads * capacity, with_held));
}

static inline uint64_t *sh_row_history(const sh_policy *p, size_t h)
{
    return sh_history_block(p->values, p->heads, p->capacity, p->vote_rate) + h * p->capacity;
}

/* The steps-held counters follow the heads * capacity votes in the values block. */
static inline uint32_t *sh_held_block(void *values, size_t heads, size_t capacity)
{
    return (uint32_t *)values + heads * capacity;
}

static inline uint32_t *sh_row_held(const sh_policy *p, size_t h)
{
    return sh_held_block(p->values, p->heads, p->capacity) + h * p->capacity;
}

/* Bytes per slot of the values block before the scratch: the value, and the steps
   held with a vote rate. */
static inline size_t sh_values_bytes(const sh_kind_ops *ops, int with_held)
{
    return sh_value_bytes(ops) + (with_held ? sizeof(uint32_t) : 0);
}

/* The selection scratch of row h: one byte per slot, after the values. */
static inline uint8_t *sh_row_scratch(const sh_kind_ops *ops, const sh_policy *p, size_t h)
{
    size_t slots = (size_t)p->heads * p->capacity;
    return (uint8_t *)p->values + slots * sh_values_bytes(ops, p->vote_rate) + h * p->capacity;
}

/* Whether the rows keep nothing per slot but positions and values (no vote register,
   no steps held): the rows the fused step and the one-pass take serve. */
static inline int sh_plain_values(const sh_kind_ops *ops, const sh_policy *p)
{
    return ops->values != SH_VALUES_NONE && !sh_has_history(p) && !p->vote_rate;
}

/* Slot c of row h becomes pos with a zero value (an empty vote register, no steps
   held); the caller counts it. */
static inline void sh_put_slot(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t c,
                               uint32_t pos)
{
    sh_row_positions(p, h)[c] = pos;
    if (ops->values == SH_VALUES_U32)
        sh_row_votes(p, h)[c] = 0;
    else if (ops->values == SH_VALUES_F64)
        sh_row_scores(p, h)[c] = 0.0;
    if (sh_has_history(p))
        sh_row_history(p, h)[c] = 0;
    if (p->vote_rate)
        sh_row_held(p, h)[c] = 0;
}

/* Whether slot i of row h holds a zero value (the fused step: a newcomer's tie). */
static inline int sh_value_is_zero(const sh_kind_ops *ops, const sh_policy *p, size_t h,
                                   size_t i)
{
    return ops->values == SH_VALUES_U32 ? sh_row_votes(p, h)[i] == 0
                                        : sh_row_scores(p, h)[i] == 0.0;
}

/* The vote rate of slot i of row h: votes / steps held, the steps capped at the
   history window (when there is one) and raised to 1 (a slot admitted this step). */
static inline double sh_rate_at(const sh_policy *p, size_t h, size_t i)
{
    uint32_t steps = sh_row_held(p, h)[i];
    if (p->history_window != 0 && steps > p->history_window)
        steps = p->history_window;
    return (double)sh_row_votes(p, h)[i] / (double)(steps != 0 ? steps : 1);
}

/* The key that orders slot i of row h for eviction: the bits of a vote rate, else
   the value (a count, or a score's bits). */
static inline uint64_t sh_key_at(const sh_kind_ops *ops, const sh_policy *p, size_t h,
                                 size_t i)
{
    if (p->vote_rate) {
        double r = sh_rate_at(p, h, i);
        uint64_t bits;
        memcpy(&bits, &r, sizeof bits);
        return bits;
    }
    if (ops->values == SH_VALUES_U32)
        return sh_row_votes(p, h)[i];
    return sh_h2o_key(sh_row_scores(p, h), i);
}

/* Applies row h's n weights through the kind's update; a row holding nothing (n == 0)
   votes nothing. Returns what the update returns (hi when nothing ran). */
static inline size_t sh_update_row(const sh_kind_ops *ops, sh_policy *p, size_t h,
                                   int32_t dtype, const void *attn, size_t n, size_t lo,
                                   size_t hi, int simd)
{
    return n == 0 ? hi : ops->update(p, h, dtype, attn, n, lo, hi, simd);
}

/* ---------------------------------------------------------------- pinned spans (pins.c) */

/* The first slot of [lo, hi) of the ascending row pos holding x or more (hi: none):
   a binary search, the lookups of pinned runs and of a held position share it. */
size_t sh_slot_at_least(const uint32_t *pos, size_t lo, size_t hi, uint32_t x);

/* The number of pinned spans (0 when there are none). */
size_t sh_pin_spans(const sh_policy *p);

/* Whether position pos lies in a pinned span. */
int sh_is_pinned(const sh_policy *p, uint32_t pos);

/* The first slot of [from, hi) of row h whose position is pinned (hi when none), with
   *end the slot after its run of pinned slots (hi when none): [from, result) is
   unpinned, [result, *end) pinned. */
size_t sh_next_pinned(const sh_policy *p, size_t h, size_t from, size_t hi, size_t *end);

/* The pinned slots of row h among [lo, hi). */
size_t sh_pinned_in(const sh_policy *p, size_t h, size_t lo, size_t hi);

/* mark[i] = 2 for each pinned slot i of [lo, hi) of row h, 1 for the others. */
void sh_mark_pinned(const sh_policy *p, size_t h, size_t lo, size_t hi, uint8_t *mark);

/* SH_ERR_PINNED when some row evicting down to budget after admitting `admit` (0 or 1)
   position pos has fewer unpinned slots outside its sinks and recent window than it
   must evict; the pooled form counts a pool's rows together against its excess over
   pool * budget. SH_OK without pins. Only a budget below the configured one can fail:
   sh_policy_set_pins keeps the pinned positions outside [0, sinks) + sinks +
   recent_window below it, and a held position below sinks is always in a sink slot, so
   a row protects fewer slots than the configured budget. */
int sh_check_pins(const sh_policy *p, int admit, uint32_t pos, uint32_t budget);
int sh_check_pool_pins(const sh_policy *p, size_t pool, int admit, uint32_t pos,
                       uint32_t budget);

/* Bytes of the pinned spans: 0, or 4 + SH_PIN_BYTES per span. */
size_t sh_pin_bytes(const sh_policy *p);

/* ---------------------------------------------------------------- policies */

/* Scissorhands' update (scissorhands.c): one vote per weight above 1 / n, or the
   history window's registers; with a vote rate every slot's steps held first. */
size_t sh_scissorhands_update(sh_policy *p, size_t h, int32_t dtype, const void *attn,
                              size_t n, size_t lo, size_t hi, int simd);

/* H2O's (add) and TOVA's (assign) updates (h2o.c). */
size_t sh_h2o_update(sh_policy *p, size_t h, int32_t dtype, const void *attn, size_t n,
                     size_t lo, size_t hi, int simd);
size_t sh_tova_update(sh_policy *p, size_t h, int32_t dtype, const void *attn, size_t n,
                      size_t lo, size_t hi, int simd);

/* StreamingLLM's sh_evict_fn (streaming_llm.c): the k oldest positions after the
   sinks leave the row. */
void sh_streaming_evict(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n, size_t k,
                        uint32_t *victims, int64_t *slots, int simd);

/* ---------------------------------------------------------------- selection (select.c) */

/* The sh_evict_fn of every kind with values: the k slots of least key among the
   evictable ones, [min(sinks, n), n - recent_window), equal keys evicting the lower
   slot. */
void sh_evict_by_key(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n, size_t k,
                     uint32_t *victims, int64_t *slots, int simd);

/* Marks with 1 in mark[0, m) the k least (1 <= k <= m) of m keys, doubles >= 0 (+inf
   allowed, no NaN) ordered by their bits, equal keys marking the lower index first;
   the rest 0. The radix selection of sh_evict_by_key over an array of the caller's. */
void sh_mark_least_f64(const double *keys, size_t m, size_t k, uint8_t *mark, int simd);

/* Removes the slots marked 1 in mark[lo, hi) from row h, which holds n slots,
   keeping the order of the rest (values, vote registers and steps held move with
   their slots). With hi == lo + 1 the single slot lo goes and mark is not read. */
void sh_compact_row(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n, size_t lo,
                    size_t hi, const uint8_t *mark);

/* ---------------------------------------------------------------- the object (policy.c) */

/* Positions held by the fullest row, and by all rows together. */
uint32_t sh_max_count(const sh_policy *p);
size_t sh_total_count(const sh_policy *p);

/* Whether nothing was admitted since construction or reset: every row holds {0} and
   the last position is 0. */
int sh_is_fresh(const sh_policy *p);

/* Makes every row hold at least `need` slots, growing them (one doubling at a time,
   copying what each row holds) when they hold fewer; on failure (SH_ERR_NOMEM) nothing
   changes. A function of policy.c, not inline here: a header calls no source file's
   function, so that the files' order of use has no circle through it. */
int sh_ensure_capacity(sh_policy *p, uint64_t need);

/* ---------------------------------------------------------------- the step (step.c) */

/* The checks a step and a pooled step share, in order: flags, then pos (when
   admitting) above every position admitted, then budget (when evicting) against the
   protected prefix and suffix and the kind's least recent window. */
int sh_check_step(const sh_policy *p, int32_t flags, uint32_t pos, uint32_t budget);

/* The work of sh_policy_step (row_victims NULL: every row must evict the same
   number) and of sh_policy_step_rows (row_victims given: any numbers). checked: the
   caller has found every weight of attn's heads x n finite and >= 0 (the pass that
   wrote them did), so they are not checked again; 0 checks them. */
int sh_step(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype, const void *attn,
            size_t heads, size_t n, uint32_t budget, uint32_t *victims, int64_t *slots,
            size_t victims_cap, uint32_t *row_victims, size_t *n_victims, int checked);

/* ---------------------------------------------------------------- the steady step (step.c) */

/* What a fused step changed in a row, to undo it: the victim's slot `at` (the row's
   count when the newcomer went at once, nothing moved), position and vote. */
typedef struct sh_steady_undo {
    uint32_t at, pos, vote;
} sh_steady_undo;

/* The rows' weights of sh_step_steady, made row by row. make(ctx, h, votes,
   positions, most): row h's n float32 weights, every one finite and >= 0 (not checked
   again), or NULL when they are not (the step then declines); with votes (the row's n
   votes, else NULL) it also sets *most to the largest of them, read as the weights are
   made, and it may ask for the row's positions early (a hint). It may be called again
   for a row already stepped, to undo it (votes NULL), and gives the same weights.
   after(ctx, h, slot) (or NULL): row h stepped, its victim at `slot`; nonzero
   declines. undo(ctx, h, slot): what after did for row h, undone. */
typedef struct sh_row_source {
    const float *(*make)(void *ctx, size_t h, const uint32_t *votes, const uint32_t *positions, uint32_t *most);
    int (*after)(void *ctx, size_t h, int64_t slot);
    void (*undo)(void *ctx, size_t h, int64_t slot);
    void *ctx;
} sh_row_source;

/* sh_step_steady's answer when the step is not its case: nothing changed. */
#define SH_STEADY_DECLINED (-1)

/* A decode step (admit pos, evict to budget) of a Scissorhands policy whose heads
   rows each hold n positions and evict one, every row's weights made, applied and
   handed on (src) before the next row's are made: one pass over each row's state
   instead of one over every row's weights first. Victims and slots get one entry
   per row; *n_victims = 1. Its case only (plain votes, no pinned spans, one thread,
   every vote below UINT32_MAX - 1, so that a row's step can be undone exactly):
   otherwise, or when a row's weights are not valid or `after` declines, every row
   stepped is undone and SH_STEADY_DECLINED returned, for the general step to take
   (and report what it reports). */
int sh_step_steady(sh_policy *p, uint32_t pos, uint32_t budget, size_t heads, size_t n,
                   const sh_row_source *src, uint32_t *victims, int64_t *slots, size_t victims_cap,
                   size_t *n_victims);

/* The votes weights w added to n slots in a step (each above the share 1 / n), taken
   off again: the inverse of Scissorhands' vote where no vote saturated. */
void sh_scissorhands_unvote(uint32_t *votes, const float *w, size_t n);

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
