/* The C ABI exercised from C (built and run by tests/c_program.rs on the simulated backend:
 * TENSORMEM_ALLOC_BACKEND=sim TENSORMEM_SIM_MEMORY=1GiB).
 *
 *   abi_test all SNAPSHOT_PATH   every check below; prints "abi_test: all N checks passed"
 *   abi_test panic NAME          NAME panics inside (TENSORMEM_ALLOC_INJECT_PANIC=NAME, a test
 *                                build): it must return its error value with the panic in
 *                                tm_last_error(), and the allocator must still work.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensormem_alloc.h"

static int checks = 0;

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        checks++;                                                                             \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "abi_test.c:%d: check failed: %s: ", __LINE__, #cond);            \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, " (tm_last_error: \"%s\")\n", tm_last_error());                   \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

#define MIB (1024L * 1024L)

/* Streams are opaque ids on the simulated backend. */
static cudaStream_t stream(uintptr_t id) { return (cudaStream_t)id; }

static char stats_buf[16384];

/* The JSON of memory_stats(0). */
static const char *stats(void) {
    ssize_t n = tm_memory_stats_json(0, stats_buf, sizeof stats_buf);
    CHECK(n > 0 && (size_t)n < sizeof stats_buf, "memory_stats json of %zd bytes", n);
    return stats_buf;
}

/* One integer key of memory_stats(0). */
static long long stat(const char *key) {
    const char *json = stats();
    char pattern[128];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(json, pattern);
    CHECK(at != NULL, "key %s in %s", key, json);
    return strtoll(at + strlen(pattern), NULL, 10);
}

static int count_keys(const char *json) {
    int n = 0;
    for (const char *c = json; *c; c++) n += (*c == ':');
    return n;
}

#define THREADS 4
#define ROUNDS 2000

static void *worker(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    void *live[8] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        int slot = i % 8;
        if (live[slot]) tm_free(live[slot], 0, 0, stream(id));
        ssize_t size = 512 + (ssize_t)((i * 7919 + id * 104729) % (3 * MIB));
        live[slot] = tm_malloc(size, 0, stream(id));
        if (!live[slot]) return (void *)1;
    }
    for (int slot = 0; slot < 8; slot++) tm_free(live[slot], 0, 0, stream(id));
    /* The last error is per thread: a failure here is not seen by the main thread. */
    tm_free((void *)(uintptr_t)0x10, 0, 0, stream(id));
    if (strstr(tm_last_error(), "not an allocated block") == NULL) return (void *)2;
    return NULL;
}

static void all(const char *snapshot_path) {
    CHECK(strcmp(tm_last_error(), "") == 0, "no error before any call");
    /* torch 2.15's keys, the default rules: 2.7's 122 plus num_oom_rejections */
    CHECK(count_keys(stats()) == 123, "123 memory_stats keys, got %d", count_keys(stats()));
    CHECK(stat("reserved_bytes.all.current") == 0, "nothing reserved at start");

    /* A small allocation: rounded to 1024 bytes in a 2 MiB small-pool segment. */
    void *p = tm_malloc(1000, 0, stream(0));
    CHECK(p != NULL, "tm_malloc(1000)");
    CHECK(stat("allocated_bytes.all.current") == 1024, "1000 bytes rounded to 1024");
    CHECK(stat("requested_bytes.all.current") == 1000, "1000 bytes requested");
    CHECK(stat("reserved_bytes.small_pool.current") == 2 * MIB, "one small segment");

    /* 3 MiB: a 20 MiB large-pool segment, split. */
    void *q = tm_malloc(3 * MIB, 0, stream(0));
    CHECK(q != NULL && q != p, "tm_malloc(3 MiB)");
    CHECK(stat("reserved_bytes.large_pool.current") == 20 * MIB, "one 20 MiB segment");
    CHECK(stat("segment.all.current") == 2, "two segments");

    /* record_stream: freed, q stays active until the next allocation processes its event. */
    CHECK(tm_record_stream(q, stream(7)) == 0, "tm_record_stream");
    CHECK(tm_record_stream(q, stream(0)) == 0, "recording the allocation stream is allowed");
    tm_free(q, 3 * MIB, 0, stream(0));
    CHECK(stat("allocated_bytes.all.current") == 1024, "q is no longer allocated");
    CHECK(stat("active_bytes.all.current") == 1024 + 3 * MIB, "q waits for stream 7");
    void *r = tm_malloc(512, 0, stream(0));
    CHECK(r != NULL, "tm_malloc(512)");
    CHECK(stat("active_bytes.all.current") == 1024 + 512, "q's event was processed");

    /* A pointer never handed out: an error, and nothing changes. */
    char before[sizeof stats_buf];
    strcpy(before, stats());
    tm_free((void *)(uintptr_t)0xdead0000, 16, 0, stream(0));
    CHECK(strstr(tm_last_error(), "tm_free: pointer 0xdead0000 is not an allocated block") != NULL,
          "tm_free of a foreign pointer sets the last error");
    CHECK(strcmp(before, stats()) == 0, "a foreign free changes no stat");
    CHECK(tm_record_stream((void *)(uintptr_t)0xdead0000, stream(1)) == -1,
          "tm_record_stream of a foreign pointer fails");
    tm_free(NULL, 0, 0, stream(0));
    CHECK(strcmp(before, stats()) == 0, "freeing NULL does nothing");

    /* Bad arguments. */
    CHECK(tm_malloc(-5, 0, stream(0)) == NULL, "a negative size");
    CHECK(strstr(tm_last_error(), "negative size -5") != NULL, "named");
    CHECK(tm_malloc(0, 0, stream(0)) == NULL, "0 bytes give NULL");
    CHECK(tm_malloc(100, 3, stream(0)) == NULL, "an unknown device");
    CHECK(strstr(tm_last_error(), "device 3") != NULL, "named");
    CHECK(tm_memory_stats_json(-1, stats_buf, sizeof stats_buf) == -1, "device -1");

    /* Out of memory on the 1 GiB device: NULL with PyTorch's message, counted. */
    CHECK(tm_malloc(2048 * MIB, 0, stream(0)) == NULL, "2 GiB on a 1 GiB device");
    CHECK(strstr(tm_last_error(), "CUDA out of memory") != NULL, "the OOM message");
    CHECK(stat("num_ooms") == 1, "one OOM counted");

    /* snprintf semantics. */
    ssize_t n = tm_memory_stats_json(0, NULL, 0);
    CHECK(n > 100, "the length of the JSON without a buffer: %zd", n);
    char small[10];
    CHECK(tm_memory_stats_json(0, small, sizeof small) == n, "the full length when cut");
    CHECK(strlen(small) == 9 && small[0] == '{', "9 bytes and a NUL: %s", small);
    char *exact = malloc((size_t)n + 1);
    CHECK(tm_memory_stats_json(0, exact, (size_t)n + 1) == n, "the full object");
    CHECK((ssize_t)strlen(exact) == n && exact[n - 1] == '}', "whole and NUL-terminated");
    free(exact);
    char summary[8192];
    ssize_t s = tm_memory_summary(0, 0, summary, sizeof summary);
    CHECK(s > 0 && (size_t)s < sizeof summary, "a summary of %zd bytes", s);
    CHECK(strstr(summary, "PyTorch CUDA memory summary, device ID 0") != NULL, "%s", summary);
    CHECK(strstr(summary, "CUDA OOMs: 1") != NULL, "the OOM in the summary");

    /* tm_set_config: refused while memory is held, then accepted. */
    CHECK(tm_set_config("max_split_size_mb:40") == -1, "refused while memory is held");
    CHECK(strstr(tm_last_error(), "while it holds") != NULL, "and says why");
    CHECK(tm_set_config("bogus_key:1") == -1, "an unknown key");
    CHECK(strstr(tm_last_error(), "bogus_key") != NULL, "names the key");
    CHECK(tm_set_config(NULL) == -1, "NULL");
    tm_free(p, 1000, 0, stream(0));
    tm_free(r, 512, 0, stream(0));
    tm_empty_cache();
    CHECK(stat("reserved_bytes.all.current") == 0, "empty_cache returned every segment");
    CHECK(tm_set_config("max_split_size_mb:40,roundup_power2_divisions:4") == 0, "accepted");
    CHECK(stat("max_split_size") == 40 * MIB, "max_split_size in the stats");
    void *t = tm_malloc(1200 * 1024, 0, stream(0));
    CHECK(stat("allocated_bytes.all.current") == 1280 * 1024, "rounded to a quarter of 1-2 MiB");
    tm_free(t, 0, 0, stream(0));

    /* Threads: allocations and frees on four streams at once. */
    pthread_t threads[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        CHECK(pthread_create(&threads[i], NULL, worker, (void *)(i + 1)) == 0, "thread");
    for (int i = 0; i < THREADS; i++) {
        void *ret = NULL;
        pthread_join(threads[i], &ret);
        CHECK(ret == NULL, "worker %d returned %p", i, ret);
    }
    CHECK(stat("allocated_bytes.all.current") == 0, "every thread freed what it allocated");
    /* p, q, r and t, then the workers. */
    CHECK(stat("allocation.all.allocated") == 4 + THREADS * ROUNDS, "every allocation counted");
    CHECK(strstr(tm_last_error(), "not an allocated block") == NULL,
          "the workers' errors stayed on their threads");

    /* History with this program's stacks, written as PyTorch's snapshot pickle. */
    CHECK(tm_record_history(1000, 4) == -1, "context 4 does not exist");
    CHECK(tm_record_history(1000, 3) == 0, "history with context all");
    void *h = tm_malloc(4 * MIB, 0, stream(0));
    CHECK(h != NULL, "an allocation in the history");
    CHECK(tm_snapshot_pickle(snapshot_path) == 0, "the snapshot written to %s", snapshot_path);
    tm_free(h, 0, 0, stream(0));
    CHECK(tm_snapshot_pickle("/nonexistent-dir/x.pickle") == -1, "an unwritable path");
    CHECK(strstr(tm_last_error(), "cannot write /nonexistent-dir/x.pickle") != NULL, "named");

    printf("abi_test: all %d checks passed\n", checks);
}

/* The entry point NAME panics; it must return its error value and leave the allocator usable. */
static void panic_in(const char *name) {
    void *p = NULL;
    if (strcmp(name, "tm_malloc") == 0) {
        CHECK(tm_malloc(1000, 0, stream(0)) == NULL, "tm_malloc returns NULL");
    } else if (strcmp(name, "tm_free") == 0) {
        /* tm_free cannot be called without first allocating, which works. */
        p = tm_malloc(1000, 0, stream(0));
        CHECK(p != NULL, "tm_malloc works");
        tm_free(p, 1000, 0, stream(0));
    } else if (strcmp(name, "tm_record_stream") == 0) {
        CHECK(tm_record_stream(NULL, stream(1)) == -1, "tm_record_stream returns -1");
    } else if (strcmp(name, "tm_set_config") == 0) {
        CHECK(tm_set_config("") == -1, "tm_set_config returns -1");
    } else if (strcmp(name, "tm_memory_stats_json") == 0) {
        CHECK(tm_memory_stats_json(0, stats_buf, sizeof stats_buf) == -1, "returns -1");
    } else if (strcmp(name, "tm_snapshot_pickle") == 0) {
        CHECK(tm_snapshot_pickle("/tmp/unused.pickle") == -1, "returns -1");
    } else {
        CHECK(0, "no panic case for %s", name);
    }
    char expected[256];
    snprintf(expected, sizeof expected,
             "%s: internal error (a panic was caught at the C boundary): panic injected into %s",
             name, name);
    CHECK(strstr(tm_last_error(), expected) != NULL, "the panic is the last error");
    if (strcmp(name, "tm_memory_stats_json") != 0) {
        /* The allocator still works after the panic. */
        CHECK(stat("allocation.all.current") == (p ? 1 : 0), "stats after the panic");
    }
    printf("abi_test: panic in %s became an error (%d checks)\n", name, checks);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "all") == 0) {
        all(argv[2]);
    } else if (argc == 3 && strcmp(argv[1], "panic") == 0) {
        panic_in(argv[2]);
    } else {
        fprintf(stderr, "usage: %s all SNAPSHOT_PATH | panic NAME\n", argv[0]);
        return 2;
    }
    return 0;
}
