/*
 * scissorhands.c - the policy object and Scissorhands' votes (Liu et al.,
 * NeurIPS 2023, arXiv 2305.17118).
 *
 * Each decode step, every held position whose attention weight strictly exceeds its
 * fair share 1 / count earns one vote (uint32, saturating). Over budget, the
 * least-voted positions outside the sinks and the recent window leave; equal votes
 * evict the lower position. The object, admission, growth, the stable selection
 * and compaction are shared with H2O and TOVA (h2o.c), StreamingLLM
 * (streaming_llm.c) and Full; only the score update and the victim choice differ.
 * H2O and TOVA share the float64 score array and its selection (has_scores); H2O adds
 * each step's weights, TOVA assigns them.
 *
 * With a history window of w steps (1..64) each slot also keeps a 64-bit register of
 * its vote bits: every decode step that carries attention shifts each held slot's
 * register left by one, adds the new bit and masks to w bits, and the slot's vote
 * count becomes the register's popcount, so the selection below is unchanged.
 *
 * With a vote rate each slot also counts the decode steps that carried attention
 * since it was admitted (uint32, saturating), and the selection ranks it by votes /
 * steps held (steps capped at the history window, and at least 1) as a double: an
 * old position's head start in votes stops protecting it.
 *
 * Each row keeps its own count (rows may differ, and a row may be empty); the
 * capacity per row is shared. A chunk of tokens (sh_policy_extend) is applied as the
 * decode steps it stands for, with per-row admission; sh_policy_select_rows copies
 * rows into a new set (beams, batch changes).
 *
 * A decode step that evicts one position per row (the steady state) is fused: the
 * pass that applies the weights also finds each row's least-scored evictable slot,
 * and only the slots after the victim move. Selection of more victims is O(count)
 * time: a byte-at-a-time radix select finds the k-th smallest key, then one pass
 * takes every key below that threshold and the lowest slots at it, compacting the
 * survivors in order (with a vote rate the one scratch byte per slot marks the
 * candidates). The loops over a row's slots are kernels with a scalar and an AVX2
 * form (sh_internal.h, simd.c); a step's rows may run on several threads
 * (parallel.c), each row on one.
 */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "sh_internal.h"

_Static_assert(sizeof(struct sh_policy) <= SH_HEADER_BYTES,
               "the header must fit the bytes memory_bytes() reports for it");

/* ---------------------------------------------------------------- layout */

/* Whether this kind keeps a float64 score per slot (H2O, TOVA): the score array,
   its selection and its state are shared; only the update differs. */
static int has_scores(int32_t kind)
{
    return kind == SH_H2O || kind == SH_TOVA;
}

/* Whether this kind keeps a per-slot score and reads attention. */
static int reads_attention(int32_t kind)
{
    return kind == SH_SCISSORHANDS || has_scores(kind);
}

/* Bytes of score per slot: 4 (votes), 8 (H2O, TOVA scores), 0. */
static size_t value_bytes(int32_t kind)
{
    return kind == SH_SCISSORHANDS ? sizeof(uint32_t) : has_scores(kind) ? sizeof(double) : 0;
}

/* The least recent window this kind allows: TOVA's newest position has no score until
   a later token reads it, so TOVA always keeps it (1); 0 for the others. */
static uint32_t min_recent_window(int32_t kind)
{
    return kind == SH_TOVA ? 1 : 0;
}

static uint32_t *row_positions(const sh_policy *p, size_t h)
{
    return p->positions + h * p->capacity;
}

static uint32_t *row_votes(const sh_policy *p, size_t h)
{
    return (uint32_t *)p->values + h * p->capacity;
}

static double *row_scores(const sh_policy *p, size_t h)
{
    return (double *)p->values + h * p->capacity;
}

static uint64_t *row_history(const sh_policy *p, size_t h)
{
    return p->history + h * p->capacity;
}

/* The steps-held counters follow the heads * capacity votes in the values block. */
static uint32_t *held_block(void *values, size_t heads, size_t capacity)
{
    return (uint32_t *)values + heads * capacity;
}

static uint32_t *row_held(const sh_policy *p, size_t h)
{
    return held_block(p->values, p->heads, p->capacity) + h * p->capacity;
}

/* Bytes per slot of the values block before the scratch: the score, and the steps
   held with a vote rate. */
static size_t values_bytes(int32_t kind, int with_held)
{
    return value_bytes(kind) + (with_held ? sizeof(uint32_t) : 0);
}

/* The selection scratch of row h: one byte per slot, after the values. */
static uint8_t *row_scratch(const sh_policy *p, size_t h)
{
    size_t slots = (size_t)p->heads * p->capacity;
    return (uint8_t *)p->values + slots * values_bytes(p->kind, p->vote_rate) + h * p->capacity;
}

/* Positions held by the fullest row. */
static uint32_t max_count(const sh_policy *p)
{
    uint32_t most = 0;
    for (size_t h = 0; h < p->heads; h++)
        most = p->counts[h] > most ? p->counts[h] : most;
    return most;
}

/* Positions held by all rows together. */
static size_t total_count(const sh_policy *p)
{
    size_t total = 0;
    for (size_t h = 0; h < p->heads; h++)
        total += p->counts[h];
    return total;
}

/* Whether nothing was admitted since construction or reset: every row holds {0} and
   the last position is 0. */
static int is_fresh(const sh_policy *p)
{
    if (p->last_position != 0)
        return 0;
    for (size_t h = 0; h < p->heads; h++) {
        if (p->counts[h] != 1)
            return 0;
    }
    return 1;
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

/* The capacity after one growth step: doubling, but stopping at budget + 1 once on
   the way, so that a policy evicting every step holds exactly budget + 1 slots. */
static uint64_t next_capacity(uint64_t capacity, uint64_t budget)
{
    uint64_t target = budget + 1;
    uint64_t doubled = capacity * 2;
    if (capacity < target && doubled > target)
        return target;
    return doubled;
}

/* Allocated arrays of one layout, owned together (the scratch lives in values). */
typedef struct storage {
    uint32_t *positions;
    void *values;
    uint64_t *history;
} storage;

static void storage_free(storage *s)
{
    free(s->positions);
    free(s->values);
    free(s->history);
}

/* Allocates arrays for heads rows of capacity slots (vote registers too when
   with_history, steps held after the votes when with_held, and a scratch byte per
   slot after the values when the kind keeps scores); all or nothing. */
static int storage_alloc(storage *s, int32_t kind, int with_history, int with_held,
                         size_t heads, size_t capacity)
{
    size_t slots = heads * capacity;
    size_t vb = values_bytes(kind, with_held);
    s->positions = NULL;
    s->values = NULL;
    s->history = NULL;
    if (capacity != 0 && slots / capacity != heads)
        return SH_ERR_NOMEM;
    if (slots > SIZE_MAX / 16)
        return SH_ERR_NOMEM;
    s->positions = malloc(slots * sizeof(uint32_t));
    if (vb != 0)
        s->values = malloc(slots * (vb + 1));
    if (with_history)
        s->history = malloc(slots * sizeof(uint64_t));
    if (s->positions == NULL || (vb != 0 && s->values == NULL)
        || (with_history && s->history == NULL)) {
        storage_free(s);
        return SH_ERR_NOMEM;
    }
    return SH_OK;
}

/* Takes the arrays of s as the policy's, freeing the old ones. */
static void storage_install(sh_policy *p, storage *s)
{
    storage old = { p->positions, p->values, p->history };
    storage_free(&old);
    p->positions = s->positions;
    p->values = s->values;
    p->history = s->history;
}

/* Copies the held slots of row src of p to row dst of s, laid out for rows rows of
   cap slots. */
static void copy_row(const sh_policy *p, size_t src, storage *s, size_t rows, size_t cap,
                     size_t dst)
{
    size_t n = p->counts[src];
    size_t vb = value_bytes(p->kind);
    memcpy(s->positions + dst * cap, row_positions(p, src), n * sizeof(uint32_t));
    if (vb != 0)
        memcpy((char *)s->values + dst * cap * vb, (char *)p->values + src * p->capacity * vb,
               n * vb);
    if (p->history != NULL)
        memcpy(s->history + dst * cap, row_history(p, src), n * sizeof(uint64_t));
    if (p->vote_rate)
        memcpy(held_block(s->values, rows, cap) + dst * cap, row_held(p, src),
               n * sizeof(uint32_t));
}

/* Grows every row to hold at least `need` slots, copying what each row holds; on
   failure nothing changes. */
static int ensure_capacity(sh_policy *p, uint64_t need)
{
    if (need <= p->capacity)
        return SH_OK;
    uint64_t cap = p->capacity;
    while (cap < need)
        cap = next_capacity(cap, p->budget);
    if (cap > UINT32_MAX)
        cap = UINT32_MAX;
    if (cap < need)
        return SH_ERR_NOMEM;
    storage s;
    int rc = storage_alloc(&s, p->kind, p->history != NULL, p->vote_rate, p->heads,
                           (size_t)cap);
    if (rc != SH_OK)
        return rc;
    for (size_t h = 0; h < p->heads; h++)
        copy_row(p, h, &s, p->heads, (size_t)cap, h);
    storage_install(p, &s);
    p->capacity = (uint32_t)cap;
    return SH_OK;
}

/* Slot c of row h becomes pos with a zero score (an empty vote register, no steps
   held); the caller counts it. */
static inline void put_slot(sh_policy *p, size_t h, size_t c, uint32_t pos)
{
    row_positions(p, h)[c] = pos;
    if (p->kind == SH_SCISSORHANDS)
        row_votes(p, h)[c] = 0;
    else if (has_scores(p->kind))
        row_scores(p, h)[c] = 0.0;
    if (p->history != NULL)
        row_history(p, h)[c] = 0;
    if (p->vote_rate)
        row_held(p, h)[c] = 0;
}

/* Every row back to {0} with a zero score (and an empty vote register, no steps
   held). */
static void hold_origin(sh_policy *p)
{
    for (size_t h = 0; h < p->heads; h++) {
        put_slot(p, h, 0, 0);
        p->counts[h] = 1;
    }
    p->last_position = 0;
}

/* ---------------------------------------------------------------- lifecycle */

int sh_policy_new(const sh_config *cfg, sh_policy **out)
{
    if (cfg == NULL || out == NULL)
        return SH_ERR_ARG;
    int32_t kind = cfg->kind;
    if (kind < SH_FULL || kind > SH_TOVA)
        return SH_ERR_ARG;
    if (cfg->heads < 1 || cfg->heads > SH_MAX_HEADS)
        return SH_ERR_ARG;
    if (cfg->budget < 1)
        return SH_ERR_BUDGET;
    if (kind == SH_FULL || kind == SH_STREAMING_LLM) {
        if (cfg->recent_window != 0 || (kind == SH_FULL && cfg->sinks != 0))
            return SH_ERR_ARG;
    }
    if (cfg->history_window != 0
        && (kind != SH_SCISSORHANDS || cfg->history_window > SH_MAX_HISTORY_WINDOW))
        return SH_ERR_ARG;
    if (cfg->vote_rate > 1 || (cfg->vote_rate != 0 && kind != SH_SCISSORHANDS))
        return SH_ERR_ARG;
    if (cfg->recent_window < min_recent_window(kind))
        return SH_ERR_ARG;
    if ((uint64_t)cfg->recent_window + cfg->sinks >= cfg->budget)
        return SH_ERR_BUDGET;

    sh_policy *p = calloc(1, sizeof *p);
    if (p == NULL)
        return SH_ERR_NOMEM;
    p->kind = (int8_t)kind;
    p->vote_rate = (uint8_t)cfg->vote_rate;
    p->history_window = (uint8_t)cfg->history_window;
    p->threads = 1;
    p->heads = cfg->heads;
    p->budget = cfg->budget;
    p->recent_window = cfg->recent_window;
    p->sinks = cfg->sinks;
    uint64_t cap = (uint64_t)cfg->budget + 1;
    if (kind == SH_FULL)
        cap = SH_FULL_INITIAL_CAPACITY;
    else if (cap > SH_INITIAL_CAPACITY_LIMIT)
        cap = SH_INITIAL_CAPACITY_LIMIT;
    p->counts = &p->count;
    if (p->heads > 1) {
        p->counts = malloc(p->heads * sizeof *p->counts);
        if (p->counts == NULL) {
            free(p);
            return SH_ERR_NOMEM;
        }
    }
    storage s;
    if (storage_alloc(&s, kind, p->history_window != 0, p->vote_rate, p->heads, (size_t)cap)
        != SH_OK) {
        if (p->counts != &p->count)
            free(p->counts);
        free(p);
        return SH_ERR_NOMEM;
    }
    p->positions = s.positions;
    p->values = s.values;
    p->history = s.history;
    p->capacity = (uint32_t)cap;
    hold_origin(p);
    *out = p;
    return SH_OK;
}

void sh_policy_free(sh_policy *p)
{
    if (p == NULL)
        return;
    storage s = { p->positions, p->values, p->history };
    storage_free(&s);
    if (p->counts != &p->count)
        free(p->counts);
    free(p);
}

int sh_policy_reset(sh_policy *p)
{
    if (p == NULL)
        return SH_ERR_ARG;
    hold_origin(p);
    return SH_OK;
}

int sh_policy_set_threads(sh_policy *p, uint32_t threads)
{
    if (p == NULL || threads < 1 || threads > SH_MAX_THREADS)
        return SH_ERR_ARG;
    p->threads = (uint8_t)threads;
    return SH_OK;
}

uint32_t sh_policy_threads(const sh_policy *p)
{
    return p == NULL ? 0 : p->threads;
}

size_t sh_policy_count(const sh_policy *p)
{
    return p == NULL ? 0 : max_count(p);
}

size_t sh_policy_row_count(const sh_policy *p, size_t head)
{
    return (p == NULL || head >= p->heads) ? 0 : p->counts[head];
}

int sh_policy_counts(const sh_policy *p, uint32_t *counts, size_t cap)
{
    if (p == NULL || counts == NULL)
        return SH_ERR_ARG;
    if (cap < p->heads)
        return SH_ERR_BUFFER;
    memcpy(counts, p->counts, p->heads * sizeof *counts);
    return SH_OK;
}

size_t sh_policy_capacity(const sh_policy *p)
{
    return p == NULL ? 0 : p->capacity;
}

size_t sh_policy_slot_bytes(const sh_policy *p)
{
    if (p == NULL)
        return 0;
    size_t vb = value_bytes(p->kind);
    size_t hb = p->history != NULL ? sizeof(uint64_t) : 0;
    size_t rb = p->vote_rate ? sizeof(uint32_t) : 0;
    return sizeof(uint32_t) + vb + (vb != 0 ? 1 : 0) + hb + rb;
}

size_t sh_policy_memory_bytes(const sh_policy *p)
{
    if (p == NULL)
        return 0;
    size_t counts = p->heads > 1 ? (size_t)SH_COUNT_BYTES * p->heads : 0;
    return SH_HEADER_BYTES + counts + (size_t)p->capacity * p->heads * sh_policy_slot_bytes(p);
}

uint32_t sh_policy_last_position(const sh_policy *p)
{
    return p == NULL ? 0 : p->last_position;
}

/* ---------------------------------------------------------------- kernels */

/* The scalar or the AVX2 form of kernel `name` (see sh_internal.h), as `simd` says. */
#if SH_HAVE_AVX2
#define KERNEL(simd, name) ((simd) ? sh_avx2_##name : sh_##name)
#else
#define KERNEL(simd, name) ((void)(simd), sh_##name)
#endif

static int weights_valid(int32_t dtype, const void *attn, size_t n, int simd)
{
    return dtype == SH_DTYPE_F32 ? KERNEL(simd, valid_f32)(attn, n)
                                 : KERNEL(simd, valid_f64)(attn, n);
}

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

/* ---------------------------------------------------------------- attention */

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

/* Whether a row's scores are plain votes or H2O/TOVA scores, with nothing else per
   slot: the rows the fused step and the specialised selection serve. */
static int plain_scores(const sh_policy *p)
{
    return has_scores(p->kind)
           || (p->kind == SH_SCISSORHANDS && p->history == NULL && !p->vote_rate);
}

/* Applies one row of weights (n of them, of dtype: row h's count) to row h's
   scores; a row holding nothing votes nothing. With plain scores the same pass finds
   the least slot of [lo, hi) (hi <= n) and returns it (hi when empty); otherwise it
   returns hi. */
static size_t update_row(sh_policy *p, size_t h, int32_t dtype, const void *attn, size_t n,
                         size_t lo, size_t hi, int simd)
{
    if (n == 0)
        return hi;
    if (p->vote_rate)
        count_step(row_held(p, h), n);
    if (p->kind == SH_SCISSORHANDS && p->history != NULL) {
        uint64_t mask = history_mask(p->history_window);
        if (dtype == SH_DTYPE_F32)
            vote_history_f32(row_votes(p, h), row_history(p, h), mask, attn, n);
        else
            vote_history_f64(row_votes(p, h), row_history(p, h), mask, attn, n);
        return hi;
    }
    if (p->kind == SH_SCISSORHANDS) {
        double share = 1.0 / (double)n;
        if (dtype == SH_DTYPE_F32)
            return KERNEL(simd, vote_f32)(row_votes(p, h), attn, n, float_threshold(share), lo, hi);
        return KERNEL(simd, vote_f64)(row_votes(p, h), attn, n, share, lo, hi);
    }
    if (p->kind == SH_H2O) {
        if (dtype == SH_DTYPE_F32)
            return KERNEL(simd, h2o_accumulate_f32)(row_scores(p, h), attn, n, lo, hi);
        return KERNEL(simd, h2o_accumulate_f64)(row_scores(p, h), attn, n, lo, hi);
    }
    if (p->kind == SH_TOVA) {
        if (dtype == SH_DTYPE_F32)
            return KERNEL(simd, tova_assign_f32)(row_scores(p, h), attn, n, lo, hi);
        return KERNEL(simd, tova_assign_f64)(row_scores(p, h), attn, n, lo, hi);
    }
    return hi;
}

static size_t dtype_size(int32_t dtype)
{
    return dtype == SH_DTYPE_F32 ? sizeof(float) : sizeof(double);
}

/* ---------------------------------------------------------------- selection */

/* The vote rate of slot i of row h: votes / steps held, the steps capped at the
   history window (when there is one) and raised to 1 (a slot admitted this step). */
static inline double rate_at(const sh_policy *p, size_t h, size_t i)
{
    uint32_t steps = row_held(p, h)[i];
    if (p->history_window != 0 && steps > p->history_window)
        steps = p->history_window;
    return (double)row_votes(p, h)[i] / (double)(steps != 0 ? steps : 1);
}

/* The key that orders slot i of row h: votes, the bits of a vote rate, or the bits
   of an H2O or TOVA score (finite doubles >= 0 order as their bits do). */
static inline uint64_t key_at(const sh_policy *p, size_t h, size_t i)
{
    if (p->kind == SH_SCISSORHANDS && !p->vote_rate)
        return row_votes(p, h)[i];
    if (p->kind == SH_SCISSORHANDS) {
        double r = rate_at(p, h, i);
        uint64_t bits;
        memcpy(&bits, &r, sizeof bits);
        return bits;
    }
    return sh_h2o_key(row_scores(p, h), i);
}

/* The byte value b at which the running count of hist reaches *need; subtracts the
   count strictly below b from *need. */
static unsigned pick_bucket(const size_t hist[256], size_t *need)
{
    size_t below = 0;
    unsigned b = 0;
    while (below + hist[b] < *need)
        below += hist[b++];
    *need -= below;
    return b;
}

/* The highest multiple of 8 at or below the top set bit of x (0 for x < 256). */
static unsigned top_byte_shift(uint64_t x)
{
    unsigned shift = 56;
    while (shift > 0 && (x >> shift) == 0)
        shift -= 8;
    return shift;
}

/* Finds the k-th smallest key in slots [lo, hi) of row h as a (prefix, mask) pair:
   the victims are every slot whose masked key is below prefix, then the lowest
   *need slots whose masked key equals it. Requires 1 <= k <= hi - lo. With plain
   scores each pass is a kernel over the votes or the scores' bits; with a vote rate
   the scratch byte marks which slots are still candidates. */
static void radix_select(const sh_policy *p, size_t h, size_t lo, size_t hi, size_t k,
                         uint64_t *prefix_out, uint64_t *mask_out, size_t *need, int simd)
{
    int votes = p->kind == SH_SCISSORHANDS && !p->vote_rate;
    int scores = has_scores(p->kind);
    uint8_t *mark = row_scratch(p, h);
    uint64_t all;
    if (votes) {
        all = KERNEL(simd, max_u32)(row_votes(p, h), lo, hi);
    } else if (scores) {
        all = KERNEL(simd, max_f64_bits)(row_scores(p, h), lo, hi);
    } else {
        all = 0;
        for (size_t i = lo; i < hi; i++) {
            all |= key_at(p, h, i);
            mark[i] = 1;
        }
    }
    unsigned shift = top_byte_shift(all);
    uint64_t prefix = 0, mask = 0;
    *need = k;
    for (;; shift -= 8) {
        size_t hist[256] = { 0 };
        if (votes) {
            KERNEL(simd, hist_u32)(row_votes(p, h), lo, hi, (uint32_t)mask, (uint32_t)prefix,
                                   shift, hist);
        } else if (scores) {
            KERNEL(simd, hist_f64_bits)(row_scores(p, h), lo, hi, mask, prefix, shift, hist);
        } else {
            for (size_t i = lo; i < hi; i++) {
                if (mark[i]) {
                    uint64_t key = key_at(p, h, i);
                    if ((key & mask) != prefix)
                        mark[i] = 0;
                    else
                        hist[(key >> shift) & 0xff]++;
                }
            }
        }
        unsigned b = pick_bucket(hist, need);
        prefix |= (uint64_t)b << shift;
        mask |= (uint64_t)0xff << shift;
        /* Every candidate left in bucket b is a victim: no finer byte can matter. */
        if (hist[b] == *need || shift == 0)
            break;
    }
    *prefix_out = prefix;
    *mask_out = mask;
}

/* The first slot of [lo, hi) holding the least key (hi > lo). */
static size_t first_minimum(const sh_policy *p, size_t h, size_t lo, size_t hi, int simd)
{
    if (p->vote_rate) {
        size_t at = lo;
        double least = rate_at(p, h, lo);
        for (size_t i = lo + 1; i < hi; i++) {
            double r = rate_at(p, h, i);
            if (r < least) {
                least = r;
                at = i;
            }
        }
        return at;
    }
    if (p->kind == SH_SCISSORHANDS)
        return KERNEL(simd, least_u32)(row_votes(p, h), lo, hi);
    return KERNEL(simd, least_f64)(row_scores(p, h), lo, hi);
}

/* Removes the slots marked 1 in mark[lo, hi) from row h, which holds n slots,
   keeping the order of the rest (vote registers and steps held move with their
   slots): one memmove per array per run of survivors. With hi == lo + 1 the single
   slot lo goes and mark is not read. */
static void compact_row(sh_policy *p, size_t h, size_t n, size_t lo, size_t hi,
                        const uint8_t *mark)
{
    uint32_t *pos = row_positions(p, h);
    size_t vb = value_bytes(p->kind);
    char *vals = (char *)p->values + h * p->capacity * vb;
    uint64_t *hist = p->history != NULL ? row_history(p, h) : NULL;
    uint32_t *held = p->vote_rate ? row_held(p, h) : NULL;
    if (hi == lo + 1) {
        memmove(pos + lo, pos + lo + 1, (n - lo - 1) * sizeof *pos);
        memmove(vals + lo * vb, vals + (lo + 1) * vb, (n - lo - 1) * vb);
        if (hist != NULL)
            memmove(hist + lo, hist + lo + 1, (n - lo - 1) * sizeof *hist);
        if (held != NULL)
            memmove(held + lo, held + lo + 1, (n - lo - 1) * sizeof *held);
        return;
    }
    size_t w = lo, i = lo;
    while (i < n) {
        if (i < hi && mark[i]) {
            i++;
            continue;
        }
        size_t run = i + 1;
        while (run < hi && !mark[run])
            run++;
        if (run >= hi)
            run = n;
        if (w != i) {
            memmove(pos + w, pos + i, (run - i) * sizeof *pos);
            memmove(vals + w * vb, vals + i * vb, (run - i) * vb);
            if (hist != NULL)
                memmove(hist + w, hist + i, (run - i) * sizeof *hist);
            if (held != NULL)
                memmove(held + w, held + i, (run - i) * sizeof *held);
        }
        w += run - i;
        i = run;
    }
}

/* Evicts the k least-scored slots of [lo, hi) from row h, which holds n slots
   (ties: the lower slot), writing the victims ascending (and their slots), then
   compacting the row. */
static void evict_row_by_score(sh_policy *p, size_t h, size_t n, size_t lo, size_t hi,
                               size_t k, uint32_t *victims, int64_t *slots, int simd)
{
    uint32_t *pos = row_positions(p, h);
    uint8_t *mark = row_scratch(p, h);
    if (k == 1) {
        /* The steady state: one victim, the first minimum. */
        size_t i = first_minimum(p, h, lo, hi, simd);
        victims[0] = pos[i];
        if (slots != NULL)
            slots[0] = (int64_t)i;
        compact_row(p, h, n, i, i + 1, mark);
        return;
    }
    uint64_t prefix, mask;
    size_t need;
    radix_select(p, h, lo, hi, k, &prefix, &mask, &need, simd);
    if (plain_scores(p)) {
        /* Positions and one value array: take and compact in one pass. */
        if (p->kind == SH_SCISSORHANDS)
            KERNEL(simd, take_u32)(pos, row_votes(p, h), n, lo, hi, (uint32_t)mask,
                                   (uint32_t)prefix, need, victims, slots);
        else
            KERNEL(simd, take_f64)(pos, row_scores(p, h), n, lo, hi, mask, prefix, need,
                                   victims, slots);
        return;
    }
    size_t j = 0;
    for (size_t i = lo; i < hi; i++) {
        uint64_t masked = key_at(p, h, i) & mask;
        int victim = masked < prefix || (masked == prefix && need > 0);
        if (victim && masked == prefix)
            need--;
        mark[i] = (uint8_t)victim;
        if (victim) {
            victims[j] = pos[i];
            if (slots != NULL)
                slots[j] = (int64_t)i;
            j++;
        }
    }
    compact_row(p, h, n, lo, hi, mark);
}

/* Evicts k slots from row h, which holds n of them (k <= n minus the protected
   slots): the policy's victims, ascending, to victims (and slots). */
static void evict_row(sh_policy *p, size_t h, size_t n, size_t k, uint32_t *victims,
                      int64_t *slots, int simd)
{
    if (p->kind == SH_STREAMING_LLM) {
        sh_streaming_evict_row(row_positions(p, h), n, p->sinks, k, victims, slots);
    } else {
        size_t sinks = p->sinks < n ? p->sinks : n;
        evict_row_by_score(p, h, n, sinks, n - p->recent_window, k, victims, slots, simd);
    }
}

/* Checks budget against the protected prefix and suffix of this policy (and the
   recent window against its kind's least, as sh_policy_new does). */
static int check_budget(const sh_policy *p, uint32_t budget)
{
    if (p->recent_window < min_recent_window(p->kind))
        return SH_ERR_ARG;
    if (budget < 1)
        return SH_ERR_BUDGET;
    if ((uint64_t)p->recent_window + p->sinks >= budget)
        return SH_ERR_BUDGET;
    return SH_OK;
}

/* ---------------------------------------------------------------- step */

/* A step's work, shared by the threads that do it: part t handles rows
   [first_row[t], first_row[t + 1]), writing its victims from first_victim[t] on. */
typedef struct step_job {
    sh_policy *p;
    int32_t dtype;
    const char *attn;     /* row h's weights at attn + h * row_bytes, or NULL */
    size_t row_bytes;
    size_t n;             /* weights per row */
    int equal;            /* every row holds the same count */
    int admit;            /* pos joins every row */
    int scores_change;    /* the weights change the scores */
    int evicts;           /* rows over budget evict */
    uint32_t pos;
    uint32_t budget;
    uint32_t *victims;
    int64_t *slots;
    uint32_t *row_victims; /* per-row victim counts (sh_policy_step_rows), or NULL */
    int simd;
    size_t first_row[SH_MAX_THREADS + 1];
    size_t first_victim[SH_MAX_THREADS];
    int valid[SH_MAX_THREADS];
} step_job;

/* Victims row h evicts in this step (its count before the step is given). */
static size_t row_evicts(const step_job *job, size_t held)
{
    size_t after = held + (size_t)job->admit;
    return (job->evicts && after > job->budget) ? after - job->budget : 0;
}

/* Checks every weight part t's rows read. */
static void validate_part(void *ctx, size_t t)
{
    step_job *job = ctx;
    size_t a = job->first_row[t], b = job->first_row[t + 1];
    int ok = 1;
    if (job->equal) { /* every row reads all n: one pass over the part's weights */
        ok = weights_valid(job->dtype, job->attn + a * job->row_bytes, (b - a) * job->n,
                           job->simd);
    } else {
        for (size_t h = a; h < b && ok; h++)
            ok = weights_valid(job->dtype, job->attn + h * job->row_bytes, job->p->counts[h],
                               job->simd);
    }
    job->valid[t] = ok;
}

/* The fused single-victim step of row h, which holds n >= 1 slots and gets one
   victim: the pass that applies the weights also finds the least slot among the
   evictable ones, and only the slots after the victim move (once, with pos taking
   the freed last slot). The evictable slots after the admission are [lo, hi) of
   n + 1, the new slot n (score 0) among them when there is no recent window: it goes
   only when every older candidate scores more (ties go to the lower slot). */
static void fused_step_row(const step_job *job, size_t h, size_t n, uint32_t *victim,
                           int64_t *slot)
{
    sh_policy *p = job->p;
    size_t lo = p->sinks < n + 1 ? p->sinks : n + 1;
    size_t hi = n + 1 - p->recent_window;
    size_t top = hi < n ? hi : n; /* the older slots among the evictable ones */
    size_t at = update_row(p, h, job->dtype, job->attn + h * job->row_bytes, n, lo, top,
                           job->simd);
    if (hi == n + 1) {
        int older_goes = at < top && (p->kind == SH_SCISSORHANDS ? row_votes(p, h)[at] == 0
                                                                   : row_scores(p, h)[at] == 0.0);
        if (!older_goes) {
            /* The newcomer goes at once: the row is as the weights left it. */
            *victim = job->pos;
            if (slot != NULL)
                *slot = (int64_t)n;
            return;
        }
    }
    uint32_t *pos = row_positions(p, h);
    size_t vb = value_bytes(p->kind);
    char *vals = (char *)p->values + h * p->capacity * vb;
    *victim = pos[at];
    if (slot != NULL)
        *slot = (int64_t)at;
    memmove(pos + at, pos + at + 1, (n - at - 1) * sizeof *pos);
    memmove(vals + at * vb, vals + (at + 1) * vb, (n - at - 1) * vb);
    put_slot(p, h, n - 1, job->pos);
}

/* Applies the step to row h, writing its victims from victims + at. */
static void step_row(step_job *job, size_t h, size_t at)
{
    sh_policy *p = job->p;
    size_t held = p->counts[h];
    size_t k = row_evicts(job, held);
    uint32_t *victims = job->victims + at;
    int64_t *slots = job->slots == NULL ? NULL : job->slots + at;
    if (job->row_victims != NULL)
        job->row_victims[h] = (uint32_t)k;
    if (job->scores_change && k == 1 && held != 0 && plain_scores(p)) {
        fused_step_row(job, h, held, victims, slots);
        return;
    }
    if (job->scores_change)
        update_row(p, h, job->dtype, job->attn + h * job->row_bytes, held, 0, 0, job->simd);
    if (job->admit)
        put_slot(p, h, held++, job->pos);
    if (k != 0)
        evict_row(p, h, held, k, victims, slots, job->simd);
    p->counts[h] = (uint32_t)(held - k);
}

/* Applies the step to part t's rows. */
static void step_part(void *ctx, size_t t)
{
    step_job *job = ctx;
    size_t at = job->first_victim[t];
    for (size_t h = job->first_row[t]; h < job->first_row[t + 1]; h++) {
        size_t held = job->p->counts[h];
        step_row(job, h, at);
        at += row_evicts(job, held);
    }
}

/* How many parts (threads) a step over `rows` rows holding `slots` positions in all
   uses, and the rows of each: contiguous, about equal in number. */
static size_t plan_parts(const sh_policy *p, step_job *job, size_t rows, uint64_t slots)
{
    size_t parts = p->threads;
    if (parts > rows)
        parts = rows;
    if (parts < 2 || slots < SH_PARALLEL_MIN_SLOTS)
        parts = 1;
    for (size_t t = 0; t <= parts; t++)
        job->first_row[t] = rows * t / parts;
    return parts;
}

/* The work of sh_policy_step (row_victims NULL: every row must evict the same
   number) and of sh_policy_step_rows (row_victims given: any numbers). Checks
   everything (the weights of all rows, on the part's threads) before any row
   changes; then each row is stepped on its own, by one thread. */
static int step_impl(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                     const void *attn, size_t heads, size_t n, uint32_t budget,
                     uint32_t *victims, int64_t *slots, size_t victims_cap,
                     uint32_t *row_victims, size_t *n_victims)
{
    if (p == NULL || n_victims == NULL)
        return SH_ERR_ARG;
    if (flags < 1 || flags > (SH_STEP_ADMIT | SH_STEP_EVICT))
        return SH_ERR_ARG;
    int do_admit = (flags & SH_STEP_ADMIT) != 0;
    int do_evict = (flags & SH_STEP_EVICT) != 0;
    int rc;
    if (do_admit && pos <= p->last_position)
        return SH_ERR_POSITION;
    if (do_evict && (rc = check_budget(p, budget)) != SH_OK)
        return rc;
    int scores_change = do_admit && dtype != SH_DTYPE_NONE && reads_attention(p->kind);
    if (do_admit && dtype != SH_DTYPE_NONE && dtype != SH_DTYPE_F32 && dtype != SH_DTYPE_F64)
        return SH_ERR_ARG;
    uint32_t *counts = p->counts;
    size_t rows = p->heads;
    uint32_t most = counts[0], least = counts[0];
    uint64_t held_all = 0;
    for (size_t h = 0; h < rows; h++) {
        most = counts[h] > most ? counts[h] : most;
        least = counts[h] < least ? counts[h] : least;
        held_all += counts[h];
    }
    step_job job;
    job.p = p;
    job.dtype = scores_change ? dtype : SH_DTYPE_NONE;
    job.attn = scores_change ? attn : NULL;
    job.row_bytes = scores_change ? n * dtype_size(dtype) : 0;
    job.n = n;
    job.equal = least == most;
    job.admit = do_admit;
    job.scores_change = scores_change;
    job.evicts = do_evict && p->kind != SH_FULL;
    job.pos = pos;
    job.budget = budget;
    job.victims = victims;
    job.slots = slots;
    job.row_victims = row_victims;
    job.simd = sh_simd_active();
    size_t parts = plan_parts(p, &job, rows, held_all);
    if (scores_change) {
        if (attn == NULL)
            return SH_ERR_ARG;
        if (heads != rows)
            return SH_ERR_LENGTH;
        if (n != most)
            return (row_victims == NULL && least != most) ? SH_ERR_RAGGED : SH_ERR_LENGTH;
        if (parts > 1) {
            sh_run_parts(validate_part, &job, parts);
        } else {
            validate_part(&job, 0);
        }
        for (size_t t = 0; t < parts; t++) {
            if (!job.valid[t])
                return SH_ERR_WEIGHT;
        }
    }
    uint64_t k0 = 0, total = 0;
    if (job.evicts && least == most) { /* every row evicts the same k0 */
        k0 = row_evicts(&job, most);
        total = k0 * rows;
    } else if (job.evicts) {
        for (size_t h = 0; h < rows; h++) {
            uint64_t k = row_evicts(&job, counts[h]);
            if (h == 0)
                k0 = k;
            else if (row_victims == NULL && k != k0)
                return SH_ERR_RAGGED;
            total += k;
        }
    }
    if (total != 0 && (victims == NULL || victims_cap < total))
        return SH_ERR_BUFFER;
    if (do_admit && (rc = ensure_capacity(p, (uint64_t)most + 1)) != SH_OK)
        return rc;

    /* Nothing below can fail. */
    size_t at = 0;
    for (size_t t = 0; t < parts; t++) {
        job.first_victim[t] = at;
        for (size_t h = job.first_row[t]; h < job.first_row[t + 1]; h++)
            at += row_evicts(&job, counts[h]);
    }
    if (parts > 1)
        sh_run_parts(step_part, &job, parts);
    else
        step_part(&job, 0);
    if (do_admit)
        p->last_position = pos;
    *n_victims = row_victims == NULL ? (size_t)k0 : at;
    return SH_OK;
}

int sh_policy_step(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                   const void *attn, size_t heads, size_t n, uint32_t budget,
                   uint32_t *victims, int64_t *slots, size_t victims_cap,
                   size_t *n_victims)
{
    return step_impl(p, flags, pos, dtype, attn, heads, n, budget, victims, slots,
                     victims_cap, NULL, n_victims);
}

int sh_policy_step_rows(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                        const void *attn, size_t heads, size_t n, uint32_t budget,
                        uint32_t *victims, int64_t *slots, size_t victims_cap,
                        uint32_t *row_victims, size_t *n_victims)
{
    if (row_victims == NULL)
        return SH_ERR_ARG;
    return step_impl(p, flags, pos, dtype, attn, heads, n, budget, victims, slots,
                     victims_cap, row_victims, n_victims);
}

/* ---------------------------------------------------------------- pools */

/* One evictable slot of a pool, in the order pooled eviction takes them. */
typedef struct pool_slot {
    uint64_t key;
    uint32_t pos;
    uint32_t row;
    uint32_t slot;
} pool_slot;

/* (key, position, row): the order in which a pool's evictable slots go. */
static int pool_slot_before(const pool_slot *a, const pool_slot *b)
{
    if (a->key != b->key)
        return a->key < b->key;
    if (a->pos != b->pos)
        return a->pos < b->pos;
    return a->row < b->row;
}

static void swap_slots(pool_slot *a, pool_slot *b)
{
    pool_slot t = *a;
    *a = *b;
    *b = t;
}

/* Rearranges c[0, m) so that its k least (k < m) come first, in any order: Hoare's
   selection, the pivot the median of three. Every slot differs from every other (no
   two share a row and a position), so each round leaves the pivot in place and the
   expected time is linear. */
static void select_least(pool_slot *c, size_t m, size_t k)
{
    size_t lo = 0, hi = m - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pool_slot_before(&c[mid], &c[lo]))
            swap_slots(&c[mid], &c[lo]);
        if (pool_slot_before(&c[hi], &c[lo]))
            swap_slots(&c[hi], &c[lo]);
        if (pool_slot_before(&c[hi], &c[mid]))
            swap_slots(&c[hi], &c[mid]);
        swap_slots(&c[mid], &c[hi]); /* the median of the three is the pivot, at hi */
        size_t store = lo;
        for (size_t i = lo; i < hi; i++) {
            if (pool_slot_before(&c[i], &c[hi]))
                swap_slots(&c[i], &c[store++]);
        }
        swap_slots(&c[store], &c[hi]); /* the pivot's final place */
        if (store == k)
            return;
        if (store < k)
            lo = store + 1;
        else
            hi = store - 1;
    }
}

/* The evictable slots [lo, hi) of a row holding n: after its sinks, before its recent
   window (empty when the row holds no more than those). */
static void evictable_range(const sh_policy *p, size_t n, size_t *lo, size_t *hi)
{
    size_t l = p->sinks < n ? p->sinks : n;
    size_t rest = n - l;
    *lo = l;
    *hi = rest > p->recent_window ? n - p->recent_window : l;
}

/* Positions pool g holds in all. */
static uint64_t pool_held(const sh_policy *p, size_t g, size_t pool)
{
    uint64_t held = 0;
    for (size_t h = g * pool; h < (g + 1) * pool; h++)
        held += p->counts[h];
    return held;
}

/* Evicts k slots from pool g (rows [g * pool, (g + 1) * pool)): the least (key,
   position, row) of its evictable slots; victims row after row from victims (and
   slots), each row ascending; returns how many were written (k). cand holds room for
   every slot the pool holds. */
static size_t evict_pool(sh_policy *p, size_t g, size_t pool, size_t k, pool_slot *cand,
                         uint32_t *victims, int64_t *slots, uint32_t *row_victims)
{
    size_t m = 0;
    for (size_t h = g * pool; h < (g + 1) * pool; h++) {
        size_t lo, hi;
        evictable_range(p, p->counts[h], &lo, &hi);
        const uint32_t *pos = row_positions(p, h);
        uint8_t *mark = row_scratch(p, h);
        for (size_t i = lo; i < hi; i++) {
            mark[i] = 0;
            cand[m].key = key_at(p, h, i);
            cand[m].pos = pos[i];
            cand[m].row = (uint32_t)h;
            cand[m].slot = (uint32_t)i;
            m++;
        }
    }
    if (k <= 8) {
        /* The steady state (about one victim per row): k passes for the least left. */
        for (size_t j = 0; j < k; j++) {
            size_t best = j;
            for (size_t i = j + 1; i < m; i++) {
                if (pool_slot_before(&cand[i], &cand[best]))
                    best = i;
            }
            pool_slot t = cand[j];
            cand[j] = cand[best];
            cand[best] = t;
        }
    } else if (k < m) {
        select_least(cand, m, k);
    }
    for (size_t j = 0; j < k; j++)
        row_scratch(p, cand[j].row)[cand[j].slot] = 1;
    size_t at = 0;
    for (size_t h = g * pool; h < (g + 1) * pool; h++) {
        size_t n = p->counts[h], lo, hi, kh = 0;
        evictable_range(p, n, &lo, &hi);
        const uint32_t *pos = row_positions(p, h);
        const uint8_t *mark = row_scratch(p, h);
        for (size_t i = lo; i < hi; i++) {
            if (mark[i]) {
                victims[at + kh] = pos[i];
                if (slots != NULL)
                    slots[at + kh] = (int64_t)i;
                kh++;
            }
        }
        if (kh != 0)
            compact_row(p, h, n, lo, hi, mark);
        p->counts[h] = (uint32_t)(n - kh);
        row_victims[h] = (uint32_t)kh;
        at += kh;
    }
    return at;
}

int sh_policy_step_pools(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                         const void *attn, size_t heads, size_t n, uint32_t budget,
                         uint32_t pool, uint32_t *victims, int64_t *slots, size_t victims_cap,
                         uint32_t *row_victims, size_t *n_victims)
{
    if (p == NULL || row_victims == NULL || n_victims == NULL)
        return SH_ERR_ARG;
    if (pool == 1)
        return step_impl(p, flags, pos, dtype, attn, heads, n, budget, victims, slots,
                         victims_cap, row_victims, n_victims);
    if (pool == 0 || p->heads % pool != 0 || p->kind == SH_FULL || p->kind == SH_STREAMING_LLM)
        return SH_ERR_ARG;
    if (flags < 1 || flags > (SH_STEP_ADMIT | SH_STEP_EVICT))
        return SH_ERR_ARG;
    int do_admit = (flags & SH_STEP_ADMIT) != 0;
    int do_evict = (flags & SH_STEP_EVICT) != 0;
    int rc;
    if (do_admit && pos <= p->last_position)
        return SH_ERR_POSITION;
    if (do_evict && (rc = check_budget(p, budget)) != SH_OK)
        return rc;
    size_t pools = p->heads / pool;
    uint64_t share = (uint64_t)pool * budget, total = 0, fullest = 0;
    for (size_t g = 0; g < pools && do_evict; g++) {
        uint64_t held = pool_held(p, g, pool) + (do_admit ? pool : 0);
        if (held > share) {
            total += held - share;
            fullest = held > fullest ? held : fullest;
        }
    }
    if (total != 0 && (victims == NULL || victims_cap < total))
        return SH_ERR_BUFFER;
    pool_slot *cand = NULL;
    if (total != 0) {
        if (fullest > SIZE_MAX / sizeof *cand)
            return SH_ERR_NOMEM;
        cand = malloc((size_t)fullest * sizeof *cand);
        if (cand == NULL)
            return SH_ERR_NOMEM;
    }
    if (do_admit) {
        size_t none;
        /* row_victims given: rows of different counts are the usual case here, and a
           wrong n is SH_ERR_LENGTH as for sh_policy_step_rows (its zeros are rewritten
           below). */
        rc = step_impl(p, SH_STEP_ADMIT, pos, dtype, attn, heads, n, budget, NULL, NULL, 0,
                       row_victims, &none);
        if (rc != SH_OK) {
            free(cand);
            return rc;
        }
    }
    /* Nothing below can fail. */
    size_t at = 0;
    for (size_t g = 0; g < pools; g++) {
        uint64_t held = pool_held(p, g, pool);
        if (do_evict && held > share) {
            at += evict_pool(p, g, pool, (size_t)(held - share), cand, victims + at,
                             slots == NULL ? NULL : slots + at, row_victims);
        } else {
            for (size_t h = g * pool; h < (g + 1) * pool; h++)
                row_victims[h] = 0;
        }
    }
    free(cand);
    *n_victims = at;
    return SH_OK;
}

int sh_noop_step(sh_policy *p, int32_t flags, uint32_t pos, int32_t dtype,
                 const void *attn, size_t heads, size_t n, uint32_t budget,
                 uint32_t *victims, int64_t *slots, size_t victims_cap,
                 size_t *n_victims)
{
    (void)p, (void)flags, (void)pos, (void)dtype, (void)attn, (void)heads, (void)n;
    (void)budget, (void)victims, (void)slots, (void)victims_cap;
    if (n_victims != NULL)
        *n_victims = 0;
    return SH_OK;
}

/* ---------------------------------------------------------------- extend */

/* Whether token i of a chunk joins the row whose admit flags are adm (NULL: all). */
static int joins(const uint8_t *adm, size_t i)
{
    return adm == NULL || adm[i] != 0;
}

/* Checks every weight token i's vote step reads in one row of a chunk: columns
   [0, nh) and nh + j for each token j < i that joined (all of them when !gap). */
static int chunk_weights_valid(int32_t dtype, const char *row, size_t nh, size_t i,
                               const uint8_t *adm, int gap, int simd)
{
    size_t es = dtype_size(dtype);
    if (!gap)
        return weights_valid(dtype, row, nh + i, simd);
    if (!weights_valid(dtype, row, nh, simd))
        return 0;
    for (size_t j = 0; j < i; j++) {
        if (adm[j] && !weights_valid(dtype, row + (nh + j) * es, 1, simd))
            return 0;
    }
    return 1;
}

/* Copies the weights token i reads (columns [0, nh), then nh + j for each token
   j < i that joined) to buf, contiguous and in kept order. */
static void gather_weights(int32_t dtype, const char *row, size_t nh, size_t i,
                             const uint8_t *adm, char *buf)
{
    size_t es = dtype_size(dtype);
    size_t m = nh;
    memcpy(buf, row, nh * es);
    for (size_t j = 0; j < i; j++) {
        if (adm[j])
            memcpy(buf + (m++) * es, row + (nh + j) * es, es);
    }
}

int sh_policy_extend(sh_policy *p, int32_t dtype, const void *attn, size_t heads,
                     size_t chunk, size_t width, const uint8_t *admit)
{
    if (p == NULL || chunk < 1)
        return SH_ERR_ARG;
    int simd = sh_simd_active();
    int fresh = is_fresh(p);
    if (fresh ? chunk - 1 > UINT32_MAX : (uint64_t)p->last_position + chunk > UINT32_MAX)
        return SH_ERR_POSITION;
    int reads = reads_attention(p->kind) && dtype != SH_DTYPE_NONE;
    if (reads && (attn == NULL || (dtype != SH_DTYPE_F32 && dtype != SH_DTYPE_F64)))
        return SH_ERR_ARG;
    if ((reads || admit != NULL) && heads != p->heads)
        return SH_ERR_LENGTH;
    size_t rows = p->heads;
    size_t base = fresh ? 0 : max_count(p);
    if (reads && width != base + chunk)
        return SH_ERR_LENGTH;
    size_t es = dtype_size(dtype);
    int skips = 0; /* some token is left out of some row */
    uint64_t need = 0;
    for (size_t h = 0; h < rows; h++) {
        const uint8_t *adm = admit == NULL ? NULL : admit + h * chunk;
        size_t nh = fresh ? 0 : p->counts[h];
        const char *grid = reads ? (const char *)attn + h * chunk * width * es : NULL;
        int gap = 0;
        uint64_t held = nh;
        for (size_t i = 0; i < chunk; i++) {
            if (!joins(adm, i)) {
                gap = skips = 1; /* it neither votes in this row nor joins it */
                continue;
            }
            if (reads && !chunk_weights_valid(dtype, grid + i * width * es, nh, i, adm, gap, simd))
                return SH_ERR_WEIGHT;
            held++;
        }
        need = held > need ? held : need;
    }
    char *buf = NULL;
    if (reads && skips) {
        buf = malloc(width * es);
        if (buf == NULL)
            return SH_ERR_NOMEM;
    }
    int rc = ensure_capacity(p, need);
    if (rc != SH_OK) {
        free(buf);
        return rc;
    }

    /* Nothing below can fail. */
    uint32_t first = fresh ? 0 : p->last_position + 1;
    for (size_t h = 0; h < rows; h++) {
        const uint8_t *adm = admit == NULL ? NULL : admit + h * chunk;
        size_t nh = fresh ? 0 : p->counts[h];
        const char *grid = reads ? (const char *)attn + h * chunk * width * es : NULL;
        size_t held = nh;
        int gap = 0;
        for (size_t i = 0; i < chunk; i++) {
            if (fresh && i == 0) {
                /* Position 0, held since construction: kept as it is, or dropped. */
                held = joins(adm, 0) ? 1 : 0;
                gap = !joins(adm, 0);
                continue;
            }
            if (!joins(adm, i)) {
                gap = 1;
                continue;
            }
            if (reads && held != 0) {
                const char *row = grid + i * width * es;
                if (gap)
                    gather_weights(dtype, row, nh, i, adm, buf);
                update_row(p, h, dtype, gap ? buf : row, held, 0, 0, simd);
            }
            put_slot(p, h, held++, (uint32_t)(first + i));
        }
        p->counts[h] = (uint32_t)held;
    }
    p->last_position = (uint32_t)(first + chunk - 1);
    free(buf);
    return SH_OK;
}

int sh_policy_prefill(sh_policy *p, int32_t dtype, const void *attn, size_t heads,
                      size_t prompt_len)
{
    if (p == NULL || prompt_len < 1)
        return SH_ERR_ARG;
    if (!is_fresh(p))
        return SH_ERR_STATE;
    return sh_policy_extend(p, dtype, attn, heads, prompt_len, prompt_len, NULL);
}

/* ---------------------------------------------------------------- rows */

int sh_policy_select_rows(sh_policy *p, const uint32_t *index, size_t rows)
{
    if (p == NULL || index == NULL || rows < 1 || rows > SH_MAX_HEADS)
        return SH_ERR_ARG;
    for (size_t r = 0; r < rows; r++) {
        if (index[r] >= p->heads)
            return SH_ERR_ARG;
    }
    storage s;
    int rc = storage_alloc(&s, p->kind, p->history != NULL, p->vote_rate, rows, p->capacity);
    if (rc != SH_OK)
        return rc;
    uint32_t *counts = NULL;
    if (rows > 1) {
        counts = malloc(rows * sizeof *counts);
        if (counts == NULL) {
            storage_free(&s);
            return SH_ERR_NOMEM;
        }
    }

    /* Nothing below can fail. */
    uint32_t only = p->counts[index[0]];
    for (size_t r = 0; r < rows; r++) {
        copy_row(p, index[r], &s, rows, p->capacity, r);
        if (counts != NULL)
            counts[r] = p->counts[index[r]];
    }
    storage_install(p, &s);
    if (p->counts != &p->count)
        free(p->counts);
    p->heads = (uint32_t)rows;
    p->count = only;
    p->counts = counts != NULL ? counts : &p->count;
    return SH_OK;
}

/* ---------------------------------------------------------------- state */

/* Copies the held slots of every row of a per-slot array (row h at base + h *
   capacity elements of size bytes) out to dst, row after row. */
static void copy_rows_out(const sh_policy *p, void *dst, const void *base, size_t size)
{
    size_t at = 0;
    for (size_t h = 0; h < p->heads; h++) {
        size_t n = p->counts[h];
        memcpy((char *)dst + at * size, (const char *)base + h * p->capacity * size, n * size);
        at += n;
    }
}

int sh_policy_export(const sh_policy *p, uint32_t *positions, uint32_t *votes,
                     double *scores, size_t cap)
{
    if (p == NULL)
        return SH_ERR_ARG;
    if (cap < total_count(p))
        return SH_ERR_BUFFER;
    if (positions != NULL)
        copy_rows_out(p, positions, p->positions, sizeof *positions);
    if (votes != NULL && p->kind == SH_SCISSORHANDS)
        copy_rows_out(p, votes, p->values, sizeof *votes);
    if (scores != NULL && has_scores(p->kind))
        copy_rows_out(p, scores, p->values, sizeof *scores);
    return SH_OK;
}

int sh_policy_export_row(const sh_policy *p, size_t head, uint32_t *positions, size_t cap)
{
    if (p == NULL || positions == NULL || head >= p->heads)
        return SH_ERR_ARG;
    if (cap < p->counts[head])
        return SH_ERR_BUFFER;
    memcpy(positions, row_positions(p, head), p->counts[head] * sizeof *positions);
    return SH_OK;
}

int sh_policy_export_history(const sh_policy *p, uint64_t *history, size_t cap)
{
    if (p == NULL || history == NULL)
        return SH_ERR_ARG;
    if (p->history == NULL)
        return SH_ERR_STATE;
    if (cap < total_count(p))
        return SH_ERR_BUFFER;
    copy_rows_out(p, history, p->history, sizeof *history);
    return SH_OK;
}

int sh_policy_export_held(const sh_policy *p, uint32_t *held, size_t cap)
{
    if (p == NULL || held == NULL)
        return SH_ERR_ARG;
    if (!p->vote_rate)
        return SH_ERR_STATE;
    if (cap < total_count(p))
        return SH_ERR_BUFFER;
    copy_rows_out(p, held, row_held(p, 0), sizeof *held);
    return SH_OK;
}

/* The work of both imports: row h holds counts[h] positions, or n each when counts
   is NULL; the arrays hold the rows one after another. */
static int import_rows(sh_policy *p, size_t heads, const uint32_t *counts, size_t n,
                       const uint32_t *positions, const uint32_t *votes,
                       const double *scores, const uint64_t *history,
                       const uint32_t *held, uint32_t last_position)
{
    if (p == NULL || positions == NULL)
        return SH_ERR_ARG;
    if ((history != NULL) != (p->history != NULL) || (held != NULL) != (p->vote_rate != 0))
        return SH_ERR_ARG;
    if (heads != p->heads)
        return SH_ERR_LENGTH;
    if (p->kind == SH_SCISSORHANDS && votes == NULL)
        return SH_ERR_ARG;
    if (has_scores(p->kind) && scores == NULL)
        return SH_ERR_ARG;
    uint64_t need = n;
    if (counts != NULL) {
        need = 0;
        for (size_t h = 0; h < heads; h++)
            need = counts[h] > need ? counts[h] : need;
    }
    int rc = ensure_capacity(p, need);
    if (rc != SH_OK)
        return rc;

    /* Nothing below can fail. */
    size_t at = 0;
    for (size_t h = 0; h < heads; h++) {
        size_t c = counts != NULL ? counts[h] : n;
        memcpy(row_positions(p, h), positions + at, c * sizeof *positions);
        if (p->kind == SH_SCISSORHANDS)
            memcpy(row_votes(p, h), votes + at, c * sizeof *votes);
        else if (has_scores(p->kind))
            memcpy(row_scores(p, h), scores + at, c * sizeof *scores);
        if (history != NULL)
            memcpy(row_history(p, h), history + at, c * sizeof *history);
        if (held != NULL)
            memcpy(row_held(p, h), held + at, c * sizeof *held);
        p->counts[h] = (uint32_t)c;
        at += c;
    }
    p->last_position = last_position;
    return SH_OK;
}

int sh_policy_import_state(sh_policy *p, size_t heads, size_t n,
                           const uint32_t *positions, const uint32_t *votes,
                           const double *scores, const uint64_t *history,
                           const uint32_t *held, uint32_t last_position)
{
    if (p == NULL || positions == NULL)
        return SH_ERR_ARG;
    if ((history != NULL) != (p->history != NULL) || (held != NULL) != (p->vote_rate != 0))
        return SH_ERR_ARG;
    if (heads != p->heads)
        return SH_ERR_LENGTH;
    if (n < 1 || n > UINT32_MAX)
        return SH_ERR_STATE;
    return import_rows(p, heads, NULL, n, positions, votes, scores, history, held,
                       last_position);
}

int sh_policy_import_rows(sh_policy *p, size_t heads, const uint32_t *counts,
                          const uint32_t *positions, const uint32_t *votes,
                          const double *scores, const uint64_t *history,
                          const uint32_t *held, uint32_t last_position)
{
    if (counts == NULL)
        return SH_ERR_ARG;
    return import_rows(p, heads, counts, 0, positions, votes, scores, history, held,
                       last_position);
}

int64_t sh_policy_find(const sh_policy *p, size_t head, uint32_t pos)
{
    if (p == NULL || head >= p->heads)
        return -1;
    const uint32_t *row = row_positions(p, head);
    size_t lo = 0, hi = p->counts[head];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (row[mid] < pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < p->counts[head] && row[lo] == pos) ? (int64_t)lo : -1;
}

int64_t sh_policy_votes_of(const sh_policy *p, size_t head, uint32_t pos)
{
    int64_t i = sh_policy_find(p, head, pos);
    if (i < 0 || p->kind != SH_SCISSORHANDS)
        return -1;
    return row_votes(p, head)[i];
}

double sh_policy_score_of(const sh_policy *p, size_t head, uint32_t pos)
{
    int64_t i = sh_policy_find(p, head, pos);
    if (i < 0 || !has_scores(p->kind))
        return -1.0;
    return row_scores(p, head)[i];
}
