/* fam_db.h: the db family (`db`, `db-optimistic`); see fam_db.c. Only the
 * pipeline's table names it. */
#ifndef FLASHSALE_SERVICE_FAM_DB_H
#define FLASHSALE_SERVICE_FAM_DB_H

#include "service/order/family.h"

extern svc_family svc_family_db;

#endif
