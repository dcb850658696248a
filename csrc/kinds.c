/*
 * kinds.c - what each policy kind is, as the shared code reads it: its per-slot
 * value (and so its selection key), the parameters it takes, its update and its
 * eviction. The only place that names the kinds; a new policy adds its entry here
 * and its update or eviction in a file of its own.
 */
#include "sh_internal.h"

const sh_kind_ops sh_kinds[SH_KIND_COUNT] = {
    /* never evicts; capacity starts small and doubles */
    [SH_FULL] = { SH_VALUES_NONE, 0, 0, SH_FULL_INITIAL_CAPACITY, NULL, NULL },
    /* sinks + the most recent positions; attention is never read */
    [SH_STREAMING_LLM] = { SH_VALUES_NONE, SH_TAKES_SINKS, 0, 0, NULL, sh_streaming_evict },
    /* cumulative attention in float64 */
    [SH_H2O] = { SH_VALUES_F64, SH_TAKES_RECENT_WINDOW | SH_TAKES_SINKS, 0, 0, sh_h2o_update,
                 sh_evict_by_key },
    /* uint32 votes, with a history window and a vote rate */
    [SH_SCISSORHANDS] = { SH_VALUES_U32,
                          SH_TAKES_RECENT_WINDOW | SH_TAKES_SINKS | SH_TAKES_VOTE_OPTIONS, 0, 0,
                          sh_scissorhands_update, sh_evict_by_key },
    /* the latest step's weight in float64; the newest position has no score yet, so
       the recent window keeps it */
    [SH_TOVA] = { SH_VALUES_F64, SH_TAKES_RECENT_WINDOW | SH_TAKES_SINKS, 1, 0, sh_tova_update,
                  sh_evict_by_key },
};
