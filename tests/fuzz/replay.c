/*
 * replay.c — a fuzz harness without the fuzzer: runs LLVMFuzzerTestOneInput once on
 * each input, the way `make test` replays the seeds and the crashes found before.
 * Linked with one harness (`make` builds $(BUILD)/fuzzreplay/fuzz_<name>), with the
 * project's compiler and flags: plain under `make test`, ASan and UBSan under
 * `make check-asan`.
 *
 *   fuzz_<name> [FILE|DIR]...
 *
 * Without arguments it replays tests/fuzz/corpus/<name>/ (which must hold inputs) and
 * tests/fuzz/regressions/<name>/ (when there is one).  A directory is read to its
 * depth, in name order; dot files (placeholders) are skipped.  The summary is
 * cmocka's, one test per input, so tests/run.sh counts it: an input that crashes,
 * aborts or trips a sanitizer ends the program, after a line naming the input.  No
 * input at all fails too: a replay that runs nothing would pass for ever.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef REPLAY_NAME
#error "build with -DREPLAY_NAME=\"fuzz_<name>\" -DREPLAY_DIR=\"<path of tests/fuzz>\""
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Optional in a harness (libFuzzer calls it once, before any input); none defines it
 * today, a weak reference keeps the driver right for one that will. */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
/* Defined when a sanitizer runtime is linked: run before it ends the process. */
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static const char *current;         /* the input being run, for the crash line */
static unsigned ran;

static void say_crashed(void)
{
    if (!current)
        return;
    /* write(2) only: this runs from signal handlers and sanitizer reports */
    static const char a[] = "replay " REPLAY_NAME ": crashed on ";
    ssize_t w = write(2, a, sizeof a - 1);
    w = write(2, current, strlen(current));
    w = write(2, "\n", 1);
    (void)w;
    current = NULL;
}

static void on_signal(int sig)
{
    say_crashed();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay %s: %s: %s\n", REPLAY_NAME, path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, len = 0, n;
    uint8_t *buf = malloc(cap);
    while (buf && (n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) {
            uint8_t *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    int bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "replay %s: %s: cannot read\n", REPLAY_NAME, path);
        free(buf);
        return -1;
    }
    /* an exact-size copy, so that ASan sees a read past the input's end */
    uint8_t *data = malloc(len ? len : 1);
    if (!data) {
        free(buf);
        return -1;
    }
    memcpy(data, buf, len);
    free(buf);
    current = path;
    LLVMFuzzerTestOneInput(data, len);
    current = NULL;
    free(data);
    ran++;
    return 0;
}

static int dot_file(const struct dirent *e)
{
    return e->d_name[0] != '.';
}

/* A file, or every file under a directory; missing: an error unless `optional`. */
static int run_path(const char *path, int optional)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        if (optional && errno == ENOENT)
            return 0;
        fprintf(stderr, "replay %s: %s: %s\n", REPLAY_NAME, path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return run_file(path);
    struct dirent **names;
    int n = scandir(path, &names, dot_file, alphasort);
    if (n < 0) {
        fprintf(stderr, "replay %s: %s: %s\n", REPLAY_NAME, path, strerror(errno));
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(path) + strlen(names[i]->d_name) + 2;
        char *sub = malloc(len);
        if (!sub || (snprintf(sub, len, "%s/%s", path, names[i]->d_name), run_path(sub, 0)))
            rc = -1;
        free(sub);
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    static const int sigs[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], on_signal);
    if (__sanitizer_set_death_callback)
        __sanitizer_set_death_callback(say_crashed);
    atexit(say_crashed);            /* a harness that calls exit() mid-input */
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);

    const char *name = &REPLAY_NAME[sizeof "fuzz_" - 1];
    int errors = 0;
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            errors += run_path(argv[i], 0) != 0;
    } else {
        char corpus[4096], regressions[4096];
        snprintf(corpus, sizeof corpus, "%s/corpus/%s", REPLAY_DIR, name);
        snprintf(regressions, sizeof regressions, "%s/regressions/%s", REPLAY_DIR, name);
        errors += run_path(corpus, 0) != 0;
        errors += run_path(regressions, 1) != 0;
    }
    if (ran == 0) {
        fprintf(stderr, "replay %s: no input\n", REPLAY_NAME);
        errors++;
    }
    printf("replay %s: %u inputs\n", REPLAY_NAME, ran);
    printf("[==========] %u test(s) run.\n", ran + (errors ? 1 : 0));
    printf("[  PASSED  ] %u test(s).\n", ran);
    if (errors)
        printf("[  FAILED  ] 1 test(s), listed below:\n[  FAILED  ] %s: unreadable or "
               "missing inputs\n", REPLAY_NAME);
    return errors ? 1 : 0;
}
