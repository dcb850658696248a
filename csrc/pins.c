/*
 * pins.c - pinned spans: positions a caller marks that no eviction takes, the
 * generalisation of attention sinks (StreamingLLM, Xiao et al., ICLR 2024, arXiv
 * 2309.17453) that llama.cpp's n_keep and TensorRT-LLM's token-range retention
 * priorities also offer.
 *
 * The spans belong to the object, not to a row or a slot: one block (pins[0] = the
 * number m of spans, then m half-open (start, stop) pairs, merged and ascending),
 * shared by every row, kept by reset, select_rows and the imports. A row's pinned
 * slots are found by binary search, so they cost nothing per slot; the selections
 * (select.c, streaming_llm.c, pools.c) skip the runs of pinned slots this file finds.
 */
#include <stdlib.h>

#include "sh_internal.h"

/* ---------------------------------------------------------------- lookups */

/* The first span of the m spans sp whose stop is above x (m when none). */
static size_t span_after(const uint32_t *sp, size_t m, uint32_t x)
{
    size_t lo = 0, hi = m;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sp[2 * mid + 1] <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

size_t sh_slot_at_least(const uint32_t *pos, size_t lo, size_t hi, uint32_t x)
{
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pos[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

size_t sh_pin_spans(const sh_policy *p)
{
    return p->pins == NULL ? 0 : p->pins[0];
}

int sh_is_pinned(const sh_policy *p, uint32_t pos)
{
    size_t m = sh_pin_spans(p);
    if (m == 0)
        return 0;
    size_t j = span_after(p->pins + 1, m, pos);
    return j < m && pos >= p->pins[1 + 2 * j];
}

size_t sh_next_pinned(const sh_policy *p, size_t h, size_t from, size_t hi, size_t *end)
{
    const uint32_t *pos = sh_row_positions(p, h);
    size_t m = sh_pin_spans(p);
    size_t at = from;
    while (m != 0 && at < hi) {
        size_t j = span_after(p->pins + 1, m, pos[at]);
        if (j == m)
            break;
        uint32_t start = p->pins[1 + 2 * j], stop = p->pins[2 + 2 * j];
        if (pos[at] >= start) { /* pos[at] lies in [start, stop) */
            *end = sh_slot_at_least(pos, at, hi, stop);
            return at;
        }
        at = sh_slot_at_least(pos, at, hi, start);
    }
    *end = hi;
    return hi;
}

size_t sh_pinned_in(const sh_policy *p, size_t h, size_t lo, size_t hi)
{
    size_t pinned = 0;
    while (lo < hi) {
        size_t end, at = sh_next_pinned(p, h, lo, hi, &end);
        pinned += end - at;
        lo = end;
    }
    return pinned;
}

void sh_mark_pinned(const sh_policy *p, size_t h, size_t lo, size_t hi, uint8_t *mark)
{
    while (lo < hi) {
        size_t end, at = sh_next_pinned(p, h, lo, hi, &end);
        memset(mark + lo, 1, at - lo);
        memset(mark + at, 2, end - at);
        lo = end;
    }
}

/* ---------------------------------------------------------------- feasibility */

/* The unpinned slots row h could give up after admitting `admit` (0 or 1) position
   pos, between its first min(sinks, n) and its last recent_window (0 when it holds
   no more than those): n' = count + admit slots, the new one last. */
static uint64_t row_candidates(const sh_policy *p, size_t h, int admit, uint32_t pos)
{
    size_t n = p->counts[h], all = n + (size_t)admit;
    size_t lo = p->sinks < all ? p->sinks : all;
    if (all - lo <= p->recent_window)
        return 0;
    size_t hi = all - p->recent_window;
    size_t old = hi < n ? hi : n; /* the slots held before the admission */
    size_t pinned = sh_pinned_in(p, h, lo < old ? lo : old, old);
    if (admit && hi == all && sh_is_pinned(p, pos))
        pinned++;
    return (uint64_t)(hi - lo - pinned);
}

int sh_check_pins(const sh_policy *p, int admit, uint32_t pos, uint32_t budget)
{
    if (p->pins == NULL)
        return SH_OK;
    for (size_t h = 0; h < p->heads; h++) {
        uint64_t all = (uint64_t)p->counts[h] + (uint64_t)admit;
        if (all > budget && row_candidates(p, h, admit, pos) < all - budget)
            return SH_ERR_PINNED;
    }
    return SH_OK;
}

int sh_check_pool_pins(const sh_policy *p, size_t pool, int admit, uint32_t pos,
                       uint32_t budget)
{
    if (p->pins == NULL)
        return SH_OK;
    uint64_t share = (uint64_t)pool * budget;
    for (size_t g = 0; g < p->heads / pool; g++) {
        uint64_t held = 0, candidates = 0;
        for (size_t h = g * pool; h < (g + 1) * pool; h++) {
            held += (uint64_t)p->counts[h] + (uint64_t)admit;
            candidates += row_candidates(p, h, admit, pos);
        }
        if (held > share && candidates < held - share)
            return SH_ERR_PINNED;
    }
    return SH_OK;
}

/* ---------------------------------------------------------------- the object's spans */

/* SH_OK when the m spans are merged and ascending (start < stop, each start above the
   previous stop) and leave something to evict at the configured budget: the pinned
   positions outside [0, sinks), the sinks and the recent window together below it. */
static int check_spans(const sh_policy *p, const uint32_t *spans, size_t m)
{
    if (m > SH_MAX_PINS || (m != 0 && spans == NULL))
        return SH_ERR_ARG;
    uint64_t pinned = 0;
    for (size_t j = 0; j < m; j++) {
        uint32_t start = spans[2 * j], stop = spans[2 * j + 1];
        if (start >= stop || (j != 0 && start <= spans[2 * j - 1]))
            return SH_ERR_ARG;
        if (stop > p->sinks)
            pinned += stop - (start > p->sinks ? start : p->sinks);
    }
    if (m != 0 && pinned + p->recent_window + p->sinks >= p->budget)
        return SH_ERR_BUDGET;
    return SH_OK;
}

int sh_policy_set_pins(sh_policy *p, const uint32_t *spans, size_t m)
{
    if (p == NULL)
        return SH_ERR_ARG;
    int rc = check_spans(p, spans, m);
    if (rc != SH_OK)
        return rc;
    uint32_t *block = NULL;
    if (m != 0) {
        block = malloc((1 + 2 * m) * sizeof *block);
        if (block == NULL)
            return SH_ERR_NOMEM;
        block[0] = (uint32_t)m;
        memcpy(block + 1, spans, 2 * m * sizeof *block);
    }
    free(p->pins);
    p->pins = block;
    return SH_OK;
}

size_t sh_policy_pin_count(const sh_policy *p)
{
    return p == NULL ? 0 : sh_pin_spans(p);
}

int sh_policy_export_pins(const sh_policy *p, uint32_t *spans, size_t cap)
{
    if (p == NULL || (spans == NULL && sh_pin_spans(p) != 0))
        return SH_ERR_ARG;
    size_t m = sh_pin_spans(p);
    if (cap < m)
        return SH_ERR_BUFFER;
    if (m != 0)
        memcpy(spans, p->pins + 1, 2 * m * sizeof *spans);
    return SH_OK;
}

size_t sh_pin_bytes(const sh_policy *p)
{
    size_t m = sh_pin_spans(p);
    return m == 0 ? 0 : sizeof(uint32_t) + (size_t)SH_PIN_BYTES * m;
}
