/* fam_blocking.h: the blocking family (read-check-write strategies that
 * may wait for a lock); see fam_blocking.c. Only the pipeline's table
 * names it. */
#ifndef FLASHSALE_SERVICE_FAM_BLOCKING_H
#define FLASHSALE_SERVICE_FAM_BLOCKING_H

#include "service/order/family.h"

extern svc_family svc_family_blocking;

#endif
