/*
 * uids.c — see uids.h.
 */
#include "uids.h"

#include "config.h"
#include "util.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint32_t sbx_uids_need(const sbx_config *cfg)
{
    /* + the data stack check's sandbox, live beside the others once serving */
    return cfg->max_sessions + cfg->pool + (cfg->max_runs ? cfg->max_runs : 1) +
           (cfg->data_stack_check ? 1 : 0);
}

uint32_t sbx_uids_count(const sbx_config *cfg)
{
    uint32_t need = sbx_uids_need(cfg);
    if (cfg->uid_count)
        return cfg->uid_count;
    return need > SBX_UIDS_DEFAULT_COUNT ? need : SBX_UIDS_DEFAULT_COUNT;
}

int sbx_uids_init(sbx_uids *u, uid_t first, uint32_t count, uint32_t need, char **why)
{
    memset(u, 0, sizeof *u);
    u->lock_fd = -1;
    if (count < need) {
        *why = sbx_printf("--uid-range holds %u uids, fewer than the %u sandboxes that can be "
                          "live at once (--max-sessions, --pool, --max-concurrent-runs, the data "
                          "stack check): two would share a uid", count, need);
        return -1;
    }
    u->first = first;
    u->count = count;
    u->owner = sbx_xcalloc(count, sizeof *u->owner);
    u->lock_fd = open(SBX_UIDS_LOCK_FILE, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (u->lock_fd < 0) {
        *why = sbx_printf("cannot open %s: %s", SBX_UIDS_LOCK_FILE, strerror(errno));
        free(u->owner);
        u->owner = NULL;
        return -1;
    }
    return 0;
}

void sbx_uids_fini(sbx_uids *u)
{
    if (u->lock_fd >= 0)
        close(u->lock_fd); /* drops every lock this daemon held */
    free(u->owner);
    memset(u, 0, sizeof *u);
    u->lock_fd = -1;
}

/* One byte at offset `uid` of the shared file: locked by whichever daemon holds it. */
static bool lock_uid(const sbx_uids *u, uid_t uid, bool take)
{
    struct flock fl = {.l_type = take ? F_WRLCK : F_UNLCK, .l_whence = SEEK_SET,
                       .l_start = (off_t)uid, .l_len = 1};
    return fcntl(u->lock_fd, F_OFD_SETLK, &fl) == 0;
}

/* Marks in `busy` the uids of the range some process runs as (any of its four uids). */
static void busy_by_processes(const sbx_uids *u, unsigned char *busy)
{
    DIR *d = opendir("/proc");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        char path[64], buf[4096];
        snprintf(path, sizeof path, "/proc/%.20s/status", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        const char *line = strstr(buf, "\nUid:");
        unsigned long ids[4];
        if (!line || sscanf(line + 5, "%lu %lu %lu %lu", &ids[0], &ids[1], &ids[2], &ids[3]) != 4)
            continue;
        for (int i = 0; i < 4; i++)
            if (ids[i] >= u->first && ids[i] - u->first < u->count)
                busy[ids[i] - u->first] = 1;
    }
    closedir(d);
}

uid_t sbx_uids_take(sbx_uids *u, const char *owner)
{
    if (!u->owner)
        return (uid_t)-1;
    unsigned char *busy = sbx_xcalloc(u->count, 1);
    busy_by_processes(u, busy);
    uid_t got = (uid_t)-1;
    for (uint32_t k = 0; k < u->count; k++) {
        uint32_t i = (u->next + k) % u->count;
        if (u->owner[i][0] || busy[i] || !lock_uid(u, u->first + i, true))
            continue;
        snprintf(u->owner[i], sizeof u->owner[i], "%s", owner);
        u->next = (i + 1) % u->count; /* the uids just given back are reused last */
        got = u->first + i;
        break;
    }
    free(busy);
    return got;
}

uid_t sbx_uids_of(const sbx_uids *u, const char *owner)
{
    for (uint32_t i = 0; u->owner && i < u->count; i++)
        if (u->owner[i][0] && strcmp(u->owner[i], owner) == 0)
            return u->first + i;
    return (uid_t)-1;
}

void sbx_uids_release(sbx_uids *u, const char *owner)
{
    uid_t uid = sbx_uids_of(u, owner);
    if (uid == (uid_t)-1)
        return;
    u->owner[uid - u->first][0] = '\0';
    lock_uid(u, uid, false);
}
