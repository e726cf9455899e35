/*
 * fault.c — start the fault-injection proxy and talk to its control endpoints.
 */
#include "fault.h"
#include "launch.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct buf {
    char *data;
    size_t len;
} buf;

static size_t collect(char *p, size_t size, size_t n, void *ud)
{
    buf *b = ud;
    char *nd = realloc(b->data, b->len + size * n + 1);
    if (!nd)
        return 0;
    memcpy(nd + b->len, p, size * n);
    b->len += size * n;
    nd[b->len] = '\0';
    b->data = nd;
    return size * n;
}

long http_call(const char *method, const char *url, const char *body, char **out)
{
    CURL *e = curl_easy_init();
    buf b = {0};
    long status = -1;
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    if (body)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 10000L);
    if (curl_easy_perform(e) == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    if (out)
        *out = b.data;
    else
        free(b.data);
    return status;
}

int fault_start(fault_proxy *p, const char *upstream)
{
    char up[160];
    snprintf(up, sizeof up, "%s", upstream);
    char *argv[] = {"python3", "tests/faultproxy.py", "--upstream", up, "--quiet", NULL};
    p->pid = spawn_listening(argv, p->url, sizeof p->url);
    return p->pid > 0 ? 0 : -1;
}

int fault_start_tls(fault_proxy *p, const char *upstream, const char *cert, const char *key)
{
    char up[160], c[256], k[256];
    snprintf(up, sizeof up, "%s", upstream);
    snprintf(c, sizeof c, "%s", cert);
    snprintf(k, sizeof k, "%s", key);
    char *argv[] = {"python3", "tests/faultproxy.py", "--upstream", up, "--tls-cert", c,
                    "--tls-key", k, "--quiet", NULL};
    p->pid = spawn_listening(argv, p->url, sizeof p->url);
    return p->pid > 0 ? 0 : -1;
}

void fault_stop(fault_proxy *p)
{
    spawn_stop(p->pid);
    p->pid = 0;
}

int fault_arm(fault_proxy *p, const char *spec)
{
    char url[192];
    snprintf(url, sizeof url, "%s/_fault", p->url);
    return http_call("POST", url, spec, NULL) == 200 ? 0 : -1;
}

int fault_reset(fault_proxy *p)
{
    char url[192];
    snprintf(url, sizeof url, "%s/_fault/reset", p->url);
    return http_call("POST", url, "{}", NULL) == 200 ? 0 : -1;
}

long fault_forwarded(fault_proxy *p, const char *rpc)
{
    char url[192], *body = NULL;
    snprintf(url, sizeof url, "%s/_fault/stats", p->url);
    if (http_call("GET", url, NULL, &body) != 200) {
        free(body);
        return -1;
    }
    json_t *j = json_loads(body, 0, NULL);
    free(body);
    long n = (long)json_integer_value(json_object_get(json_object_get(j, "forwarded"), rpc));
    json_decref(j);
    return n;
}
