/* fam_lock.h: the lock family (`lock`); see fam_lock.c. Only the
 * pipeline's table names it. */
#ifndef FLASHSALE_SERVICE_FAM_LOCK_H
#define FLASHSALE_SERVICE_FAM_LOCK_H

#include "service/order/family.h"

extern svc_family svc_family_lock;

#endif
