/*
 * Stand-in vendor library (libfakeblasLt.so.13): the shape of cuBLAS/cuBLASLt/cuDNN/NCCL on PyPI.
 * It links neither libcudart nor libcuda and imports no cuda* or cu* symbol. Its lazily initialised
 * internal "static runtime" (first call, like cublasCreate) does dlopen("libcuda.so.1")
 * (FAKECUDA_DRIVER overrides; RUNPATH $ORIGIN finds the stand-in driver beside it), takes
 * cuGetProcAddress_v2 with dlsym (fallback cuGetProcAddress) and through it cuInit,
 * cuLaunchKernel, cuLaunchKernelEx, cuMemcpyAsync and cuStreamSynchronize, and launches with
 * them: a real call from inside this library's text.
 *
 * Kernel duration: a vendor call carries its own (kernel_ns argument). Before launching, the
 * library sets the driver's per-thread kernel time through the driver's test-only control
 * fakecuda_set_kernel_ns (dlsym on the driver handle) and restores the previous value after;
 * kernel_ns 0 keeps the thread's current value. Launches are counted here (fakeblas_stats) and the
 * counter is registered with the driver as FAKECUDA_PATH_LIBRARY (launches_library).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda_stats.h"

#define API __attribute__((visibility("default"), noinline))
#ifndef FAKECUDA_DRIVER_FALLBACK
#define FAKECUDA_DRIVER_FALLBACK ""
#endif

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*gpa_fn)(const char *, void **, int, uint64_t);

static struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void **, void **);
    CUresult (*cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    void (*set_kernel_ns)(uint64_t);
    uint64_t (*get_kernel_ns)(void);
} R;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ready;

/* fakeblas_stats: launches (gemm + conv), gemm kernels, conv kernels, copies, syncs, errors */
static volatile uint64_t g_launches, g_gemm, g_conv, g_copies, g_syncs, g_errors;

static char g_gemm_kernel[16], g_conv_kernel[16]; /* CUfunction handles of the "module" */

static void *open_driver(void) {
    const char *env = getenv("FAKECUDA_DRIVER");
    if (env && *env) return dlopen(env, RTLD_NOW);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h && dlsym(h, "fakecuda_stats")) return h;
    if (FAKECUDA_DRIVER_FALLBACK[0]) {
        void *f = dlopen(FAKECUDA_DRIVER_FALLBACK, RTLD_NOW);
        if (f) return f;
    }
    return h;
}

static int get(gpa_v2_fn v2, gpa_fn v1, const char *name, void **slot) {
    int status = 0;
    CUresult e = v2 ? v2(name, slot, 13000, 0, &status) : v1(name, slot, 13000, 0);
    return e == 0 && *slot ? 0 : -1;
}

static void init_runtime(void) {
    void *h = open_driver();
    if (!h) return;
    gpa_v2_fn v2 = (gpa_v2_fn)dlsym(h, "cuGetProcAddress_v2");
    gpa_fn v1 = v2 ? NULL : (gpa_fn)dlsym(h, "cuGetProcAddress");
    if (!v2 && !v1) return;
    if (get(v2, v1, "cuInit", (void **)&R.cuInit) || get(v2, v1, "cuLaunchKernel", (void **)&R.cuLaunchKernel) ||
        get(v2, v1, "cuLaunchKernelEx", (void **)&R.cuLaunchKernelEx) ||
        get(v2, v1, "cuMemcpyAsync", (void **)&R.cuMemcpyAsync) ||
        get(v2, v1, "cuStreamSynchronize", (void **)&R.cuStreamSynchronize))
        return;
    R.set_kernel_ns = (void (*)(uint64_t))dlsym(h, "fakecuda_set_kernel_ns");
    R.get_kernel_ns = (uint64_t (*)(void))dlsym(h, "fakecuda_get_kernel_ns");
    int (*reg)(int, const volatile uint64_t *) =
        (int (*)(int, const volatile uint64_t *))dlsym(h, "fakecuda_register_launch_counter");
    if (reg) reg(FAKECUDA_PATH_LIBRARY, &g_launches);
    if (R.cuInit(0) != 0) return;
    g_ready = 1;
}

/* Like cublasCreate: initialises the library's runtime; 0 on success, 3 when no driver. */
API int fakeblas_init(void) {
    pthread_once(&g_once, init_runtime);
    return g_ready ? 0 : 3;
}

static uint64_t push_kernel_ns(uint64_t ns) {
    uint64_t old = R.get_kernel_ns ? R.get_kernel_ns() : 0;
    if (ns && R.set_kernel_ns) R.set_kernel_ns(ns);
    return old;
}

static void pop_kernel_ns(uint64_t ns, uint64_t old) {
    if (ns && R.set_kernel_ns) R.set_kernel_ns(old);
}

/* `kernels` GEMM kernels of kernel_ns each (0: the thread's current kernel time), through
 * cuLaunchKernel. Returns 0 or the first CUresult. */
API int fakeblas_gemm(int kernels, unsigned long long kernel_ns, void *stream) {
    int e = fakeblas_init();
    if (e) return e;
    uint64_t old = push_kernel_ns(kernel_ns);
    void *params[1] = {NULL};
    for (int i = 0; i < kernels && !e; i++) {
        __atomic_add_fetch(&g_launches, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&g_gemm, 1, __ATOMIC_RELAXED);
        e = R.cuLaunchKernel((CUfunction)g_gemm_kernel, 4, 4, 1, 256, 1, 1, 0, (CUstream)stream, params, NULL);
    }
    pop_kernel_ns(kernel_ns, old);
    if (e) __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
    return e;
}

/* `kernels` convolution kernels through cuLaunchKernelEx (config's hStream = stream). */
API int fakeblas_conv(int kernels, unsigned long long kernel_ns, void *stream) {
    int e = fakeblas_init();
    if (e) return e;
    uint64_t old = push_kernel_ns(kernel_ns);
    CUlaunchConfig cfg = {8, 8, 1, 128, 1, 1, 0, (CUstream)stream, NULL, 0};
    void *params[1] = {NULL};
    for (int i = 0; i < kernels && !e; i++) {
        __atomic_add_fetch(&g_launches, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&g_conv, 1, __ATOMIC_RELAXED);
        e = R.cuLaunchKernelEx(&cfg, (CUfunction)g_conv_kernel, params, NULL);
    }
    pop_kernel_ns(kernel_ns, old);
    if (e) __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
    return e;
}

/* A workspace copy through cuMemcpyAsync (kind from the pointers). */
API int fakeblas_copy_async(void *dst, const void *src, size_t n, void *stream) {
    int e = fakeblas_init();
    if (e) return e;
    __atomic_add_fetch(&g_copies, 1, __ATOMIC_RELAXED);
    e = R.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, (CUstream)stream);
    return e;
}

/* cuStreamSynchronize(stream). */
API int fakeblas_sync(void *stream) {
    int e = fakeblas_init();
    if (e) return e;
    __atomic_add_fetch(&g_syncs, 1, __ATOMIC_RELAXED);
    e = R.cuStreamSynchronize((CUstream)stream);
    return e;
}

/* Copies up to n of {launches, gemm, conv, copies, syncs, errors} into out; returns 6. */
API size_t fakeblas_stats(unsigned long long *out, size_t n) {
    unsigned long long v[6] = {g_launches, g_gemm, g_conv, g_copies, g_syncs, g_errors};
    for (size_t i = 0; out && i < n && i < 6; i++) out[i] = v[i];
    return 6;
}
