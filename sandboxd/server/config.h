/*
 * config.h — sandboxd's command line and token file.
 */
#ifndef SBX_CONFIG_H
#define SBX_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SBX_VERSION "0.1.0"
#define SBX_PROTOCOL 3u

typedef struct sbx_config {
    char *listen_host;          /* as given, without brackets ("127.0.0.1", "::1") */
    char *listen_port;          /* decimal; "0" picks a free port */
    char *token_file;
    char *provider;             /* auto, gvisor, bwrap, process or echo */
    char *echo_tier;            /* process, container, kernel or vm */
    uint32_t max_sessions;      /* daemon-wide; 0 turns sessions off */
    uint32_t max_per_caller;    /* 0 = no cap */
    uint32_t max_per_owner;     /* 0 = no cap */
    bool per_caller_set;        /* else, with two or more tokens: half of max_sessions */
    /* admission of single runs (Run): executing at once, daemon-wide and per token */
    uint32_t max_runs;          /* default: half the memory / memory_mb, less the pool */
    uint32_t max_runs_per_caller; /* 0 = no cap; default as per_caller */
    bool runs_per_caller_set;
    /* connections (connguard.h) */
    uint32_t max_connections;   /* 0: half the descriptors, at most 4096 (http.c) */
    uint32_t header_timeout_ms; /* 10 s to send a request the daemon accepts */
    uint32_t lifetime_ms;       /* 1 s .. 12 h */
    uint32_t idle_ms;           /* 0 = never suspend */
    size_t max_body_bytes;
    bool test_endpoints;
    /* the providers that run code (process, bwrap, gvisor): limits (docs/daemon.md §6, §7, §8) */
    uint32_t cell_timeout_ms, cell_timeout_max_ms;       /* 30 s, 120 s */
    uint32_t snippet_timeout_ms, snippet_timeout_max_ms; /* 5 s, 30 s */
    uint32_t memory_mb, pids, work_mb, disk_mb;          /* 256, 256, 128, 1024 (0 = none) */
    double cpus;                                         /* 1 */
    uint32_t pool;                                       /* warm sandboxes, 2 */
    bool data_stack_check;                               /* Describe's pythonPackages, on */
    uint32_t sandbox_uid;                                /* first of the uid range, 61000 */
    uint32_t uid_count;                                  /* --uid-range size; 0: default */
    char *state_dir;                                     /* NULL: see state_dir.h */
    char *python_path, *node_path, *bwrap_path, *runsc_path, *runsc_platform;
    char *record_key_path;         /* --record-key: sign records (records.c), or NULL */
    /* SHA-256 of each token of the token file: the tokens themselves are not kept. */
    unsigned char (*token_hashes)[32]; /* httpd_token_hash (tokens.h) */
    size_t n_tokens;
} sbx_config;

/* Parses argv.  Returns 0 to run, 1 when --help or --version was printed (exit 0),
 * 2 after printing an error and the usage to stderr (exit 2). */
int sbx_config_parse(sbx_config *c, int argc, char **argv);
/* Reads the token file.  Returns 0, or -1 after logging why (exit 2). */
int sbx_config_load_tokens(sbx_config *c);
void sbx_config_free(sbx_config *c);

#endif
