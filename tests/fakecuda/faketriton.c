/*
 * The Triton shape (libfaketriton_launcher.so): real Triton compiles a small C launcher per kernel
 * signature that does dlopen("libcuda.so.1") + dlsym("cuLaunchKernelEx") and calls it directly;
 * inductor's static launcher calls the exported cuLaunchKernel the same way. No runtime, no
 * cuGetProcAddress: the driver's exports themselves are called. FAKECUDA_DRIVER overrides the
 * path; RUNPATH $ORIGIN finds the stand-in driver beside this library.
 *
 * Kernel duration: as the vendor library (fakeblas.c): the kernel_ns argument is set as the
 * thread's kernel time through the driver's fakecuda_set_kernel_ns and restored after (0: keep).
 * Launches are counted here (faketriton_stats) and the counter is registered with the driver as
 * FAKECUDA_PATH_DIRECT (launches_direct).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "fakecuda_stats.h"

#define API __attribute__((visibility("default"), noinline))
#ifndef FAKECUDA_DRIVER_FALLBACK
#define FAKECUDA_DRIVER_FALLBACK ""
#endif

typedef int CUresult;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

static CUresult (*g_launch_ex)(const CUlaunchConfig *, CUfunction, void **, void **);
static CUresult (*g_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void **, void **);
static void (*g_set_kernel_ns)(uint64_t);
static uint64_t (*g_get_kernel_ns)(void);
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ready;
static volatile uint64_t g_launches, g_ex, g_static, g_errors;
static char g_triton_kernel[16];

static void init(void) {
    const char *env = getenv("FAKECUDA_DRIVER");
    void *h = dlopen(env && *env ? env : "libcuda.so.1", RTLD_NOW);
    if (h && !(env && *env) && !dlsym(h, "fakecuda_stats") && FAKECUDA_DRIVER_FALLBACK[0]) {
        void *f = dlopen(FAKECUDA_DRIVER_FALLBACK, RTLD_NOW);
        if (f) h = f;
    }
    if (!h && FAKECUDA_DRIVER_FALLBACK[0] && !(env && *env)) h = dlopen(FAKECUDA_DRIVER_FALLBACK, RTLD_NOW);
    if (!h) return;
    g_launch_ex = (CUresult(*)(const CUlaunchConfig *, CUfunction, void **, void **))dlsym(h, "cuLaunchKernelEx");
    g_launch = (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void **, void **))dlsym(h, "cuLaunchKernel");
    g_set_kernel_ns = (void (*)(uint64_t))dlsym(h, "fakecuda_set_kernel_ns");
    g_get_kernel_ns = (uint64_t (*)(void))dlsym(h, "fakecuda_get_kernel_ns");
    int (*reg)(int, const volatile uint64_t *) =
        (int (*)(int, const volatile uint64_t *))dlsym(h, "fakecuda_register_launch_counter");
    if (!g_launch_ex || !g_launch) return;
    if (reg) reg(FAKECUDA_PATH_DIRECT, &g_launches);
    g_ready = 1;
}

static int ready(void) {
    pthread_once(&g_once, init);
    return g_ready ? 0 : 3;
}

/* `kernels` launches through the dlsym'd cuLaunchKernelEx (Triton's generated launcher). */
API int faketriton_launch(int kernels, unsigned long long kernel_ns, void *stream) {
    int e = ready();
    if (e) return e;
    uint64_t old = g_get_kernel_ns ? g_get_kernel_ns() : 0;
    if (kernel_ns && g_set_kernel_ns) g_set_kernel_ns(kernel_ns);
    CUlaunchConfig cfg = {64, 1, 1, 128, 1, 1, 0, (CUstream)stream, NULL, 0};
    void *params[1] = {NULL};
    for (int i = 0; i < kernels && !e; i++) {
        __atomic_add_fetch(&g_launches, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&g_ex, 1, __ATOMIC_RELAXED);
        e = g_launch_ex(&cfg, (CUfunction)g_triton_kernel, params, NULL);
    }
    if (kernel_ns && g_set_kernel_ns) g_set_kernel_ns(old);
    if (e) __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
    return e;
}

/* `kernels` launches through the dlsym'd cuLaunchKernel (inductor's static launcher). */
API int faketriton_launch_static(int kernels, unsigned long long kernel_ns, void *stream) {
    int e = ready();
    if (e) return e;
    uint64_t old = g_get_kernel_ns ? g_get_kernel_ns() : 0;
    if (kernel_ns && g_set_kernel_ns) g_set_kernel_ns(kernel_ns);
    void *params[1] = {NULL};
    for (int i = 0; i < kernels && !e; i++) {
        __atomic_add_fetch(&g_launches, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&g_static, 1, __ATOMIC_RELAXED);
        e = g_launch((CUfunction)g_triton_kernel, 64, 1, 1, 128, 1, 1, 0, (CUstream)stream, params, NULL);
    }
    if (kernel_ns && g_set_kernel_ns) g_set_kernel_ns(old);
    if (e) __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
    return e;
}

/* Copies up to n of {launches, via cuLaunchKernelEx, via cuLaunchKernel, errors}; returns 4. */
API size_t faketriton_stats(unsigned long long *out, size_t n) {
    unsigned long long v[4] = {g_launches, g_ex, g_static, g_errors};
    for (size_t i = 0; out && i < n && i < 4; i++) out[i] = v[i];
    return 4;
}
