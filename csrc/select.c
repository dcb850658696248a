/*
 * select.c - eviction by key, the sh_evict_fn of every kind with per-slot values
 * (votes or float64 scores, policies/): the k slots of least key among a row's
 * evictable ones leave, equal keys evicting the lower slot, the victims ascending,
 * the survivors compacted in order.
 *
 * One victim (the steady state) is the first minimum. More are found in O(count)
 * time: a byte-at-a-time radix select finds the k-th smallest key, then one pass
 * takes every key below that threshold and the lowest slots at it, compacting the
 * survivors. Where the key is the stored value (votes, or a score's bits) each pass
 * is a kernel (kernels.c, simd.c); with a vote rate the key is computed per slot
 * (sh_key_at) and the row's scratch byte per slot marks the candidates.
 *
 * The kind's operations come as an argument (this file is below the policies and
 * their table).
 */
#include <string.h>

#include "sh_internal.h"

/* ---------------------------------------------------------------- key kernels */

/* The largest key of [lo, hi) (hi > lo) where the key is the stored value. */
static uint64_t value_max(const sh_kind_ops *ops, const sh_policy *p, size_t h, size_t lo,
                          size_t hi, int simd)
{
    if (ops->values == SH_VALUES_U32)
        return SH_KERNEL(simd, max_u32)(sh_row_votes(p, h), lo, hi);
    return SH_KERNEL(simd, max_f64_bits)(sh_row_scores(p, h), lo, hi);
}

/* One radix pass over the stored values of [lo, hi) (see sh_hist_u32). */
static void value_hist(const sh_kind_ops *ops, const sh_policy *p, size_t h, size_t lo,
                       size_t hi, uint64_t mask, uint64_t prefix, unsigned shift,
                       size_t hist[256], int simd)
{
    if (ops->values == SH_VALUES_U32)
        SH_KERNEL(simd, hist_u32)(sh_row_votes(p, h), lo, hi, (uint32_t)mask, (uint32_t)prefix,
                                  shift, hist);
    else
        SH_KERNEL(simd, hist_f64_bits)(sh_row_scores(p, h), lo, hi, mask, prefix, shift, hist);
}

/* The bulk selection's last pass over a plain row (see sh_take_u32). */
static void value_take(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n, size_t lo,
                       size_t hi, uint64_t mask, uint64_t prefix, size_t need,
                       uint32_t *victims, int64_t *slots, int simd)
{
    uint32_t *pos = sh_row_positions(p, h);
    if (ops->values == SH_VALUES_U32)
        SH_KERNEL(simd, take_u32)(pos, sh_row_votes(p, h), n, lo, hi, (uint32_t)mask,
                                  (uint32_t)prefix, need, victims, slots);
    else
        SH_KERNEL(simd, take_f64)(pos, sh_row_scores(p, h), n, lo, hi, mask, prefix, need,
                                  victims, slots);
}

/* The first slot of [lo, hi) holding the least key (hi > lo). */
static size_t first_minimum(const sh_kind_ops *ops, const sh_policy *p, size_t h, size_t lo,
                            size_t hi, int simd)
{
    if (p->vote_rate) {
        size_t at = lo;
        double least = sh_rate_at(p, h, lo);
        for (size_t i = lo + 1; i < hi; i++) {
            double r = sh_rate_at(p, h, i);
            if (r < least) {
                least = r;
                at = i;
            }
        }
        return at;
    }
    if (ops->values == SH_VALUES_U32)
        return SH_KERNEL(simd, least_u32)(sh_row_votes(p, h), lo, hi);
    return SH_KERNEL(simd, least_f64)(sh_row_scores(p, h), lo, hi);
}

/* ---------------------------------------------------------------- radix select */

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

/* A key of [lo, hi) with the top set bit of the largest: the largest stored value,
   or (computed keys) the or of the keys of the candidates, the slots the caller marked
   1 in the scratch. */
static uint64_t top_key(const sh_kind_ops *ops, const sh_policy *p, size_t h, size_t lo,
                        size_t hi, int computed, int simd)
{
    if (!computed)
        return value_max(ops, p, h, lo, hi, simd);
    const uint8_t *mark = sh_row_scratch(ops, p, h);
    uint64_t all = 0;
    for (size_t i = lo; i < hi; i++) {
        if (mark[i] == 1)
            all |= sh_key_at(ops, p, h, i);
    }
    return all;
}

/* One radix pass over the candidates of [lo, hi): their keys that agree with prefix
   on the bytes already chosen (mask), counted by the byte at shift; a computed key's
   slot that disagrees stops being a candidate (its mark 1 becomes 0). */
static void key_hist(const sh_kind_ops *ops, const sh_policy *p, size_t h, size_t lo,
                     size_t hi, uint64_t mask, uint64_t prefix, unsigned shift,
                     size_t hist[256], int computed, int simd)
{
    if (!computed) {
        value_hist(ops, p, h, lo, hi, mask, prefix, shift, hist, simd);
        return;
    }
    uint8_t *mark = sh_row_scratch(ops, p, h);
    for (size_t i = lo; i < hi; i++) {
        if (mark[i] == 1) {
            uint64_t key = sh_key_at(ops, p, h, i);
            if ((key & mask) != prefix)
                mark[i] = 0;
            else
                hist[(key >> shift) & 0xff]++;
        }
    }
}

/* Finds the k-th smallest key among the candidates of slots [lo, hi) of row h (every
   slot, or with computed keys those marked 1) as a (prefix, mask) pair: the victims
   are every candidate whose masked key is below prefix, then the lowest *need
   candidates whose masked key equals it. Requires 1 <= k <= the candidates. */
static void radix_select(const sh_kind_ops *ops, const sh_policy *p, size_t h, size_t lo,
                         size_t hi, size_t k, uint64_t *prefix_out, uint64_t *mask_out,
                         size_t *need, int computed, int simd)
{
    unsigned shift = top_byte_shift(top_key(ops, p, h, lo, hi, computed, simd));
    uint64_t prefix = 0, mask = 0;
    *need = k;
    for (;; shift -= 8) {
        size_t hist[256] = { 0 };
        key_hist(ops, p, h, lo, hi, mask, prefix, shift, hist, computed, simd);
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

/* ---------------------------------------------------------------- loose keys */

void sh_mark_least_f64(const double *keys, size_t m, size_t k, uint8_t *mark, int simd)
{
    /* The radix select of radix_select over an array of its own: the threshold
       (prefix, mask) and the `need` lowest indices at it. */
    unsigned shift = top_byte_shift(SH_KERNEL(simd, max_f64_bits)(keys, 0, m));
    uint64_t prefix = 0, mask = 0;
    size_t need = k;
    for (;; shift -= 8) {
        size_t hist[256] = { 0 };
        SH_KERNEL(simd, hist_f64_bits)(keys, 0, m, mask, prefix, shift, hist);
        unsigned b = pick_bucket(hist, &need);
        prefix |= (uint64_t)b << shift;
        mask |= (uint64_t)0xff << shift;
        if (hist[b] == need || shift == 0)
            break;
    }
    for (size_t i = 0; i < m; i++) {
        uint64_t masked = sh_h2o_key(keys, i) & mask;
        int least = masked < prefix || (masked == prefix && need > 0);
        if (least && masked == prefix)
            need--;
        mark[i] = (uint8_t)least;
    }
}

/* ---------------------------------------------------------------- compaction */

/* Moves m slots of row h from i down to w in every per-slot array. */
static void move_slots(sh_policy *p, size_t h, char *vals, size_t vb, size_t w, size_t i,
                       size_t m)
{
    uint32_t *pos = sh_row_positions(p, h);
    memmove(pos + w, pos + i, m * sizeof *pos);
    memmove(vals + w * vb, vals + i * vb, m * vb);
    if (sh_has_history(p)) {
        uint64_t *hist = sh_row_history(p, h);
        memmove(hist + w, hist + i, m * sizeof *hist);
    }
    if (p->vote_rate) {
        uint32_t *held = sh_row_held(p, h);
        memmove(held + w, held + i, m * sizeof *held);
    }
}

void sh_compact_row(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n, size_t lo,
                    size_t hi, const uint8_t *mark)
{
    size_t vb = sh_value_bytes(ops);
    char *vals = (char *)p->values + h * p->capacity * vb;
    if (hi == lo + 1) {
        move_slots(p, h, vals, vb, lo, lo + 1, n - lo - 1);
        return;
    }
    /* One memmove per array per run of survivors. */
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
        if (w != i)
            move_slots(p, h, vals, vb, w, i, run - i);
        w += run - i;
        i = run;
    }
}

/* ---------------------------------------------------------------- eviction */

/* The last pass with computed keys: marks the victims of [lo, hi) (every masked key
   below prefix, then the lowest `need` at it; with pinned, never a slot marked 2),
   writes them ascending, compacts. */
static void take_marked(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n, size_t lo,
                        size_t hi, uint64_t mask, uint64_t prefix, size_t need, int pinned,
                        uint32_t *victims, int64_t *slots)
{
    const uint32_t *pos = sh_row_positions(p, h);
    uint8_t *mark = sh_row_scratch(ops, p, h);
    size_t j = 0;
    for (size_t i = lo; i < hi; i++) {
        if (pinned && mark[i] == 2) {
            mark[i] = 0;
            continue;
        }
        uint64_t masked = sh_key_at(ops, p, h, i) & mask;
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
    sh_compact_row(ops, p, h, n, lo, hi, mark);
}

/* Writes slot i of row h as the only victim and closes its gap. */
static void take_one(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n, size_t i,
                     uint32_t *victims, int64_t *slots)
{
    victims[0] = sh_row_positions(p, h)[i];
    if (slots != NULL)
        slots[0] = (int64_t)i;
    sh_compact_row(ops, p, h, n, i, i + 1, NULL);
}

/* Evicts the k least-keyed slots of [lo, hi) from row h, which holds n slots (ties:
   the lower slot), writing the victims ascending (and their slots), then compacting
   the row. */
static void evict_range(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n, size_t lo,
                        size_t hi, size_t k, uint32_t *victims, int64_t *slots, int simd)
{
    if (k == 1) {
        /* The steady state: one victim, the first minimum. */
        take_one(ops, p, h, n, first_minimum(ops, p, h, lo, hi, simd), victims, slots);
        return;
    }
    uint64_t prefix, mask;
    size_t need;
    if (p->vote_rate)
        memset(sh_row_scratch(ops, p, h) + lo, 1, hi - lo);
    radix_select(ops, p, h, lo, hi, k, &prefix, &mask, &need, p->vote_rate, simd);
    if (sh_plain_values(ops, p)) {
        /* Positions and one value array: take and compact in one pass. */
        value_take(ops, p, h, n, lo, hi, mask, prefix, need, victims, slots, simd);
        return;
    }
    take_marked(ops, p, h, n, lo, hi, mask, prefix, need, 0, victims, slots);
}

/* The first slot of least key among the unpinned slots of [lo, hi) (some exist): the
   first minimum of each run of unpinned slots, the earliest of the least. */
static size_t first_unpinned_minimum(const sh_kind_ops *ops, const sh_policy *p, size_t h,
                                     size_t lo, size_t hi, int simd)
{
    size_t best = hi;
    uint64_t least = 0;
    while (lo < hi) {
        size_t end, at = sh_next_pinned(p, h, lo, hi, &end);
        if (at > lo) {
            size_t i = first_minimum(ops, p, h, lo, at, simd);
            uint64_t key = sh_key_at(ops, p, h, i);
            if (best == hi || key < least) {
                best = i;
                least = key;
            }
        }
        lo = end;
    }
    return best;
}

/* evict_range for a range holding pinned slots, which stay: the runs between them
   give the one victim; more come from the radix selection over computed keys, the
   pinned slots marked 2 in the scratch. */
static void evict_around_pins(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n,
                              size_t lo, size_t hi, size_t k, uint32_t *victims,
                              int64_t *slots, int simd)
{
    if (k == 1) {
        take_one(ops, p, h, n, first_unpinned_minimum(ops, p, h, lo, hi, simd), victims, slots);
        return;
    }
    uint64_t prefix, mask;
    size_t need;
    sh_mark_pinned(p, h, lo, hi, sh_row_scratch(ops, p, h));
    radix_select(ops, p, h, lo, hi, k, &prefix, &mask, &need, 1, simd);
    take_marked(ops, p, h, n, lo, hi, mask, prefix, need, 1, victims, slots);
}

void sh_evict_by_key(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n, size_t k,
                     uint32_t *victims, int64_t *slots, int simd)
{
    size_t sinks = p->sinks < n ? p->sinks : n;
    size_t hi = n - p->recent_window, end;
    if (p->pins != NULL && sh_next_pinned(p, h, sinks, hi, &end) < hi)
        evict_around_pins(ops, p, h, n, sinks, hi, k, victims, slots, simd);
    else
        evict_range(ops, p, h, n, sinks, hi, k, victims, slots, simd);
}
