/*
 * full.c - the full cache, the baseline: it never evicts and reads no attention; its
 * rows start at SH_FULL_INITIAL_CAPACITY slots and double as they fill (policy.c).
 */
/* sh-kind: 0 */
#include "../sh_internal.h"

/* never evicts; capacity starts small and doubles */
const sh_kind_ops sh_kind_full = {
    .values = SH_VALUES_NONE,
    .initial_capacity = SH_FULL_INITIAL_CAPACITY,
};
