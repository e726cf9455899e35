/*
 * web.h — the page of `berth serve` (runtime/faces/web/): its files, built into the binary.
 */
#ifndef BERTH_WEB_H
#define BERTH_WEB_H

#include <microhttpd.h>

/* The answer to a request for one of the page's files ("/", "/app.js", "/style.css"),
 * with *status; NULL when `url` is not one of them (the API's routes).  GET and HEAD
 * get the file (or 304 when If-None-Match names its ETag), anything else 405.  No token
 * is needed: the page holds nothing of any caller. */
struct MHD_Response *berth_web_response(struct MHD_Connection *conn, const char *url,
                                        const char *method, unsigned *status);

#endif
