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
#include "scissorhands.h"

int sh_gqa_gather(const float *weights, size_t rows, size_t group, size_t q, size_t extent,
                  const int64_t *columns, size_t col_stride, size_t width, float *out)
{
    if (weights == NULL || columns == NULL || out == NULL || group < 1 || extent < 1 ||
        col_stride < width)
        return SH_ERR_ARG;
    const float divisor = (float)group;
    for (size_t r = 0; r < rows; r++) {
        const int64_t *col = columns + r * col_stride;
        for (size_t t = 0; t < q; t++) {
            const float *first = weights + (r * group * q + t) * extent;
            float *dst = out + (r * q + t) * width;
            for (size_t j = 0; j < width; j++) {
                int64_t c = col[j];
                if (c < 0 || (uint64_t)c >= extent) {
                    dst[j] = 0.0f; /* a slot past the row's count: never read */
                    continue;
                }
                const float *w = first + (size_t)c;
                float total = w[0];
                for (size_t g = 1; g < group; g++)
                    total += w[g * q * extent];
                dst[j] = total / divisor;
            }
        }
    }
    return SH_OK;
}
