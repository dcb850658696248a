/*
 * layout.c - kernels of the transformers cache's layout (scissorhands.hf): the rotary
 * re-rotation of stored keys (positions="cache") and the slot table's steady step.
 *
 * A transformers cache (scissorhands.hf) keeps each held key rotated at its rank in
 * its row's kept order; when the kept order changes, only the keys whose rank changed
 * turn, in place.  sh_rope_rotate turns any set of vectors of a float32 buffer, each by
 * one row of a table of angles, in the rotate-half layout of transformers' rotary
 * embeddings, in double precision and rounded once, so that turning a key many times
 * adds one float32 rounding per turn and no drift of its norm; sh_rope_layer is one
 * layer's turns in one call (its keys, their recorded rotations, its query's copy).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sh_internal.h"

/* Vectors asked of memory ahead of the one turning: a turned key is one held in a slot
   of its own (its row's kept order is not the buffer's), so without the hint each one's
   lines arrive one after another (about 350 ns a 64-element key when the buffer is not in
   the caches, 70 ns when it is). */
enum { SH_ROPE_AHEAD = 16 };

/* One vector turned: for j < half, (a, b) = (v[j], v[j + half]) becomes (a c[j] - b s[j],
   b c[j] + a s[j]), in double, rounded once to float32. */
static void turn_vector(float *v, const double *c, const double *s, size_t half)
{
    for (size_t j = 0; j < half; j++) {
        double a = v[j], b = v[j + half];
        v[j] = (float)(a * c[j] - b * s[j]);
        v[j + half] = (float)(b * c[j] + a * s[j]);
    }
}

/* Whether sh_rope_rotate's arguments are valid (count > 0): every vector within length,
   every table row within table_rows. */
static int rope_args_ok(size_t length, const int64_t *offsets, const int64_t *which, size_t count,
                        size_t table_rows, size_t half)
{
    for (size_t i = 0; i < count; i++) {
        if (offsets[i] < 0 || (uint64_t)offsets[i] + 2 * half > length || which[i] < 0
            || (uint64_t)which[i] >= table_rows)
            return 0;
    }
    return 1;
}

/* sh_rope_rotate's turns, its arguments checked. */
static void rope_turn(float *x, const int64_t *offsets, const int64_t *which, size_t count,
                      const double *cos_table, const double *sin_table, size_t half)
{
    for (size_t i = 0; i < count; i++) {
        if (i + SH_ROPE_AHEAD < count) /* the turned keys lie scattered over the buffer */
            sh_prefetch(x + offsets[i + SH_ROPE_AHEAD], 2 * half * sizeof *x);
        turn_vector(x + offsets[i], cos_table + (size_t)which[i] * half, sin_table + (size_t)which[i] * half, half);
    }
}

int sh_rope_rotate(float *x, size_t length, const int64_t *offsets, const int64_t *which, size_t count,
                   const double *cos_table, const double *sin_table, size_t table_rows, size_t half)
{
    if (count == 0)
        return SH_OK;
    if (x == NULL || offsets == NULL || which == NULL || cos_table == NULL || sin_table == NULL || half == 0)
        return SH_ERR_ARG;
    if (!rope_args_ok(length, offsets, which, count, table_rows, half)) /* before anything turns */
        return SH_ERR_ARG;
    rope_turn(x, offsets, which, count, cos_table, sin_table, half);
    return SH_OK;
}

int sh_rope_layer(float *keys, size_t keys_length, const int64_t *offsets, const int64_t *which, size_t count,
                  int64_t *rope, size_t rope_length, const int64_t *rope_index, const int64_t *target,
                  const float *query, float *out, size_t query_length, size_t head_dim, const int64_t *query_which,
                  size_t query_count, const double *cos_table, const double *sin_table, size_t table_rows,
                  size_t half)
{
    if (query == NULL || out == NULL || cos_table == NULL || sin_table == NULL || half == 0
        || 2 * half > head_dim || (query_count > 0 && query_which == NULL)
        || (count > 0 && (keys == NULL || offsets == NULL || which == NULL || rope == NULL || rope_index == NULL
                          || target == NULL)))
        return SH_ERR_ARG;
    if (query_count > query_length / head_dim) /* every query vector within the query */
        return SH_ERR_ARG;
    for (size_t i = 0; i < query_count; i++) {
        if (query_which[i] < 0 || (uint64_t)query_which[i] >= table_rows)
            return SH_ERR_ARG;
    }
    for (size_t i = 0; i < count; i++) {
        if (rope_index[i] < 0 || (uint64_t)rope_index[i] >= rope_length)
            return SH_ERR_ARG;
    }
    if (count > 0 && !rope_args_ok(keys_length, offsets, which, count, table_rows, half))
        return SH_ERR_ARG;
    /* Nothing below can fail. */
    rope_turn(keys, offsets, which, count, cos_table, sin_table, half);
    for (size_t i = 0; i < count; i++)
        rope[rope_index[i]] = target[i];
    memcpy(out, query, query_length * sizeof *out);
    for (size_t i = 0; i < query_count; i++) {
        turn_vector(out + i * head_dim, cos_table + (size_t)query_which[i] * half,
                    sin_table + (size_t)query_which[i] * half, half);
    }
    return SH_OK;
}

/* One entry of sh_rope_turns: the key at slot turns by target - rope[slot]. */
static int emit(int64_t r, int64_t slot, int64_t target, const int64_t *have, size_t rope_stride, size_t room,
                size_t *n, int64_t *row_out, int64_t *slot_out, int64_t *turn_out, int64_t *target_out)
{
    if (slot < 0 || (uint64_t)slot >= rope_stride)
        return -1;
    int64_t turn = target - have[slot];
    if (turn == 0)
        return 0;
    if (*n == room)
        return -1;
    row_out[*n] = r;
    slot_out[*n] = slot;
    turn_out[*n] = turn;
    target_out[*n] = target;
    (*n)++;
    return 0;
}

int64_t sh_rope_turns(const int32_t *slots, size_t slot_stride, const int64_t *counts, const int64_t *rope,
                      size_t rope_stride, size_t rows, const int64_t *new_slots, const int64_t *new_rank, size_t q,
                      int64_t *offset, int64_t *row_out, int64_t *slot_out, int64_t *turn_out, int64_t *target_out,
                      size_t room)
{
    if (rows == 0)
        return 0;
    if (slots == NULL || counts == NULL || rope == NULL || offset == NULL || row_out == NULL || slot_out == NULL
        || turn_out == NULL || target_out == NULL || (q > 0 && (new_slots == NULL || new_rank == NULL)))
        return -1;
    size_t n = 0;
    for (size_t r = 0; r < rows; r++) {
        const int32_t *row = slots + r * slot_stride;
        const int64_t *have = rope + r * rope_stride;
        int64_t count = counts[r];
        if (count < 0 || (uint64_t)count > slot_stride)
            return -1;
        int64_t o = 0;
        if (count > 0) {
            int64_t last = row[count - 1];
            if (last < 0 || (uint64_t)last >= rope_stride)
                return -1;
            o = have[last] - (count - 1);
        }
        offset[r] = o;
        for (int64_t j = 0; j < count; j++) {
            if (emit((int64_t)r, row[j], j + o, have, rope_stride, room, &n, row_out, slot_out, turn_out,
                     target_out) != 0)
                return -1;
        }
        for (size_t t = 0; t < q; t++) {
            if (emit((int64_t)r, new_slots[r * q + t], new_rank[r * q + t] + o, have, rope_stride, room, &n,
                     row_out, slot_out, turn_out, target_out) != 0)
                return -1;
        }
    }
    return (int64_t)n;
}

/* The slot a row's steady step frees (its victim at kept index v of count, or the new
   token's free slot when v == count), or -1 when v, the slot or the free slot is out of
   range. */
static int64_t slot_gone(const int32_t *row, size_t count, int64_t v, int64_t free_slot, size_t valid_stride)
{
    if (v < 0 || (uint64_t)v > count || free_slot < 0 || (uint64_t)free_slot >= valid_stride
        || free_slot > INT32_MAX)
        return -1;
    int64_t gone = (uint64_t)v == count ? free_slot : row[v];
    return gone < 0 || (uint64_t)gone >= valid_stride ? -1 : gone;
}

/* A row's steady step, checked by slot_gone: the new token's free slot joins its kept
   order, the victim at v leaves it and its slot is no longer valid. Returns that slot. */
static int64_t slot_row_step(int32_t *row, size_t count, size_t v, int64_t free_slot, uint8_t *valid_row)
{
    row[count] = (int32_t)free_slot;
    int64_t gone = row[v];
    memmove(row + v, row + v + 1, (count - v) * sizeof *row);
    valid_row[gone] = 0;
    return gone;
}

int sh_slots_step_steady(int32_t *slots, size_t rows, size_t stride, size_t count, const int64_t *counts,
                         const int64_t *free_slots, const int64_t *index, uint8_t *valid, size_t valid_stride,
                         int64_t *freed)
{
    if (rows == 0)
        return SH_OK;
    if (slots == NULL || counts == NULL || free_slots == NULL || index == NULL || valid == NULL || freed == NULL)
        return SH_ERR_ARG;
    if (count + 1 > stride)
        return SH_ERR_LENGTH;
    for (size_t r = 0; r < rows; r++) {
        if (counts[r] < 0 || (uint64_t)counts[r] != count)
            return SH_ERR_LENGTH;
    }
    return sh_slots_step_rows(slots, rows, stride, counts, free_slots, index, valid, valid_stride, freed);
}

int sh_slots_step_rows(int32_t *slots, size_t rows, size_t stride, const int64_t *counts, const int64_t *free_slots,
                       const int64_t *index, uint8_t *valid, size_t valid_stride, int64_t *freed)
{
    if (rows == 0)
        return SH_OK;
    if (slots == NULL || counts == NULL || free_slots == NULL || index == NULL || valid == NULL || freed == NULL)
        return SH_ERR_ARG;
    for (size_t r = 0; r < rows; r++) {
        if (counts[r] < 0 || (uint64_t)counts[r] + 1 > stride)
            return SH_ERR_LENGTH;
    }
    for (size_t r = 0; r < rows; r++) {
        if (slot_gone(slots + r * stride, (size_t)counts[r], index[r], free_slots[r], valid_stride) < 0)
            return SH_ERR_ARG;
    }
    for (size_t r = 0; r < rows; r++)
        freed[r] = slot_row_step(slots + r * stride, (size_t)counts[r], (size_t)index[r], free_slots[r],
                                 valid + r * valid_stride);
    return SH_OK;
}

/* sh_slots_evict_rows' checks, nothing changed: every count within the stride, every
   victim index within its row and once in it (marked in mark, cleared again), every
   slot it frees within valid_stride. */
static int evict_rows_ok(const int32_t *slots, size_t rows, size_t stride, const int64_t *held,
                         const int64_t *victims, const int64_t *index, size_t total, size_t valid_stride,
                         uint8_t *mark)
{
    size_t at = 0;
    for (size_t r = 0; r < rows; r++) {
        if (held[r] < 0 || (uint64_t)held[r] > stride || victims[r] < 0 || victims[r] > held[r]
            || (uint64_t)victims[r] > total - at)
            return SH_ERR_ARG;
        const int32_t *row = slots + r * stride;
        size_t k = (size_t)victims[r], bad = 0, i = 0;
        for (; i < k; i++) {
            int64_t v = index[at + i];
            if (v < 0 || v >= held[r] || mark[v] || row[v] < 0 || (uint64_t)row[v] >= valid_stride) {
                bad = 1;
                break;
            }
            mark[v] = 1;
        }
        while (i-- > 0) /* the marks set, cleared */
            mark[index[at + i]] = 0;
        if (bad)
            return SH_ERR_ARG;
        at += k;
    }
    return at == total ? SH_OK : SH_ERR_ARG;
}

int sh_slots_evict_rows(int32_t *slots, size_t rows, size_t stride, const int64_t *held, const int64_t *victims,
                        const int64_t *index, size_t total, uint8_t *valid, size_t valid_stride, int64_t *freed)
{
    if (rows == 0)
        return total == 0 ? SH_OK : SH_ERR_ARG;
    if (slots == NULL || held == NULL || victims == NULL || valid == NULL || (total > 0 && (index == NULL
                                                                                         || freed == NULL)))
        return SH_ERR_ARG;
    uint8_t *mark = calloc(stride + 1, 1);
    if (mark == NULL)
        return SH_ERR_NOMEM;
    int rc = evict_rows_ok(slots, rows, stride, held, victims, index, total, valid_stride, mark);
    for (size_t r = 0, at = 0; rc == SH_OK && r < rows; r++) {
        size_t k = (size_t)victims[r], n = (size_t)held[r];
        if (k == 0)
            continue;
        int32_t *row = slots + r * stride;
        for (size_t i = 0; i < k; i++) { /* each victim's slot freed, in the order given */
            size_t v = (size_t)index[at + i];
            mark[v] = 1;
            freed[at + i] = row[v];
            valid[r * valid_stride + (size_t)row[v]] = 0;
        }
        size_t w = 0;
        for (size_t i = 0; i < n; i++) { /* the survivors to the front, in order */
            if (mark[i])
                mark[i] = 0;
            else
                row[w++] = row[i];
        }
        at += k;
    }
    free(mark);
    return rc;
}

/* Seconds on a monotonic-enough clock (C11's timespec_get: the policy's share of a step,
   for the cache's statistics only). */
static double now_seconds(void)
{
    struct timespec ts;
    if (timespec_get(&ts, TIME_UTC) != TIME_UTC)
        return 0.0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The steady step's rows as sh_step_steady asks for them (sh_row_source): row h of
   `total` (layer h / rows) gathered when asked, its slot table row stepped after. */
typedef struct steady_rows {
    const float *const *weights;
    size_t rows, group, extent;
    int32_t *slots;
    size_t stride, count;
    int (*row)(const float *, size_t, size_t, const int32_t *, size_t, float *, float *, const uint32_t *,
               uint32_t *, const void *);
    float *mean, *gathered; /* extent + 1, count */
    const int64_t *free_slots;
    uint8_t *valid;
    size_t valid_stride;
    int64_t *freed;
    int32_t *was_end;    /* per row: the slot table's entry at count before the step */
    uint8_t *was_valid;  /* per row: the freed slot's validity before the step */
} steady_rows;

/* Row h's gathered weights, or NULL when a gathered one is not finite and >= 0. */
static const float *steady_make(void *ctx, size_t h, const uint32_t *votes, const uint32_t *positions,
                                uint32_t *most)
{
    steady_rows *s = ctx;
    size_t e = h / s->rows, r = h % s->rows;
    const int32_t *col = s->slots + h * s->stride;
    /* A weight not valid may lie outside the gathered columns: then those decide. */
    if (!s->row(s->weights[e] + r * s->group * s->extent, s->group, s->extent, col, s->count, s->mean,
                s->gathered, votes, most, positions)
        && !sh_valid_f32(s->gathered, s->count))
        return NULL;
    return s->gathered;
}

/* Row h's slot table step (sh_slots_step_steady's for one row), its victim at kept
   index v: nonzero, nothing changed, when a slot is out of range. */
static int steady_after(void *ctx, size_t h, int64_t v)
{
    steady_rows *s = ctx;
    int32_t *row = s->slots + h * s->stride;
    size_t count = s->count;
    int64_t gone = slot_gone(row, count, v, s->free_slots[h], s->valid_stride);
    if (gone < 0)
        return 1;
    s->was_end[h] = row[count];
    s->was_valid[h] = s->valid[h * s->valid_stride + (size_t)gone];
    s->freed[h] = slot_row_step(row, count, (size_t)v, s->free_slots[h], s->valid + h * s->valid_stride);
    return 0;
}

static void steady_undo(void *ctx, size_t h, int64_t v)
{
    steady_rows *s = ctx;
    int32_t *row = s->slots + h * s->stride;
    size_t count = s->count;
    memmove(row + v + 1, row + v, (count - (size_t)v) * sizeof *row);
    row[v] = (int32_t)s->freed[h];
    row[count] = s->was_end[h];
    s->valid[h * s->valid_stride + (size_t)s->freed[h]] = s->was_valid[h];
}

/* The step of every row in one pass (sh_step_steady), when it is its case; declined
   (SH_STEADY_DECLINED, nothing changed) otherwise. */
static int step_row_by_row(const float *const *weights, size_t layers, size_t rows, size_t group, size_t extent,
                           int32_t *slots, size_t stride, size_t count, const int64_t *free_slots,
                           uint8_t *valid, size_t valid_stride, sh_policy *p, uint32_t pos, uint32_t budget,
                           uint32_t *victims, int64_t *victim_slots, size_t victims_cap, size_t *n_victims,
                           int64_t *freed)
{
    const size_t total = layers * rows;
    for (size_t h = 0; h < total; h++) {
        if (free_slots[h] < 0 || (uint64_t)free_slots[h] >= valid_stride || free_slots[h] > INT32_MAX)
            return SH_STEADY_DECLINED;
    }
    steady_rows s = {weights, rows, group, extent, slots, stride, count,
                     SH_KERNEL(sh_simd_active() && extent <= INT32_MAX, gqa_row_votes), NULL, NULL, free_slots,
                     valid, valid_stride, freed, NULL, NULL};
    s.mean = malloc((extent + 1) * sizeof *s.mean);
    s.gathered = malloc(count * sizeof *s.gathered);
    s.was_end = malloc(total * sizeof *s.was_end);
    s.was_valid = malloc(total);
    int rc = SH_STEADY_DECLINED;
    if (s.mean != NULL && s.gathered != NULL && s.was_end != NULL && s.was_valid != NULL) {
        s.mean[extent] = 0.0f;
        sh_row_source src = {steady_make, steady_after, steady_undo, &s};
        rc = sh_step_steady(p, pos, budget, total, count, &src, victims, victim_slots, victims_cap, n_victims);
    }
    free(s.mean);
    free(s.gathered);
    free(s.was_end);
    free(s.was_valid);
    return rc;
}

int sh_cache_step_steady(const float *const *weights, size_t layers, size_t rows, size_t group, size_t extent,
                         int32_t *slots, size_t stride, size_t count, const int64_t *counts,
                         const int64_t *free_slots, uint8_t *valid, size_t valid_stride, float *gathered,
                         sh_policy *p, uint32_t pos, uint32_t budget, uint32_t *victims, int64_t *victim_slots,
                         size_t victims_cap, size_t *n_victims, int64_t *freed, int *done,
                         double *policy_seconds)
{
    if (done == NULL || n_victims == NULL || counts == NULL || (free_slots != NULL && freed == NULL))
        return SH_ERR_ARG;
    *done = 0;
    if (policy_seconds != NULL)
        *policy_seconds = 0.0;
    const size_t total = layers * rows;
    for (size_t r = 0; r < total; r++) { /* the slot step's case, known before anything changes */
        if (counts[r] < 0 || (uint64_t)counts[r] != count)
            return SH_OK;
    }
    if (count == 0 || count > stride || (free_slots != NULL && count + 1 > stride))
        return SH_OK;
    if (free_slots != NULL && weights != NULL && slots != NULL && valid != NULL && group >= 1 && extent >= 1
        && stride >= count) {
        /* One pass: each row gathered, stepped and its slot table row stepped before the
           next row's weights are read (the rows' state read once, not the weights of
           every row first); declined when it is not its case. */
        for (size_t e = 0; e < layers; e++) {
            if (weights[e] == NULL)
                return SH_ERR_ARG;
        }
        double start = policy_seconds != NULL ? now_seconds() : 0.0;
        int rc = step_row_by_row(weights, layers, rows, group, extent, slots, stride, count, free_slots, valid,
                                 valid_stride, p, pos, budget, victims, victim_slots, victims_cap, n_victims, freed);
        if (rc != SH_STEADY_DECLINED) {
            if (policy_seconds != NULL)
                *policy_seconds = now_seconds() - start;
            *done = rc == SH_OK ? 2 : 0;
            return rc;
        }
    }
    int finite = 0, checked = 0;
    int rc = sh_gqa_gather_checked(weights, layers, rows, group, extent, slots, stride, count, gathered, &finite,
                                   &checked);
    if (rc != SH_OK || !finite)
        return rc;
    double start = policy_seconds != NULL ? now_seconds() : 0.0;
    /* sh_policy_step, without checking the weights again when the gather found them valid. */
    rc = sh_step(p, SH_STEP_ADMIT | SH_STEP_EVICT, pos, SH_DTYPE_F32, gathered, total, count, budget, victims,
                 victim_slots, victims_cap, NULL, n_victims, checked);
    if (policy_seconds != NULL)
        *policy_seconds = now_seconds() - start;
    if (rc != SH_OK)
        return rc;
    *done = 1;
    if (free_slots == NULL || *n_victims != 1)
        return SH_OK;
    rc = sh_slots_step_steady(slots, total, stride, count, counts, free_slots, victim_slots, valid, valid_stride,
                              freed);
    if (rc == SH_OK)
        *done = 2;
    return rc == SH_ERR_LENGTH ? SH_OK : rc;
}
