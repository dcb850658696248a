/*
 * observe.c - sh_policy_evict_observed: eviction by an observation window's attention
 * (SnapKV, Li et al., 2024, arXiv 2404.14469), the same rule for every kind.
 *
 * A row's last W held slots are the window's own tokens; each gives weights over the
 * slots before it. A slot's score is the sum of those weights over the window's rows,
 * in row order, in double; its pooled score the largest score within pool_kernel / 2
 * slots either side (clipped at the row's ends). A row over budget evicts the least
 * pooled scores among its unprotected slots (observe_protected: the sinks, the
 * window and the pinned positions), equal keys the lower slot, through the radix selection of select.c. The
 * kind's own votes, scores and registers are read by nothing and kept by survivors.
 *
 * Everything is checked for every row before any row changes; the scratch (22 bytes
 * per slot of the fullest evicting row) is allocated once per call, before anything
 * changes, as pools.c allocates its own.
 */
#include <stdlib.h>
#include <string.h>

#include "sh_internal.h"

/* Scratch bytes per slot: score, pooled score (doubles), a slot index, two marks. */
#define OBSERVE_SLOT_BYTES (2 * sizeof(double) + sizeof(uint32_t) + 2)

/* One call's arguments, read by every row. */
typedef struct observe_call {
    sh_policy *p;
    const sh_kind_ops *ops;
    int32_t dtype;
    const char *attn; /* heads * window * width weights */
    size_t es;        /* bytes per weight */
    size_t window;
    size_t width;     /* the largest count: weights per window row */
    uint32_t budget;
    size_t radius;    /* pool_kernel / 2 */
    int simd;
} observe_call;

/* The scratch of one row, carved from the call's block. */
typedef struct observe_scratch {
    double *score;   /* the window scores; then the candidates' pooled scores */
    double *pooled;  /* the pooled scores, per slot */
    uint32_t *index; /* the max-pool's queue; then the candidates' slots */
    uint8_t *least;  /* per candidate: chosen to go */
    uint8_t *gone;   /* per slot: a victim (for the compaction) */
} observe_scratch;

/* Whether slot i of row h, which holds n, is never evicted by this rule: one of the
   first min(sinks, n) or of the last min(window, n) (the window's own), or a pinned
   position (pins.c). */
static int observe_protected(const observe_call *c, size_t h, size_t i, size_t n)
{
    size_t sinks = c->p->sinks < n ? c->p->sinks : n;
    size_t window = c->window < n ? c->window : n;
    if (i < sinks || i >= n - window)
        return 1;
    return c->p->pins != NULL && sh_is_pinned(c->p, sh_row_positions(c->p, h)[i]);
}

/* Slots of row h (holding n) the rule may evict. */
static size_t observe_candidates(const observe_call *c, size_t h, size_t n)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += (size_t)!observe_protected(c, h, i, n);
    return m;
}

/* Window row j of row h: its weights, over the row's slots in kept order. */
static const char *window_row(const observe_call *c, size_t h, size_t j)
{
    return c->attn + (h * c->window + j) * c->width * c->es;
}

/* The slots window row j of a row holding n reads: those before slot n - window + j
   (none when that is not above 0). */
static size_t window_reads(const observe_call *c, size_t n, size_t j)
{
    return n + j > c->window ? n + j - c->window : 0;
}

/* Every row's evictions (to row_victims), their sum and the fullest evicting row, or
   the first refusal: a row with fewer candidates than it must evict (SH_ERR_BUDGET),
   then a read weight that is NaN, infinite or negative (SH_ERR_WEIGHT). */
static int observe_check(const observe_call *c, uint32_t *row_victims, size_t *total,
                         size_t *fullest)
{
    const sh_policy *p = c->p;
    *total = 0;
    *fullest = 0;
    for (size_t h = 0; h < p->heads; h++) {
        size_t n = p->counts[h];
        size_t k = n > c->budget ? n - c->budget : 0;
        if (k > observe_candidates(c, h, n))
            return SH_ERR_BUDGET;
        row_victims[h] = (uint32_t)k;
        *total += k;
        if (k > 0 && n > *fullest)
            *fullest = n;
    }
    for (size_t h = 0; h < p->heads; h++) {
        size_t n = p->counts[h];
        for (size_t j = 0; j < c->window; j++) {
            if (!sh_weights_valid(c->dtype, window_row(c, h, j), window_reads(c, n, j), c->simd))
                return SH_ERR_WEIGHT;
        }
    }
    return SH_OK;
}

/* score[i] of row h (holding n): the sum over window rows j ascending of their weight
   on slot i, in double, starting from +0.0. */
static void window_scores(const observe_call *c, size_t h, size_t n, double *score)
{
    for (size_t i = 0; i < n; i++)
        score[i] = 0.0;
    for (size_t j = 0; j < c->window; j++) {
        size_t t = window_reads(c, n, j);
        const void *row = window_row(c, h, j);
        if (c->dtype == SH_DTYPE_F32) {
            const float *w = row;
            for (size_t i = 0; i < t; i++)
                score[i] += (double)w[i];
        } else {
            const double *w = row;
            for (size_t i = 0; i < t; i++)
                score[i] += w[i];
        }
    }
}

/* pooled[i] = the largest score[k], k in [i - r, i + r] within [0, n): a queue of
   slots of decreasing score (O(n)). */
static void max_pool(const double *score, size_t n, size_t r, double *pooled, uint32_t *queue)
{
    size_t first = 0, end = 0, next = 0;
    for (size_t i = 0; i < n; i++) {
        size_t right = r < n - 1 - i ? i + r : n - 1;
        for (; next <= right; next++) {
            while (end > first && score[queue[end - 1]] <= score[next])
                end--;
            queue[end++] = (uint32_t)next;
        }
        while (queue[first] + r < i)
            first++;
        pooled[i] = score[queue[first]];
    }
}

/* Removes the slots marked in gone[lo, hi) from row h (holding n), keeping the order of
   the rest: through sh_compact_row for kinds with values, positions alone otherwise. */
static void observe_compact(const observe_call *c, size_t h, size_t n, size_t lo, size_t hi,
                            const uint8_t *gone)
{
    if (c->ops->values != SH_VALUES_NONE) {
        sh_compact_row(c->ops, c->p, h, n, lo, hi, gone);
        return;
    }
    uint32_t *pos = sh_row_positions(c->p, h);
    size_t w = lo;
    for (size_t i = lo; i < n; i++) {
        if (i >= hi || !gone[i])
            pos[w++] = pos[i];
    }
}

/* Evicts the k (>= 1, at most the candidates) least pooled candidates of row h (holding
   n): victims ascending (and their slots), the row compacted. */
static void observe_row(const observe_call *c, size_t h, size_t n, size_t k,
                        const observe_scratch *s, uint32_t *victims, int64_t *slots)
{
    window_scores(c, h, n, s->score);
    max_pool(s->score, n, c->radius, s->pooled, s->index);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!observe_protected(c, h, i, n)) {
            s->score[m] = s->pooled[i]; /* m <= i: the score of slot i is no longer read */
            s->index[m++] = (uint32_t)i;
        }
    }
    sh_mark_least_f64(s->score, m, k, s->least, c->simd);
    const uint32_t *pos = sh_row_positions(c->p, h);
    size_t j = 0, lo = n, hi = 0;
    memset(s->gone, 0, n);
    for (size_t q = 0; q < m; q++) {
        if (!s->least[q])
            continue;
        size_t i = s->index[q];
        victims[j] = pos[i];
        if (slots != NULL)
            slots[j] = (int64_t)i;
        j++;
        s->gone[i] = 1;
        lo = i < lo ? i : lo;
        hi = i + 1;
    }
    observe_compact(c, h, n, lo, hi, s->gone);
    c->p->counts[h] = (uint32_t)(n - k);
}

/* Every row's evictions, once everything is checked and the scratch is had. */
static void observe_rows(const observe_call *c, const uint32_t *row_victims, char *block,
                         size_t fullest, uint32_t *victims, int64_t *slots)
{
    observe_scratch s;
    s.score = (double *)(void *)block;
    s.pooled = s.score + fullest;
    s.index = (uint32_t *)(void *)(s.pooled + fullest);
    s.least = (uint8_t *)(s.index + fullest);
    s.gone = s.least + fullest;
    size_t at = 0;
    for (size_t h = 0; h < c->p->heads; h++) {
        size_t k = row_victims[h];
        if (k == 0)
            continue;
        observe_row(c, h, c->p->counts[h], k, &s, victims + at, slots != NULL ? slots + at : NULL);
        at += k;
    }
}

int sh_policy_evict_observed(sh_policy *p, int32_t dtype, const void *attn, size_t heads,
                             size_t window, size_t n, uint32_t budget, uint32_t pool_kernel,
                             uint32_t *victims, int64_t *slots, size_t victims_cap,
                             uint32_t *row_victims, size_t *n_victims)
{
    if (p == NULL || row_victims == NULL || n_victims == NULL || window == 0
        || pool_kernel % 2 == 0)
        return SH_ERR_ARG;
    const sh_kind_ops *ops = sh_ops(p);
    if (ops->evict != NULL && (attn == NULL || (dtype != SH_DTYPE_F32 && dtype != SH_DTYPE_F64)))
        return SH_ERR_ARG;
    if (heads != p->heads || n != sh_max_count(p))
        return SH_ERR_LENGTH;
    if (budget == 0)
        return SH_ERR_BUDGET;
    *n_victims = 0;
    if (ops->evict == NULL) { /* never evicts: the shape was all there was to check */
        memset(row_victims, 0, heads * sizeof *row_victims);
        return SH_OK;
    }
    observe_call c = { p, ops, dtype, attn, sh_dtype_size(dtype), window, n, budget,
                       pool_kernel / 2, sh_simd_active() };
    size_t total, fullest;
    int rc = observe_check(&c, row_victims, &total, &fullest);
    if (rc != SH_OK)
        return rc;
    if (total > victims_cap)
        return SH_ERR_BUFFER;
    if (total == 0)
        return SH_OK;
    if (victims == NULL)
        return SH_ERR_ARG;
    char *block = malloc(fullest * OBSERVE_SLOT_BYTES);
    if (block == NULL)
        return SH_ERR_NOMEM;
    observe_rows(&c, row_victims, block, fullest, victims, slots);
    free(block);
    *n_victims = total;
    return SH_OK;
}
