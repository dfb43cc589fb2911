/* api.h: the HTTP API of docs/openapi.yaml (docs/api.md): the routes the
 * service gives the HTTP layer (api.c). */
#ifndef FLASHSALE_SERVICE_API_H
#define FLASHSALE_SERVICE_API_H

#include <stddef.h>

#include "http/http.h"

extern const http_route svc_api_routes[];
extern const size_t svc_api_nroutes;

#endif
