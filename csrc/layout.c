/*
 * layout.c - kernels of the transformers cache's layout (scissorhands.hf): the rotary
 * re-rotation of stored keys (positions="cache") and the slot table's steady step.
 *
 * A transformers cache (scissorhands.hf) keeps each held key rotated at its rank in
 * its row's kept order; when the kept order changes, only the keys whose rank changed
 * turn, in place.  sh_rope_rotate turns any set of vectors of a float32 buffer, each by
 * one row of a table of angles, in the rotate-half layout of transformers' rotary
 * embeddings, in double precision and rounded once, so that turning a key many times
 * adds one float32 rounding per turn and no drift of its norm.
 */
#include "scissorhands.h"

int sh_rope_rotate(float *x, size_t length, const int64_t *offsets, const int64_t *which, size_t count,
                   const double *cos_table, const double *sin_table, size_t table_rows, size_t half)
{
    if (count == 0)
        return SH_OK;
    if (x == NULL || offsets == NULL || which == NULL || cos_table == NULL || sin_table == NULL || half == 0)
        return SH_ERR_ARG;
    for (size_t i = 0; i < count; i++) { /* every argument checked before anything turns */
        if (offsets[i] < 0 || (uint64_t)offsets[i] + 2 * half > length || which[i] < 0
            || (uint64_t)which[i] >= table_rows)
            return SH_ERR_ARG;
    }
    for (size_t i = 0; i < count; i++) {
        float *v = x + offsets[i];
        const double *c = cos_table + (size_t)which[i] * half;
        const double *s = sin_table + (size_t)which[i] * half;
        for (size_t j = 0; j < half; j++) {
            double a = v[j], b = v[j + half];
            v[j] = (float)(a * c[j] - b * s[j]);
            v[j + half] = (float)(b * c[j] + a * s[j]);
        }
    }
    return SH_OK;
}

int sh_slots_drop_one(int64_t *slots, size_t rows, size_t stride, size_t count, const int64_t *index,
                      int64_t *freed)
{
    if (rows == 0)
        return SH_OK;
    if (slots == NULL || index == NULL || freed == NULL || count + 1 > stride)
        return SH_ERR_ARG;
    for (size_t r = 0; r < rows; r++) {
        if (index[r] < 0 || (uint64_t)index[r] > count)
            return SH_ERR_ARG;
    }
    for (size_t r = 0; r < rows; r++) {
        int64_t *row = slots + r * stride;
        size_t v = (size_t)index[r];
        freed[r] = row[v];
        for (size_t j = v; j < count; j++)
            row[j] = row[j + 1];
    }
    return SH_OK;
}
