/*
 * state.c - the state in and out: sh_policy_export and its siblings copy the rows
 * out one after another, the imports replace them (growing the capacity first),
 * and the lookups find a position in a row. Which per-slot array is the votes
 * (uint32) and which the scores (float64) is the kind's values (its entry, policies/).
 */
#include <string.h>

#include "sh_internal.h"

/* Copies the held slots of every row of a per-slot array (row h at base + h *
   capacity elements of size bytes) out to dst, row after row. */
static void copy_rows_out(const sh_policy *p, void *dst, const void *base, size_t size)
{
    size_t at = 0;
    for (size_t h = 0; h < p->heads; h++) {
        size_t n = p->counts[h];
        memcpy((char *)dst + at * size, (const char *)base + h * p->capacity * size, n * size);
        at += n;
    }
}

int sh_policy_export(const sh_policy *p, uint32_t *positions, uint32_t *votes,
                     double *scores, size_t cap)
{
    if (p == NULL)
        return SH_ERR_ARG;
    if (cap < sh_total_count(p))
        return SH_ERR_BUFFER;
    if (positions != NULL)
        copy_rows_out(p, positions, p->positions, sizeof *positions);
    if (votes != NULL && sh_ops(p)->values == SH_VALUES_U32)
        copy_rows_out(p, votes, p->values, sizeof *votes);
    if (scores != NULL && sh_ops(p)->values == SH_VALUES_F64)
        copy_rows_out(p, scores, p->values, sizeof *scores);
    return SH_OK;
}

int sh_policy_export_row(const sh_policy *p, size_t head, uint32_t *positions, size_t cap)
{
    if (p == NULL || positions == NULL || head >= p->heads)
        return SH_ERR_ARG;
    if (cap < p->counts[head])
        return SH_ERR_BUFFER;
    memcpy(positions, sh_row_positions(p, head), p->counts[head] * sizeof *positions);
    return SH_OK;
}

int sh_policy_export_history(const sh_policy *p, uint64_t *history, size_t cap)
{
    if (p == NULL || history == NULL)
        return SH_ERR_ARG;
    if (!sh_has_history(p))
        return SH_ERR_STATE;
    if (cap < sh_total_count(p))
        return SH_ERR_BUFFER;
    copy_rows_out(p, history, sh_row_history(p, 0), sizeof *history);
    return SH_OK;
}

int sh_policy_export_held(const sh_policy *p, uint32_t *held, size_t cap)
{
    if (p == NULL || held == NULL)
        return SH_ERR_ARG;
    if (!p->vote_rate)
        return SH_ERR_STATE;
    if (cap < sh_total_count(p))
        return SH_ERR_BUFFER;
    copy_rows_out(p, held, sh_row_held(p, 0), sizeof *held);
    return SH_OK;
}

/* The checks both imports make first: the object, the positions, the optional arrays
   the object's options need, and the number of rows. */
static int check_import(const sh_policy *p, size_t heads, const uint32_t *positions,
                        const uint64_t *history, const uint32_t *held)
{
    if (p == NULL || positions == NULL)
        return SH_ERR_ARG;
    if ((history != NULL) != (sh_has_history(p) != 0) || (held != NULL) != (p->vote_rate != 0))
        return SH_ERR_ARG;
    if (heads != p->heads)
        return SH_ERR_LENGTH;
    return SH_OK;
}

/* The work of both imports: row h holds counts[h] positions, or n each when counts
   is NULL; the arrays hold the rows one after another. */
static int import_rows(sh_policy *p, size_t heads, const uint32_t *counts, size_t n,
                       const uint32_t *positions, const uint32_t *votes,
                       const double *scores, const uint64_t *history,
                       const uint32_t *held, uint32_t last_position)
{
    int rc = check_import(p, heads, positions, history, held);
    if (rc != SH_OK)
        return rc;
    if (sh_ops(p)->values == SH_VALUES_U32 && votes == NULL)
        return SH_ERR_ARG;
    if (sh_ops(p)->values == SH_VALUES_F64 && scores == NULL)
        return SH_ERR_ARG;
    uint64_t need = n;
    if (counts != NULL) {
        need = 0;
        for (size_t h = 0; h < heads; h++)
            need = counts[h] > need ? counts[h] : need;
    }
    rc = sh_ensure_capacity(p, need);
    if (rc != SH_OK)
        return rc;

    /* Nothing below can fail. */
    size_t at = 0;
    for (size_t h = 0; h < heads; h++) {
        size_t c = counts != NULL ? counts[h] : n;
        memcpy(sh_row_positions(p, h), positions + at, c * sizeof *positions);
        if (sh_ops(p)->values == SH_VALUES_U32)
            memcpy(sh_row_votes(p, h), votes + at, c * sizeof *votes);
        else if (sh_ops(p)->values == SH_VALUES_F64)
            memcpy(sh_row_scores(p, h), scores + at, c * sizeof *scores);
        if (history != NULL)
            memcpy(sh_row_history(p, h), history + at, c * sizeof *history);
        if (held != NULL)
            memcpy(sh_row_held(p, h), held + at, c * sizeof *held);
        p->counts[h] = (uint32_t)c;
        at += c;
    }
    p->last_position = last_position;
    return SH_OK;
}

int sh_policy_import_state(sh_policy *p, size_t heads, size_t n,
                           const uint32_t *positions, const uint32_t *votes,
                           const double *scores, const uint64_t *history,
                           const uint32_t *held, uint32_t last_position)
{
    int rc = check_import(p, heads, positions, history, held);
    if (rc != SH_OK)
        return rc;
    if (n < 1 || n > UINT32_MAX)
        return SH_ERR_STATE;
    return import_rows(p, heads, NULL, n, positions, votes, scores, history, held,
                       last_position);
}

int sh_policy_import_rows(sh_policy *p, size_t heads, const uint32_t *counts,
                          const uint32_t *positions, const uint32_t *votes,
                          const double *scores, const uint64_t *history,
                          const uint32_t *held, uint32_t last_position)
{
    if (counts == NULL)
        return SH_ERR_ARG;
    return import_rows(p, heads, counts, 0, positions, votes, scores, history, held,
                       last_position);
}

int64_t sh_policy_find(const sh_policy *p, size_t head, uint32_t pos)
{
    if (p == NULL || head >= p->heads)
        return -1;
    const uint32_t *row = sh_row_positions(p, head);
    size_t lo = sh_slot_at_least(row, 0, p->counts[head], pos);
    return (lo < p->counts[head] && row[lo] == pos) ? (int64_t)lo : -1;
}

int64_t sh_policy_votes_of(const sh_policy *p, size_t head, uint32_t pos)
{
    int64_t i = sh_policy_find(p, head, pos);
    if (i < 0 || sh_ops(p)->values != SH_VALUES_U32)
        return -1;
    return sh_row_votes(p, head)[i];
}

double sh_policy_score_of(const sh_policy *p, size_t head, uint32_t pos)
{
    int64_t i = sh_policy_find(p, head, pos);
    if (i < 0 || sh_ops(p)->values != SH_VALUES_F64)
        return -1.0;
    return sh_row_scores(p, head)[i];
}
