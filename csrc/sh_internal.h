/*
 * sh_internal.h - the policy object's layout and the per-policy hooks shared by
 * scissorhands.c (the object, admission, selection, Scissorhands' votes), h2o.c
 * (H2O's cumulative scores) and streaming_llm.c (sinks + recency). Not part of
 * the public API or the cdef.
 */
#ifndef SH_INTERNAL_H
#define SH_INTERNAL_H

#include <string.h>

#include "scissorhands.h"

/* Row h of an array with `capacity` slots per row starts at h * capacity. kind,
   vote_rate and history_window are narrow so that the whole header stays within
   SH_HEADER_BYTES. The values allocation holds, in order: the heads * capacity
   votes or scores, with vote_rate the heads * capacity steps-held counters (same
   row layout), then heads * capacity bytes of selection scratch. Row h holds
   counts[h] positions; with one row, counts points at `count` inside the header. */
struct sh_policy {
    int8_t kind;
    uint8_t vote_rate;       /* Scissorhands: evict by votes per step held */
    uint16_t history_window; /* Scissorhands: steps a vote counts for, 1..64; 0 = forever */
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
                               vote_rate), double scores (H2O), then the scratch bytes;
                               or NULL */
    uint64_t *history;      /* vote bits of the last history_window steps per slot, or NULL */
};

/* H2O: scores[i] += attn[i] in double, saturating at DBL_MAX (h2o.c). */
void sh_h2o_accumulate_f32(double *scores, const float *attn, size_t n);
void sh_h2o_accumulate_f64(double *scores, const double *attn, size_t n);

/* The bit pattern of a finite score >= 0, which orders exactly as the scores do
   (memcpy: no aliasing). Inline: the selection calls it once per slot. */
static inline uint64_t sh_h2o_key(const double *scores, size_t i)
{
    uint64_t bits;
    memcpy(&bits, &scores[i], sizeof bits);
    return bits;
}

/* StreamingLLM: the k oldest positions after the sinks leave the row (streaming_llm.c).
   Writes them (ascending) to victims and their slots to slots (if not NULL), and
   compacts the row; n is the count before the eviction. */
void sh_streaming_evict_row(uint32_t *positions, size_t n, size_t sinks, size_t k,
                            uint32_t *victims, int64_t *slots);

#endif /* SH_INTERNAL_H */
