/*
 * web.c — serves the page of `berth serve`: runtime/faces/web/index.html, app.js and
 * style.css, carried as C strings (runtime/faces/web/assets.c, written by
 * runtime/faces/web/embed.py), so the page works offline with nothing beside the binary.
 *
 * Headers: the content type, an ETag (a digest of the file) with Cache-Control
 * no-cache (a browser revalidates, and gets 304 until the binary changes), and a
 * Content-Security-Policy that allows only this origin's script, style and fetches — no
 * inline script or style, no frames, no forms posted elsewhere — so that text from a
 * conversation can never run as code, even if a bug put it into the page as HTML.
 */
#include "web.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

struct web_asset {
  const char *path, *type;
  const char *data;
  size_t len;
  const char *etag;
};

#include "web/assets.c"

#define WEB_CSP                                                                      \
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "    \
  "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

static const char method_body[] =
  "{\"error\":{\"code\":\"method_not_allowed\",\"message\":\"the page's files take GET or "
  "HEAD\"}}";

static const struct web_asset *find_asset(const char *url)
{
  if (!strcmp(url, "/index.html"))
    url = "/";
  for (size_t i = 0; i < sizeof web_assets / sizeof *web_assets; i++)
    if (!strcmp(url, web_assets[i].path))
      return &web_assets[i];
  return NULL;
}

static void add_common(struct MHD_Response *r)
{
  MHD_add_response_header(r, "Content-Security-Policy", WEB_CSP);
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(r, "X-Frame-Options", "DENY");
  MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
  MHD_add_response_header(r, "Cross-Origin-Opener-Policy", "same-origin");
}

struct MHD_Response *berth_web_response(struct MHD_Connection *conn, const char *url,
                                        const char *method, unsigned *status)
{
  const struct web_asset *a = find_asset(url);
  if (!a)
    return NULL;
  struct MHD_Response *r;
  if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD)) {
    r = MHD_create_response_from_buffer(sizeof method_body - 1, (void *)method_body,
                                        MHD_RESPMEM_PERSISTENT);
    if (!r)
      return NULL;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    *status = MHD_HTTP_METHOD_NOT_ALLOWED;
    return r;
  }
  const char *inm = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_IF_NONE_MATCH);
  bool fresh = inm && strstr(inm, a->etag);
  if (fresh) {
    r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    *status = MHD_HTTP_NOT_MODIFIED;
  } else {
    r = MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    *status = MHD_HTTP_OK;
  }
  if (!r)
    return NULL;
  if (!fresh)
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, a->type);
  MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, a->etag);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  add_common(r);
  return r;
}
