/*
 * streaming_llm.c - attention sinks plus a sliding window (Xiao et al., ICLR 2024,
 * arXiv 2309.17453).
 *
 * The first `sinks` positions a row ever held are never evicted; after them the
 * oldest positions go first. Attention is never read.
 */
#include <string.h>

#include "sh_internal.h"

/* Evicts slots [s, s + k) of row h with s = min(sinks, n): the k oldest non-sink
   positions. Callers guarantee s + k <= n. */
void sh_streaming_evict(const sh_kind_ops *ops, sh_policy *p, size_t h, size_t n, size_t k,
                        uint32_t *victims, int64_t *slots, int simd)
{
    (void)ops, (void)simd;
    uint32_t *positions = sh_row_positions(p, h);
    size_t s = p->sinks < n ? p->sinks : n;
    memcpy(victims, positions + s, k * sizeof *positions);
    if (slots != NULL) {
        for (size_t j = 0; j < k; j++)
            slots[j] = (int64_t)(s + j);
    }
    memmove(positions + s, positions + s + k, (n - s - k) * sizeof *positions);
}
