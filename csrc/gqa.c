/*
 * gqa.c - the cache's reduction of attention rows from query heads to policy rows.
 *
 * A transformers cache (scissorhands.hf) hands each policy row the mean of its group
 * of query heads' attention weights over the row's held positions, in kept order.
 * sh_gqa_gather does the group mean and the gather into kept order in one pass over
 * the weights, where the attention left them, with the arithmetic of the NumPy
 * statement it replaces (scissorhands/hf/gqa.py): the group's weights added in head
 * order in float32, then divided by the group's size.
 */
#include <stdlib.h>
#include <string.h>

#include "sh_internal.h"

/* reach[j]: one past the largest column among the first j of the row's `width`
   columns (within the extent), so a token reading j columns needs the mean of the
   first reach[j] weights only. */
static void column_reach(const int64_t *col, size_t width, size_t extent, size_t *reach)
{
    reach[0] = 0;
    for (size_t j = 0; j < width; j++) {
        int64_t c = col[j];
        size_t next = c >= 0 && (uint64_t)c < extent ? (size_t)c + 1 : 0;
        reach[j + 1] = next > reach[j] ? next : reach[j];
    }
}

/* mean[c] for c < hi: the group's weights added in head order in float32, then divided
   by the group's size (a loop the compiler vectorises). */
static void group_mean(const float *first, size_t group, size_t plane, size_t hi, float *mean)
{
    const float divisor = (float)group;
    for (size_t c = 0; c < hi; c++)
        mean[c] = first[c];
    for (size_t g = 1; g < group; g++) {
        const float *w = first + g * plane;
        for (size_t c = 0; c < hi; c++)
            mean[c] += w[c];
    }
    for (size_t c = 0; c < hi; c++)
        mean[c] /= divisor;
}

int sh_gqa_gather(const float *weights, size_t rows, size_t group, size_t q, size_t extent,
                  const int64_t *columns, size_t col_stride, size_t width, const int64_t *held,
                  float *out)
{
    if (weights == NULL || columns == NULL || out == NULL || group < 1 || extent < 1 ||
        col_stride < width)
        return SH_ERR_ARG;
    /* Per query row, the group's mean over the columns it needs first, then the gather
       from it: the same additions and division per weight. */
    float *mean = malloc(extent * sizeof *mean);
    size_t *reach = malloc((width + 1) * sizeof *reach);
    if (mean == NULL || reach == NULL) {
        free(mean);
        free(reach);
        return SH_ERR_NOMEM;
    }
    const size_t plane = q * extent; /* one query head's weights */
    for (size_t r = 0; r < rows; r++) {
        const int64_t *col = columns + r * col_stride;
        column_reach(col, width, extent, reach);
        size_t base = 0;
        if (held != NULL)
            base = held[r] < 0 ? 0 : (size_t)held[r];
        for (size_t t = 0; t < q; t++) {
            /* A chunk's token t reads its row's held columns and the tokens up to itself;
               the later ones are masked, their weights 0. */
            size_t limit = held == NULL ? width : base + t + 1;
            if (limit > width)
                limit = width;
            group_mean(weights + r * group * plane + t * extent, group, plane, reach[limit], mean);
            float *dst = out + (r * q + t) * width;
            for (size_t j = 0; j < limit; j++) {
                int64_t c = col[j];
                /* A column outside the extent is a slot past the row's count: never read. */
                dst[j] = c >= 0 && (uint64_t)c < extent ? mean[c] : 0.0f;
            }
            for (size_t j = limit; j < width; j++)
                dst[j] = 0.0f;
        }
    }
    free(reach);
    free(mean);
    return SH_OK;
}

/* Whether each of the n floats is finite. */
static int all_finite(const float *a, size_t n)
{
    uint32_t special = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &a[i], sizeof bits);
        special |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
    }
    return special == 0;
}

int sh_gqa_row(const float *first, size_t group, size_t extent, const int32_t *col, size_t width,
               float *mean, float *dst)
{
    group_mean(first, group, extent, extent, mean);
    for (size_t j = 0; j < width; j++) {
        uint64_t c = (uint64_t)(int64_t)col[j]; /* a negative column: past any extent */
        dst[j] = mean[c < extent ? c : extent];
    }
    return sh_valid_f32(mean, extent);
}

int sh_gqa_row_votes(const float *first, size_t group, size_t extent, const int32_t *col, size_t width,
                     float *mean, float *dst, const uint32_t *votes, uint32_t *most, const void *ahead)
{
    (void)ahead; /* a hint the portable form does without */
    if (votes != NULL)
        *most = sh_max_u32(votes, 0, width);
    return sh_gqa_row(first, group, extent, col, width, mean, dst);
}

int sh_gqa_gather_checked(const float *const *weights, size_t layers, size_t rows, size_t group, size_t extent,
                          const int32_t *columns, size_t col_stride, size_t width, float *out, int *finite,
                          int *valid)
{
    if (weights == NULL || columns == NULL || out == NULL || group < 1 || extent < 1 || col_stride < width)
        return SH_ERR_ARG;
    for (size_t e = 0; e < layers; e++) {
        if (weights[e] == NULL)
            return SH_ERR_ARG;
    }
    /* Per row, the group's mean over the whole extent first (sequential reads), then
       the gather from it (sh_gqa_row): the same additions and division per weight as
       one pass, at a fraction of the cost when the weights come from memory rather
       than the cache. */
    float *mean = malloc((extent + 1) * sizeof *mean);
    if (mean == NULL)
        return SH_ERR_NOMEM;
    mean[extent] = 0.0f;
    int (*row)(const float *, size_t, size_t, const int32_t *, size_t, float *, float *) =
        SH_KERNEL(sh_simd_active() && extent <= INT32_MAX, gqa_row); /* AVX2: int32 indices */
    int every = 1, checked = 1; /* every written weight finite; and >= 0 */
    for (size_t e = 0; e < layers; e++) {
        for (size_t r = 0; r < rows; r++) {
            const int32_t *col = columns + (e * rows + r) * col_stride;
            float *dst = out + (e * rows + r) * width;
            /* The next row's weights and columns are asked of memory while this row is
               reduced: a decode step's rows are cold (the model's weights streamed
               through the caches since the attention wrote them). */
            size_t ne = r + 1 < rows ? e : e + 1, nr = r + 1 < rows ? r + 1 : 0;
            if (ne < layers) {
                sh_prefetch(weights[ne] + nr * group * extent, group * extent * sizeof(float));
                sh_prefetch(columns + (ne * rows + nr) * col_stride, width * sizeof(int32_t));
            }
            /* A weight that is not finite (or < 0) may lie outside the gathered
               columns: then only the gathered ones decide. */
            if (!row(weights[e] + r * group * extent, group, extent, col, width, mean, dst)) {
                int ok = sh_valid_f32(dst, width); /* valid implies finite */
                checked = checked && ok;
                every = every && (ok || all_finite(dst, width));
            }
        }
    }
    free(mean);
    if (finite != NULL)
        *finite = every;
    if (valid != NULL)
        *valid = checked;
    return SH_OK;
}

int sh_gqa_gather_layers(const float *const *weights, size_t layers, size_t rows, size_t group, size_t extent,
                         const int32_t *columns, size_t col_stride, size_t width, float *out, int *finite)
{
    return sh_gqa_gather_checked(weights, layers, rows, group, extent, columns, col_stride, width, out, finite,
                                 NULL);
}
