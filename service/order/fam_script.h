/* fam_script.h: the script family (`lua`); see fam_script.c. Only the
 * pipeline's table names it. */
#ifndef FLASHSALE_SERVICE_FAM_SCRIPT_H
#define FLASHSALE_SERVICE_FAM_SCRIPT_H

#include "service/order/family.h"

extern svc_family svc_family_script;

#endif
