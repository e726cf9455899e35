/*
 * bench/benchjson.h — the machine-readable side of a benchmark.
 *
 * Every benchmark prints its figures for a person.  When the environment variable
 * BENCH_JSON names a file, it also writes them there as one JSON object (a fragment),
 * which bench/report.py merges into bench/results.json:
 *
 *   {"bench": NAME, "params": {...}, ...figures...}
 *
 * A figure is {"value": V, "unit": U}.  A latency distribution (bj_dist) is
 *   {"unit": U, "n": N, "min", "mean", "max",
 *    "percentiles": {"p50", "p90", "p95", "p99", "p999"},
 *    "samples": [sorted values]                          (when kept), or
 *    "histogram": {"le": [upper bounds], "count": [..]}  (BJ_BINS log bins a decade)}
 * Percentiles interpolate linearly between the closest ranks.
 *
 * Header only (static inline): each benchmark is one file, built by itself.
 */
#ifndef BENCH_BENCHJSON_H
#define BENCH_BENCHJSON_H

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#define BJ_BINS 20 /* histogram bins per decade */

static inline int bj_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The p-quantile (0..1) of sorted samples, interpolated between the closest ranks. */
static inline double bj_pct(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return 0;
    double at = p * (double)(n - 1);
    size_t i = (size_t)at;
    double f = at - (double)i;
    return i + 1 < n ? sorted[i] * (1 - f) + sorted[i + 1] * f : sorted[i];
}

/* A fragment for benchmark `name`, with an empty "params" object. */
static inline json_t *bj_new(const char *name)
{
    return json_pack("{s:s, s:{}}", "bench", name, "params");
}

/* obj[key], created as an empty object when missing (borrowed). */
static inline json_t *bj_obj(json_t *obj, const char *key)
{
    json_t *o = json_object_get(obj, key);
    if (!o) {
        o = json_object();
        json_object_set_new(obj, key, o);
    }
    return o;
}

/* obj[key] = {"value": v, "unit": unit}: an integer when v is one, null when v is not
 * finite. */
static inline void bj_fig(json_t *obj, const char *key, double v, const char *unit)
{
    json_t *value = !isfinite(v)                        ? json_null()
                    : v == floor(v) && fabs(v) < 9e15 ? json_integer((json_int_t)v)
                                                        : json_real(v);
    json_object_set_new(obj, key, json_pack("{s:o, s:s}", "value", value, "unit", unit));
}

static inline void bj_param(json_t *root, const char *key, json_t *value)
{
    json_object_set_new(bj_obj(root, "params"), key, value);
}

/* The distribution of n samples in `unit` (sorts v in place).  keep: the samples
 * themselves, else a histogram of them. */
static inline json_t *bj_dist(double *v, size_t n, const char *unit, bool keep)
{
    qsort(v, n, sizeof *v, bj_cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    json_t *d = json_pack("{s:s, s:I, s:f, s:f, s:f, s:{s:f, s:f, s:f, s:f, s:f}}", "unit",
                          unit, "n", (json_int_t)n, "min", n ? v[0] : 0.0, "mean",
                          n ? sum / (double)n : 0.0, "max", n ? v[n - 1] : 0.0,
                          "percentiles", "p50", bj_pct(v, n, 0.5), "p90", bj_pct(v, n, 0.9),
                          "p95", bj_pct(v, n, 0.95), "p99", bj_pct(v, n, 0.99), "p999",
                          bj_pct(v, n, 0.999));
    if (keep) {
        json_t *s = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(s, json_real(v[i]));
        json_object_set_new(d, "samples", s);
        return d;
    }
    /* Bin k holds the values in (10^((k-1)/BJ_BINS), 10^(k/BJ_BINS)]; only the
     * bins that hold something are listed. */
    json_t *le = json_array(), *count = json_array();
    for (size_t i = 0; i < n;) {
        int k = v[i] > 0 ? (int)ceil(log10(v[i]) * BJ_BINS - 1e-9) : INT_MIN / 2;
        double bound = v[i] > 0 ? pow(10, (double)k / BJ_BINS) : 0;
        size_t c = 0;
        while (i < n && v[i] <= bound) {
            c++;
            i++;
        }
        if (c == 0) { /* rounding put v[i] just above its bound: take it with the next */
            bound = pow(10, (double)(k + 1) / BJ_BINS);
            while (i < n && v[i] <= bound) {
                c++;
                i++;
            }
        }
        json_array_append_new(le, json_real(bound));
        json_array_append_new(count, json_integer((json_int_t)c));
    }
    json_object_set_new(d, "histogram", json_pack("{s:o, s:o}", "le", le, "count", count));
    return d;
}

/* Writes the fragment to $BENCH_JSON (nothing when it is unset) and frees it. */
static inline int bj_write(json_t *root)
{
    const char *path = getenv("BENCH_JSON");
    int rc = 0;
    if (path && *path &&
        json_dump_file(root, path, JSON_COMPACT | JSON_REAL_PRECISION(6)) != 0) {
        fprintf(stderr, "bench: cannot write %s\n", path);
        rc = -1;
    }
    json_decref(root);
    return rc;
}

#endif
