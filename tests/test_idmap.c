/*
 * test_idmap.c — the one id hash table (lib/idmap.h), which libplimsoll's sandbox map,
 * serve's conversations and the host's owners use: entries found by key after many
 * puts (across every doubling), removed ones gone and the rest still found, a visit
 * that removes what it is given, and seeds that differ between maps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idmap.h"

#define N 5000

typedef struct item {
    char key[24];
    int value;
    plm_idmap_node node;
} item;

static item items[N];

static item *find(plm_idmap *m, const char *key)
{
    plm_idmap_node *n = plm_idmap_get(m, key);
    return n ? PLM_IDMAP_OWNER(n, item, node) : NULL;
}

static void fill(plm_idmap *m)
{
    for (int i = 0; i < N; i++) {
        snprintf(items[i].key, sizeof items[i].key, "conv-%d", i);
        items[i].value = i;
        items[i].node.key = items[i].key;
        assert_true(plm_idmap_put(m, &items[i].node));
    }
}

static void test_put_get_across_every_doubling(void **state)
{
    (void)state;
    plm_idmap m;
    plm_idmap_init(&m);
    assert_null(plm_idmap_get(&m, "conv-1"));          /* empty: no buckets yet */
    fill(&m);
    assert_int_equal(m.count, N);
    assert_true(m.size >= N);                         /* at most one entry a bucket */
    for (int i = 0; i < N; i++) {
        char key[24];
        snprintf(key, sizeof key, "conv-%d", i);
        item *it = find(&m, key);
        assert_non_null(it);
        assert_int_equal(it->value, i);
    }
    assert_null(find(&m, "conv-5000"));
    assert_null(find(&m, "conv-"));
    assert_null(find(&m, ""));
    plm_idmap_free(&m);
}

static void test_removed_are_gone_the_rest_found(void **state)
{
    (void)state;
    plm_idmap m;
    plm_idmap_init(&m);
    fill(&m);
    for (int i = 0; i < N; i += 2)
        plm_idmap_remove(&m, &items[i].node);
    assert_int_equal(m.count, N / 2);
    for (int i = 0; i < N; i++)
        if (i % 2)
            assert_int_equal(find(&m, items[i].key)->value, i);
        else
            assert_null(find(&m, items[i].key));
    /* a key can come back once it went */
    assert_true(plm_idmap_put(&m, &items[0].node));
    assert_int_equal(find(&m, "conv-0")->value, 0);
    plm_idmap_free(&m);
}

static void drop(void *ud, plm_idmap_node *n)
{
    plm_idmap *m = ud;
    plm_idmap_remove(m, n);
    PLM_IDMAP_OWNER(n, item, node)->value = -1;
}

static void test_each_may_remove_what_it_visits(void **state)
{
    (void)state;
    plm_idmap m;
    plm_idmap_init(&m);
    fill(&m);
    plm_idmap_each(&m, drop, &m);
    assert_int_equal(m.count, 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(items[i].value, -1);             /* each visited once */
        assert_null(find(&m, items[i].key));
    }
    plm_idmap_free(&m);
}

static void test_each_map_has_its_own_seed(void **state)
{
    (void)state;
    plm_idmap a, b;
    plm_idmap_init(&a);
    plm_idmap_init(&b);
    assert_true(a.seed != b.seed);
    item x = {.key = "same"};
    item y = {.key = "same"};
    x.node.key = x.key;
    y.node.key = y.key;
    assert_true(plm_idmap_put(&a, &x.node));
    assert_true(plm_idmap_put(&b, &y.node));
    assert_true(x.node.hash != y.node.hash);     /* a bucket cannot be aimed at blind */
    plm_idmap_free(&a);
    plm_idmap_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_across_every_doubling),
        cmocka_unit_test(test_removed_are_gone_the_rest_found),
        cmocka_unit_test(test_each_may_remove_what_it_visits),
        cmocka_unit_test(test_each_map_has_its_own_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
