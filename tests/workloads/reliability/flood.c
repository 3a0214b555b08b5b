/* Floods the probed cudaLaunchKernel from C so the ring buffer overruns (tests/reliability.rs).
 *
 * flood(cudart, threads, per_thread) dlopens the stand-in CUDA runtime, starts `threads` pthreads
 * (created after the daemon attached) that each call cudaLaunchKernel `per_thread` times with a
 * zero simulated kernel time, joins them, and returns how many calls returned cudaSuccess, or -1
 * when the library or a symbol is missing. Several threads on a 2-core machine make the producers
 * outrun the daemon's consumer, as a launch-heavy job would.
 *
 * Built by the test: gcc -O2 -shared -fPIC -pthread -o libflood.so flood.c -ldl
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef void (*set_ns_fn)(uint64_t);

static launch_fn g_launch;
static set_ns_fn g_set_ns;

struct job { uint64_t n, ok; };

static void *worker(void *arg) {
    struct job *j = arg;
    static const char kernel = 0; /* any non-null "function" pointer */
    dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    g_set_ns(0); /* per-thread simulated kernel time: keep the stand-in device queue empty */
    for (uint64_t i = 0; i < j->n; i++)
        if (g_launch(&kernel, grid, block, NULL, 0, NULL) == 0) j->ok++;
    return NULL;
}

int64_t flood(const char *cudart, int threads, uint64_t per_thread) {
    void *h = dlopen(cudart, RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(cudart, RTLD_NOW);
    if (!h) return -1;
    g_launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
    g_set_ns = (set_ns_fn)dlsym(h, "fakecuda_set_kernel_ns");
    if (!g_launch || !g_set_ns || threads < 1 || threads > 64) return -1;
    pthread_t t[64];
    struct job jobs[64] = {{0, 0}};
    for (int i = 0; i < threads; i++) {
        jobs[i].n = per_thread;
        if (pthread_create(&t[i], NULL, worker, &jobs[i]) != 0) return -1;
    }
    int64_t ok = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        ok += (int64_t)jobs[i].ok;
    }
    return ok;
}
