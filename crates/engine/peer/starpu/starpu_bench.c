/* starpu_bench: the engine's four standard workloads (W1..W4) on StarPU, the side-by-side peer
 * of `engine-bench` (crates/engine/examples/engine-bench.rs). Same generator, same checksum,
 * same JSON line per timed pass. Each task's body is one atomic increment; variables are
 * StarPU variable handles in main memory (no transfers); a write is STARPU_W, a read STARPU_R,
 * with StarPU's default sequential consistency giving MXNet's read/write ordering.
 *
 * Built and run by `cargo xtask bench engine --peer starpu` (needs libstarpu-dev:
 * `apt-get install libstarpu-dev`). Usage: starpu_bench W1|W2|W3|W4 REPS [--threads N]
 * (sets STARPU_NCPU=N unless already set; STARPU_SCHED defaults to lws). */
#include <starpu.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

typedef struct { int32_t write; uint32_t nreads; uint32_t reads[19]; } task_t;

static uint64_t sm_state;
static uint64_t draw(void) {
    uint64_t z;
    sm_state += 0x9E3779B97F4A7C15ULL;
    z = sm_state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static size_t gen(const char *name, task_t **out, int *nvars) {
    size_t n, i, j;
    task_t *t;
    if (!strcmp(name, "W1")) {
        n = 100000; *nvars = 1000; t = calloc(n, sizeof *t);
        for (i = 0; i < n; i++) t[i].write = (int32_t)(i % 1000);
    } else if (!strcmp(name, "W2")) {
        n = 100000; *nvars = 1; t = calloc(n, sizeof *t);
        for (i = 0; i < n; i++) t[i].write = 0;
    } else if (!strcmp(name, "W3")) {
        uint32_t pool[99];
        n = 100000; *nvars = 100; t = calloc(n, sizeof *t); sm_state = 42;
        for (i = 0; i < n; i++) {
            uint32_t w = (uint32_t)(draw() % 100), k = (uint32_t)(2 + draw() % 18), p = 0, v;
            for (v = 0; v < 100; v++) if (v != w) pool[p++] = v;
            t[i].write = (int32_t)w; t[i].nreads = k;
            for (j = 0; j < k; j++) {
                uint64_t r = j + draw() % (99 - j);
                uint32_t tmp = pool[j]; pool[j] = pool[r]; pool[r] = tmp;
                t[i].reads[j] = pool[j];
            }
        }
    } else if (!strcmp(name, "W4")) {
        n = 65000; *nvars = 1; t = calloc(n, sizeof *t);
        for (i = 0; i < n; i++) {
            if (i % 65 == 0) t[i].write = 0; else { t[i].write = -1; t[i].nreads = 1; t[i].reads[0] = 0; }
        }
    } else return 0;
    *out = t;
    return n;
}

static uint64_t checksum(const task_t *t, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    size_t i, j;
#define MIX(x) do { h ^= (uint64_t)(uint32_t)(x); h *= 1099511628211ULL; } while (0)
    for (i = 0; i < n; i++) {
        MIX(t[i].write); MIX(t[i].nreads);
        for (j = 0; j < t[i].nreads; j++) MIX(t[i].reads[j]);
    }
    return h;
}

static uint64_t counter;
static void body(void *buffers[], void *arg) {
    (void)buffers; (void)arg;
    __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
}

static struct starpu_codelet cl = {
    .cpu_funcs = { body },
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "incr",
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

static int pass(const task_t *t, size_t n, int nvars, double *push_s, double *wait_s, double *cpu_s) {
    starpu_data_handle_t *h = malloc(nvars * sizeof *h);
    uint64_t *store = calloc(nvars, sizeof *store);
    struct starpu_data_descr descr[20];
    size_t i, j;
    double t0, t1, t2, c0;
    int v;
    for (v = 0; v < nvars; v++)
        starpu_variable_data_register(&h[v], STARPU_MAIN_RAM, (uintptr_t)&store[v], sizeof store[v]);
    counter = 0;
    c0 = cpu();
    t0 = now();
    for (i = 0; i < n; i++) {
        int nd = 0;
        if (t[i].write >= 0) { descr[nd].handle = h[t[i].write]; descr[nd].mode = STARPU_W; nd++; }
        for (j = 0; j < t[i].nreads; j++) { descr[nd].handle = h[t[i].reads[j]]; descr[nd].mode = STARPU_R; nd++; }
        if (starpu_task_insert(&cl, STARPU_DATA_MODE_ARRAY, descr, nd, 0) != 0) return -1;
    }
    t1 = now();
    starpu_task_wait_for_all();
    t2 = now();
    *cpu_s = cpu() - c0;
    *push_s = t1 - t0;
    *wait_s = t2 - t1;
    for (v = 0; v < nvars; v++) starpu_data_unregister(h[v]);
    free(h); free(store);
    return counter == n ? 0 : 1;
}

int main(int argc, char **argv) {
    task_t *t;
    int nvars, reps, r, a, bad = 0;
    size_t n;
    const char *threads = "2";
    double push_s, wait_s, cpu_s;
    char buf[32];
    if (argc < 3) { fprintf(stderr, "usage: starpu_bench W1|W2|W3|W4 REPS [--threads N]\n"); return 2; }
    for (a = 3; a + 1 < argc; a += 2) if (!strcmp(argv[a], "--threads")) threads = argv[a + 1];
    n = gen(argv[1], &t, &nvars);
    reps = atoi(argv[2]);
    if (!n || reps <= 0) { fprintf(stderr, "starpu_bench: bad workload or reps\n"); return 2; }
    setenv("STARPU_NCPU", threads, 0);
    setenv("STARPU_SCHED", "lws", 0);
    setenv("STARPU_NCUDA", "0", 0);
    setenv("STARPU_NOPENCL", "0", 0);
    setenv("STARPU_SILENT", "1", 0);
    if (starpu_init(NULL) != 0) { fprintf(stderr, "starpu_bench: starpu_init failed\n"); return 1; }
    /* untimed warm-up: a tenth of the tasks */
    if (pass(t, n / 10, nvars, &push_s, &wait_s, &cpu_s) != 0) bad = 1;
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)checksum(t, n));
    for (r = 0; r < reps; r++) {
        int rc = pass(t, n, nvars, &push_s, &wait_s, &cpu_s);
        double total = push_s + wait_s;
        if (rc) bad = 1;
        printf("{\"workload\":\"%s\",\"engine\":\"StarPU\",\"threads\":%s,\"rep\":%d,\"ntasks\":%zu,\"checksum\":\"%s\","
               "\"push_s\":%.6f,\"wait_s\":%.6f,\"total_s\":%.6f,\"us_per_task\":%.4f,\"push_us_per_task\":%.4f,"
               "\"tasks_per_s\":%.0f,\"cpu_s\":%.4f}\n",
               argv[1], threads, r, n, buf, push_s, wait_s, total, total / n * 1e6, push_s / n * 1e6, n / total, cpu_s);
        fflush(stdout);
    }
    starpu_shutdown();
    free(t);
    if (bad) fprintf(stderr, "starpu_bench: counter mismatch\n");
    return bad;
}
