/*
 * extend.c - a chunk of tokens in one call: sh_policy_extend (each token a decode
 * step in every row that admits it: the kind's update over what the row holds at
 * that moment, then admission; no eviction) and sh_policy_prefill (the same on a
 * fresh policy). Every weight a token reads is checked, and the capacity grown,
 * before any row changes.
 */
#include <stdlib.h>
#include <string.h>

#include "sh_internal.h"

/* One call's chunk, as both passes read it. */
typedef struct chunk {
    int32_t dtype;
    const char *attn;     /* heads * len * width weights, or NULL when none are read */
    const uint8_t *admit; /* heads * len flags, or NULL: every token joins every row */
    size_t len, width, es;
    int fresh;            /* every row is treated as empty; token 0 is position 0 */
    int simd;
} chunk;

/* Whether token i of a chunk joins the row whose admit flags are adm (NULL: all). */
static int joins(const uint8_t *adm, size_t i)
{
    return adm == NULL || adm[i] != 0;
}

static const uint8_t *row_admit(const chunk *c, size_t h)
{
    return c->admit == NULL ? NULL : c->admit + h * c->len;
}

/* Token i's weights in row h (a row of width columns). */
static const char *token_row(const chunk *c, size_t h, size_t i)
{
    return c->attn + (h * c->len + i) * c->width * c->es;
}

/* Checks every weight token i's vote step reads in one row of a chunk: columns
   [0, nh) and nh + j for each token j < i that joined (all of them when !gap). */
static int chunk_weights_valid(const chunk *c, const char *row, size_t nh, size_t i,
                               const uint8_t *adm, int gap)
{
    if (!gap)
        return sh_weights_valid(c->dtype, row, nh + i, c->simd);
    if (!sh_weights_valid(c->dtype, row, nh, c->simd))
        return 0;
    for (size_t j = 0; j < i; j++) {
        if (adm[j] && !sh_weights_valid(c->dtype, row + (nh + j) * c->es, 1, c->simd))
            return 0;
    }
    return 1;
}

/* Copies the weights token i reads (columns [0, nh), then nh + j for each token
   j < i that joined) to buf, contiguous and in kept order. */
static void gather_weights(const chunk *c, const char *row, size_t nh, size_t i,
                           const uint8_t *adm, char *buf)
{
    size_t m = nh;
    memcpy(buf, row, nh * c->es);
    for (size_t j = 0; j < i; j++) {
        if (adm[j])
            memcpy(buf + (m++) * c->es, row + (nh + j) * c->es, c->es);
    }
}

/* Checks row h's weights (nh held before the chunk); *held gets the row's count
   after it, *skips is set when some token is left out of the row. */
static int check_row(const chunk *c, size_t h, size_t nh, uint64_t *held, int *skips)
{
    const uint8_t *adm = row_admit(c, h);
    int gap = 0;
    *held = nh;
    for (size_t i = 0; i < c->len; i++) {
        if (!joins(adm, i)) {
            gap = *skips = 1; /* it neither votes in this row nor joins it */
            continue;
        }
        if (c->attn != NULL && !chunk_weights_valid(c, token_row(c, h, i), nh, i, adm, gap))
            return SH_ERR_WEIGHT;
        (*held)++;
    }
    return SH_OK;
}

/* Applies the chunk to row h (nh held before it): the tokens from position first on;
   buf (width weights) gathers a token's weights when some token was left out. */
static void apply_row(const sh_kind_ops *ops, sh_policy *p, const chunk *c, size_t h,
                      size_t nh, uint32_t first, char *buf)
{
    const uint8_t *adm = row_admit(c, h);
    size_t held = nh;
    int gap = 0;
    for (size_t i = 0; i < c->len; i++) {
        if (c->fresh && i == 0) {
            /* Position 0, held since construction: kept as it is, or dropped. */
            held = joins(adm, 0) ? 1 : 0;
            gap = !joins(adm, 0);
            continue;
        }
        if (!joins(adm, i)) {
            gap = 1;
            continue;
        }
        if (c->attn != NULL && held != 0) {
            const char *row = token_row(c, h, i);
            if (gap)
                gather_weights(c, row, nh, i, adm, buf);
            sh_update_row(ops, p, h, c->dtype, gap ? buf : row, held, 0, 0, c->simd);
        }
        sh_put_slot(ops, p, h, held++, (uint32_t)(first + i));
    }
    p->counts[h] = (uint32_t)held;
}

/* The call's checks up to the weights' values, filling c. */
static int start_chunk(chunk *c, const sh_policy *p, int32_t dtype, const void *attn,
                       size_t heads, size_t len, size_t width, const uint8_t *admit)
{
    c->fresh = sh_is_fresh(p);
    if (c->fresh ? len - 1 > UINT32_MAX : (uint64_t)p->last_position + len > UINT32_MAX)
        return SH_ERR_POSITION;
    int reads = sh_ops(p)->update != NULL && dtype != SH_DTYPE_NONE;
    if (reads && (attn == NULL || (dtype != SH_DTYPE_F32 && dtype != SH_DTYPE_F64)))
        return SH_ERR_ARG;
    if ((reads || admit != NULL) && heads != p->heads)
        return SH_ERR_LENGTH;
    size_t base = c->fresh ? 0 : sh_max_count(p);
    if (reads && width != base + len)
        return SH_ERR_LENGTH;
    c->dtype = dtype;
    c->attn = reads ? attn : NULL;
    c->admit = admit;
    c->len = len;
    c->width = width;
    c->es = sh_dtype_size(dtype);
    c->simd = sh_simd_active();
    return SH_OK;
}

int sh_policy_extend(sh_policy *p, int32_t dtype, const void *attn, size_t heads,
                     size_t chunk_len, size_t width, const uint8_t *admit)
{
    if (p == NULL || chunk_len < 1)
        return SH_ERR_ARG;
    chunk c;
    int rc = start_chunk(&c, p, dtype, attn, heads, chunk_len, width, admit);
    if (rc != SH_OK)
        return rc;
    int skips = 0; /* some token is left out of some row */
    uint64_t need = 0, held;
    for (size_t h = 0; h < p->heads; h++) {
        if ((rc = check_row(&c, h, c.fresh ? 0 : p->counts[h], &held, &skips)) != SH_OK)
            return rc;
        need = held > need ? held : need;
    }
    char *buf = NULL;
    if (c.attn != NULL && skips && (buf = malloc(width * c.es)) == NULL)
        return SH_ERR_NOMEM;
    if ((rc = sh_ensure_capacity(p, need)) != SH_OK) {
        free(buf);
        return rc;
    }

    /* Nothing below can fail. */
    uint32_t first = c.fresh ? 0 : p->last_position + 1;
    for (size_t h = 0; h < p->heads; h++)
        apply_row(sh_ops(p), p, &c, h, c.fresh ? 0 : p->counts[h], first, buf);
    p->last_position = (uint32_t)(first + chunk_len - 1);
    free(buf);
    return SH_OK;
}

int sh_policy_prefill(sh_policy *p, int32_t dtype, const void *attn, size_t heads,
                      size_t prompt_len)
{
    if (p == NULL || prompt_len < 1)
        return SH_ERR_ARG;
    if (!sh_is_fresh(p))
        return SH_ERR_STATE;
    return sh_policy_extend(p, dtype, attn, heads, prompt_len, prompt_len, NULL);
}
