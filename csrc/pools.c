/*
 * pools.c - sh_policy_step_pools: rows sharing one budget per pool (Ada-KV, Feng et
 * al., 2024, arXiv 2407.11550).
 *
 * Rows [g * pool, (g + 1) * pool) hold at most pool * budget positions in all. The
 * admission goes through sh_step (step.c); then each pool over its share evicts the
 * excess: the least (key, position, row) among its rows' evictable slots, the key
 * being what the kind's eviction ranks by (sh_key_at). The candidates go to a
 * scratch of 24 bytes per held slot of the fullest pool, allocated before anything
 * changes; k passes pick them for k <= 8 victims, Hoare's selection beyond.
 */
#include <stdlib.h>

#include "sh_internal.h"

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

/* Puts the k least of c[0, m) first: k passes for the least left when k <= 8 (the
   steady state, about one victim per row), else Hoare's selection. */
static void pick_least(pool_slot *c, size_t m, size_t k)
{
    if (k > 8) {
        if (k < m)
            select_least(c, m, k);
        return;
    }
    for (size_t j = 0; j < k; j++) {
        size_t best = j;
        for (size_t i = j + 1; i < m; i++) {
            if (pool_slot_before(&c[i], &c[best]))
                best = i;
        }
        swap_slots(&c[j], &c[best]);
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

/* Writes pool g's evictable slots to cand, pinned ones left out (clearing every
   scratch mark of the range); returns how many. */
static size_t gather_candidates(const sh_kind_ops *ops, sh_policy *p, size_t g, size_t pool,
                                pool_slot *cand)
{
    size_t m = 0;
    for (size_t h = g * pool; h < (g + 1) * pool; h++) {
        size_t lo, hi;
        evictable_range(p, p->counts[h], &lo, &hi);
        const uint32_t *pos = sh_row_positions(p, h);
        uint8_t *mark = sh_row_scratch(ops, p, h);
        for (size_t i = lo; i < hi; i++) {
            mark[i] = 0;
            if (p->pins != NULL && sh_is_pinned(p, pos[i]))
                continue;
            cand[m].key = sh_key_at(ops, p, h, i);
            cand[m].pos = pos[i];
            cand[m].row = (uint32_t)h;
            cand[m].slot = (uint32_t)i;
            m++;
        }
    }
    return m;
}

/* Evicts the marked slots of pool g's rows: victims row after row from victims (and
   slots), each row ascending, each row's count to row_victims; returns how many. */
static size_t take_marked_rows(const sh_kind_ops *ops, sh_policy *p, size_t g, size_t pool,
                               uint32_t *victims, int64_t *slots, uint32_t *row_victims)
{
    size_t at = 0;
    for (size_t h = g * pool; h < (g + 1) * pool; h++) {
        size_t n = p->counts[h], lo, hi, kh = 0;
        evictable_range(p, n, &lo, &hi);
        const uint32_t *pos = sh_row_positions(p, h);
        const uint8_t *mark = sh_row_scratch(ops, p, h);
        for (size_t i = lo; i < hi; i++) {
            if (mark[i]) {
                victims[at + kh] = pos[i];
                if (slots != NULL)
                    slots[at + kh] = (int64_t)i;
                kh++;
            }
        }
        if (kh != 0)
            sh_compact_row(ops, p, h, n, lo, hi, mark);
        p->counts[h] = (uint32_t)(n - kh);
        row_victims[h] = (uint32_t)kh;
        at += kh;
    }
    return at;
}

/* Evicts k slots from pool g (rows [g * pool, (g + 1) * pool)): the least (key,
   position, row) of its evictable slots; returns how many were written (k). cand
   holds room for every slot the pool holds. */
static size_t evict_pool(sh_policy *p, size_t g, size_t pool, size_t k, pool_slot *cand,
                         uint32_t *victims, int64_t *slots, uint32_t *row_victims)
{
    const sh_kind_ops *ops = sh_ops(p);
    size_t m = gather_candidates(ops, p, g, pool, cand);
    pick_least(cand, m, k);
    for (size_t j = 0; j < k; j++)
        sh_row_scratch(ops, p, cand[j].row)[cand[j].slot] = 1;
    return take_marked_rows(ops, p, g, pool, victims, slots, row_victims);
}

/* The victims all pools take after the admission (*total), and the most positions a
   pool over its share holds then (*fullest): the scratch's size. */
static void count_pool_victims(const sh_policy *p, size_t pool, uint32_t budget, int admit,
                               uint64_t *total, uint64_t *fullest)
{
    uint64_t share = (uint64_t)pool * budget;
    *total = *fullest = 0;
    for (size_t g = 0; g < p->heads / pool; g++) {
        uint64_t held = pool_held(p, g, pool) + (admit ? pool : 0);
        if (held > share) {
            *total += held - share;
            *fullest = held > *fullest ? held : *fullest;
        }
    }
}

/* Evicts every pool's excess over pool * budget; returns the victims written. */
static size_t evict_pools(sh_policy *p, size_t pool, uint32_t budget, int evict,
                          pool_slot *cand, uint32_t *victims, int64_t *slots,
                          uint32_t *row_victims)
{
    uint64_t share = (uint64_t)pool * budget;
    size_t at = 0;
    for (size_t g = 0; g < p->heads / pool; g++) {
        uint64_t held = pool_held(p, g, pool);
        if (evict && held > share) {
            at += evict_pool(p, g, pool, (size_t)(held - share), cand, victims + at,
                             slots == NULL ? NULL : slots + at, row_victims);
        } else {
            for (size_t h = g * pool; h < (g + 1) * pool; h++)
                row_victims[h] = 0;
        }
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
        return sh_step(p, flags, pos, dtype, attn, heads, n, budget, victims, slots,
                       victims_cap, row_victims, n_victims, 0);
    if (pool == 0 || p->heads % pool != 0 || sh_ops(p)->values == SH_VALUES_NONE)
        return SH_ERR_ARG;
    int rc = sh_check_step(p, flags, pos, budget);
    if (rc != SH_OK)
        return rc;
    int admit = (flags & SH_STEP_ADMIT) != 0, evict = (flags & SH_STEP_EVICT) != 0;
    uint64_t total = 0, fullest = 0;
    if (evict)
        count_pool_victims(p, pool, budget, admit, &total, &fullest);
    if (total != 0 && budget < p->budget
        && (rc = sh_check_pool_pins(p, pool, admit, pos, budget)) != SH_OK)
        return rc;
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
    if (admit) {
        size_t none;
        /* row_victims given: rows of different counts are the usual case here, and a
           wrong n is SH_ERR_LENGTH as for sh_policy_step_rows (its zeros are rewritten
           below). */
        rc = sh_step(p, SH_STEP_ADMIT, pos, dtype, attn, heads, n, budget, NULL, NULL, 0,
                     row_victims, &none, 0);
        if (rc != SH_OK) {
            free(cand);
            return rc;
        }
    }
    /* Nothing below can fail. */
    *n_victims = evict_pools(p, pool, budget, evict, cand, victims, slots, row_victims);
    free(cand);
    return SH_OK;
}
