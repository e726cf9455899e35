/*
 * test_random.c — the pooled random bytes of request ids and cell nonces
 * (lib/random.h): every draw differs from every other, across the pool's refills and
 * from threads drawing at once; the bounds of one draw; and a forked child never hands
 * out the bytes its parent does (the pool's page is wiped on fork).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "random.h"

#define ID 16                    /* a request id's bytes */
#define DRAWS 4096               /* 64 KiB: the pool refills 64 times */
#define THREADS 4

static int cmp_id(const void *a, const void *b) { return memcmp(a, b, ID); }

/* Fails when two of the n ids are equal. */
static void assert_all_differ(unsigned char (*ids)[ID], size_t n)
{
    qsort(ids, n, ID, cmp_id);
    for (size_t i = 1; i < n; i++)
        if (memcmp(ids[i - 1], ids[i], ID) == 0)
            fail_msg("draw %zu repeats another", i);
}

static void test_draws_differ_across_refills(void **state)
{
    (void)state;
    unsigned char (*ids)[ID] = calloc(DRAWS, ID);
    for (size_t i = 0; i < DRAWS; i++)
        assert_true(plm_random_bytes(ids[i], ID));
    assert_all_differ(ids, DRAWS);
    free(ids);
}

static void test_bounds_of_one_draw(void **state)
{
    (void)state;
    unsigned char big[PLM_RANDOM_MAX + 1] = {0};
    assert_true(plm_random_bytes(big, PLM_RANDOM_MAX));
    assert_false(plm_random_bytes(big, PLM_RANDOM_MAX + 1));
    assert_true(plm_random_bytes(big, 0));
    /* odd sizes that do not divide the pool still come whole */
    for (int i = 0; i < 200; i++)
        assert_true(plm_random_bytes(big, 37));
}

static void *draw_many(void *arg)
{
    unsigned char (*ids)[ID] = arg;
    for (size_t i = 0; i < DRAWS; i++)
        if (!plm_random_bytes(ids[i], ID))
            return (void *)1;
    return NULL;
}

static void test_threads_drawing_at_once_get_different_bytes(void **state)
{
    (void)state;
    unsigned char (*ids)[ID] = calloc((size_t)THREADS * DRAWS, ID);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, draw_many, ids + (size_t)i * DRAWS), 0);
    for (int i = 0; i < THREADS; i++) {
        void *failed;
        assert_int_equal(pthread_join(t[i], &failed), 0);
        assert_null(failed);
    }
    assert_all_differ(ids, (size_t)THREADS * DRAWS);
    free(ids);
}

/* The pool is full when the process forks: without the wipe, parent and child would
 * hand out the same next bytes (the bug a fork-blind pool has). */
static void test_a_forked_child_never_repeats_its_parent(void **state)
{
    (void)state;
    unsigned char first[ID];
    assert_true(plm_random_bytes(first, ID));   /* the pool is filled now */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        unsigned char mine[8][ID];
        for (int i = 0; i < 8; i++)
            if (!plm_random_bytes(mine[i], ID))
                _exit(2);
        _exit(write(fds[1], mine, sizeof mine) == (ssize_t)sizeof mine ? 0 : 3);
    }
    close(fds[1]);
    unsigned char ids[16][ID];
    for (int i = 0; i < 8; i++)
        assert_true(plm_random_bytes(ids[i], ID));
    size_t got = 0;
    while (got < 8 * ID) {
        ssize_t n = read(fds[0], (unsigned char *)ids[8] + got, 8 * ID - got);
        assert_true(n > 0);
        got += (size_t)n;
    }
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_all_differ(ids, 16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draws_differ_across_refills),
        cmocka_unit_test(test_bounds_of_one_draw),
        cmocka_unit_test(test_threads_drawing_at_once_get_different_bytes),
        cmocka_unit_test(test_a_forked_child_never_repeats_its_parent),
    };
    return cmocka_run_group_tests_name("random", tests, NULL, NULL);
}
