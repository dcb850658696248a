/*
 * kinds.c - what each policy kind is, as the shared code reads it (sh_kind_ops in
 * sh_internal.h): its per-slot value (and so its selection key), the parameters it
 * takes, its least recent window, its first capacity, its update and its eviction.
 * The only file that names the kinds; a new policy adds its entry here and its
 * update or eviction in a file of its own (docs/adding-a-policy.md).
 */
#include "sh_internal.h"

const sh_kind_ops sh_kinds[SH_KIND_COUNT] = {
    /* never evicts; capacity starts small and doubles */
    [SH_FULL] = {
        .values = SH_VALUES_NONE,
        .initial_capacity = SH_FULL_INITIAL_CAPACITY,
    },
    /* sinks + the most recent positions; attention is never read */
    [SH_STREAMING_LLM] = {
        .values = SH_VALUES_NONE,
        .takes = SH_TAKES_SINKS,
        .evict = sh_streaming_evict,
    },
    /* cumulative attention in float64 */
    [SH_H2O] = {
        .values = SH_VALUES_F64,
        .takes = SH_TAKES_RECENT_WINDOW | SH_TAKES_SINKS,
        .update = sh_h2o_update,
        .evict = sh_evict_by_key,
    },
    /* uint32 votes, optionally over a history window and ranked by rate */
    [SH_SCISSORHANDS] = {
        .values = SH_VALUES_U32,
        .takes = SH_TAKES_RECENT_WINDOW | SH_TAKES_SINKS | SH_TAKES_VOTE_OPTIONS,
        .update = sh_scissorhands_update,
        .evict = sh_evict_by_key,
    },
    /* the latest step's weight in float64; the newest position has no score until a
       later token reads it, so the recent window always keeps it */
    [SH_TOVA] = {
        .values = SH_VALUES_F64,
        .takes = SH_TAKES_RECENT_WINDOW | SH_TAKES_SINKS,
        .min_recent_window = 1,
        .update = sh_tova_update,
        .evict = sh_evict_by_key,
    },
};
