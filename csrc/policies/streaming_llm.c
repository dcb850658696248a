/*
 * streaming_llm.c - attention sinks plus a sliding window (Xiao et al., ICLR 2024,
 * arXiv 2309.17453).
 *
 * The first `sinks` positions a row ever held are never evicted, nor pinned ones
 * (pins.c); after them the oldest positions go first. Attention is never read.
 * sh_kind_streaming_llm is the kind's entry.
 */
/* sh-kind: 1 */
#include <string.h>

#include "../sh_internal.h"

/* Evicts the k oldest unpinned slots after slot s of row h, which holds n, keeping
   the order of the rest (pinned slots stay where the oldest would go). */
static void evict_around_pins(sh_policy *p, size_t h, size_t n, size_t s, size_t k,
                              uint32_t *victims, int64_t *slots)
{
    uint32_t *positions = sh_row_positions(p, h);
    size_t j = 0, w = s, i = s;
    while (i < n) {
        size_t end, at = sh_next_pinned(p, h, i, n, &end);
        for (; i < at; i++) {
            if (j < k) {
                victims[j] = positions[i];
                if (slots != NULL)
                    slots[j] = (int64_t)i;
                j++;
            } else {
                positions[w++] = positions[i];
            }
        }
        for (; i < end; i++)
            positions[w++] = positions[i];
    }
}

/* Evicts the k oldest non-sink positions of row h (s = min(sinks, n)): slots
   [s, s + k) when none of them is pinned. Callers guarantee k unpinned slots after
   the sinks. The kind's sh_evict_fn. */
static void sh_streaming_evict(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n, size_t k,
                               uint32_t *victims, int64_t *slots, int simd)
{
    (void)ops, (void)simd;
    uint32_t *positions = sh_row_positions(p, h);
    size_t s = p->sinks < n ? p->sinks : n, end;
    if (p->pins != NULL && sh_next_pinned(p, h, s, s + k, &end) < s + k) {
        evict_around_pins(p, h, n, s, k, victims, slots);
        return;
    }
    memcpy(victims, positions + s, k * sizeof *positions);
    if (slots != NULL) {
        for (size_t j = 0; j < k; j++)
            slots[j] = (int64_t)(s + j);
    }
    memmove(positions + s, positions + s + k, (n - s - k) * sizeof *positions);
}

/* sinks + the most recent positions; attention is never read */
const sh_kind_ops sh_kind_streaming_llm = {
    .values = SH_VALUES_NONE,
    .takes = SH_TAKES_SINKS,
    .evict = sh_streaming_evict,
};
