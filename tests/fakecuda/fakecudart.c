/*
 * Stand-in CUDA runtime (libcudart.so.12 / .13) for machines without a GPU.
 *
 * It exports the part of the libcudart API that torch uses, with the real signatures, the real
 * return codes and the real SONAME / symbol version. It simulates nothing itself: like the real
 * runtime it reaches the GPU through the CUDA driver. At first use it dlopen()s libcuda.so.1 (the
 * stand-in driver fakecuda_driver.c beside it: RUNPATH $ORIGIN; FAKECUDA_DRIVER overrides the
 * path), takes cuGetProcAddress_v2 with dlsym and every other driver entry point through
 * cuGetProcAddress_v2 -- never by link (no DT_NEEDED libcuda, no undefined cu* symbol). Each cuda*
 * function calls its driver entry point through those pointers with a real call:
 *
 *   cudaLaunchKernel / __cudaLaunchKernel -> cuLaunchKernel     cudaLaunchKernelExC -> cuLaunchKernelEx
 *   cudaLaunchCooperativeKernel -> cuLaunchCooperativeKernel   cudaGraphLaunch -> cuGraphLaunch
 *   cudaMemcpy  H2D/D2H/D2D -> cuMemcpyHtoD_v2/DtoH_v2/DtoD_v2, H2H/default -> cuMemcpy
 *   cudaMemcpyAsync H2D/D2H/D2D -> cuMemcpy{HtoD,DtoH,DtoD}Async_v2, H2H/default -> cuMemcpyAsync
 *   cudaMemcpyPeerAsync -> cuMemcpyPeerAsync   cudaStreamSynchronize -> cuStreamSynchronize
 *   cudaDeviceSynchronize -> cuCtxSynchronize  cudaEvent* -> cuEvent*   cudaMalloc -> cuMemAlloc_v2 ...
 *   cudaSetDevice -> cuDeviceGet + cuDevicePrimaryCtxRetain + cuCtxSetCurrent
 *
 * The simulated device (timeline, copy model, fork detection, counters) lives in the driver; the
 * fakecuda_* controls here forward to the driver's. The runtime counts its own API calls (the
 * API-call fields of struct fakecuda_stats, and its launches, registered with the driver as
 * launches_runtime). See tests/README.md.
 *
 * Build: see build.sh (matches the real library's prologues: push %rbp; mov %rsp,%rbp, no endbr64).
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

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
typedef struct dim3 { unsigned int x, y, z; } dim3;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct cudaLaunchAttribute_st { int id; char pad[4]; char val[64]; } cudaLaunchAttribute;
typedef struct cudaLaunchConfig_st {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned int numAttrs;
} cudaLaunchConfig_t;

/* driver types (cuda.h) */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    cudaStream_t hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
#define DP(p) ((CUdeviceptr)(uintptr_t)(p))

/* ---------------------------------------------------------------- the runtime's own counts --- */

/* The runtime's API-call counters (the fields of struct fakecuda_stats it owns; the rest are the
 * driver's). Overlaid on the driver's values by fakecuda_stats(). */
static struct fakecuda_stats g_rt;
#define COUNT(f) __atomic_add_fetch(&g_rt.f, 1, __ATOMIC_RELAXED)
static int g_last_error;

/* Like the real runtime (which starts every API function by calling its context lookup), each API
 * function first calls the runtime's entry hook through a pointer; this also keeps a frame
 * (push %rbp; mov %rsp,%rbp) at the start of leaf-like functions, as in the real library. */
static void api_hook(void) { COUNT(api_calls); }
static void (*volatile g_api_hook)(void) = api_hook;
#define API_ENTER() g_api_hook()

/* ---------------------------------------------------------------- the driver ----------------- */

typedef CUresult (*gpa_v2_fn)(const char *, void **, int, uint64_t, int *);
static struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDriverGetVersion)(int *);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(int *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               cudaStream_t, void **, void **);
    CUresult (*cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*cuLaunchCooperativeKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                          unsigned, cudaStream_t, void **);
    CUresult (*cuGraphLaunch)(cudaGraphExec_t, cudaStream_t);
    CUresult (*cuMemcpy)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, cudaStream_t);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, cudaStream_t);
    CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, cudaStream_t);
    CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, cudaStream_t);
    CUresult (*cuMemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, cudaStream_t);
    CUresult (*cuStreamSynchronize)(cudaStream_t);
    CUresult (*cuStreamQuery)(cudaStream_t);
    CUresult (*cuStreamCreate)(cudaStream_t *, unsigned);
    CUresult (*cuStreamDestroy)(cudaStream_t);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuEventCreate)(cudaEvent_t *, unsigned);
    CUresult (*cuEventDestroy)(cudaEvent_t);
    CUresult (*cuEventRecord)(cudaEvent_t, cudaStream_t);
    CUresult (*cuEventSynchronize)(cudaEvent_t);
    CUresult (*cuEventQuery)(cudaEvent_t);
    CUresult (*cuEventElapsedTime)(float *, cudaEvent_t, cudaEvent_t);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemAllocHost)(void **, size_t);
    CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
    CUresult (*cuMemFreeHost)(void *);
    /* test controls (dlsym: not driver entry points) */
    void (*set_kernel_ns)(uint64_t);
    uint64_t (*get_kernel_ns)(void);
    void (*set_bandwidth)(uint64_t);
    uint64_t (*get_bandwidth)(void);
    size_t (*stats)(void *, size_t);
    size_t (*stats_fields)(void);
    uint64_t (*pending)(void);
} D;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_init_error = cudaErrorInitializationError;

/* The driver names this runtime asks cuGetProcAddress for (the unversioned names, as the real
 * runtime does), in the order of the pointers in D. */
static const char *const g_names[] = {
    "cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent", "cuLaunchKernel", "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel", "cuGraphLaunch", "cuMemcpy", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyDtoD",
    "cuMemcpyAsync", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyDtoDAsync", "cuMemcpyPeerAsync",
    "cuStreamSynchronize", "cuStreamQuery", "cuStreamCreate", "cuStreamDestroy", "cuCtxSynchronize",
    "cuCtxGetCurrent", "cuEventCreate", "cuEventDestroy", "cuEventRecord", "cuEventSynchronize",
    "cuEventQuery", "cuEventElapsedTime", "cuMemAlloc", "cuMemFree", "cuMemAllocHost", "cuMemHostAlloc",
    "cuMemFreeHost",
};
_Static_assert(offsetof(__typeof__(D), set_kernel_ns) == sizeof g_names / sizeof g_names[0] * sizeof(void *),
               "one name per driver pointer");

static void *open_driver(void) {
    const char *env = getenv("FAKECUDA_DRIVER");
    if (env && *env) return dlopen(env, RTLD_NOW);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h && dlsym(h, "fakecuda_stats")) return h;
    /* not found beside us (a copy of this library elsewhere), or a real driver came first on the
     * search path: the stand-in driver of the build tree */
    if (FAKECUDA_DRIVER_FALLBACK[0]) {
        void *f = dlopen(FAKECUDA_DRIVER_FALLBACK, RTLD_NOW);
        if (f) return f;
    }
    return h;
}

static void init_driver(void) {
    void *h = open_driver();
    if (!h) return;
    gpa_v2_fn gpa = (gpa_v2_fn)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) return;
    void **slots = (void **)&D;
    for (size_t i = 0; i < sizeof g_names / sizeof g_names[0]; i++) {
        int status = 0;
        if (gpa(g_names[i], &slots[i], FAKECUDA_VERSION, 0 /* CU_GET_PROCADDRESS_DEFAULT */, &status) != 0 || !slots[i])
            return;
    }
    D.set_kernel_ns = (void (*)(uint64_t))dlsym(h, "fakecuda_set_kernel_ns");
    D.get_kernel_ns = (uint64_t (*)(void))dlsym(h, "fakecuda_get_kernel_ns");
    D.set_bandwidth = (void (*)(uint64_t))dlsym(h, "fakecuda_set_bandwidth");
    D.get_bandwidth = (uint64_t (*)(void))dlsym(h, "fakecuda_get_bandwidth");
    D.stats = (size_t (*)(void *, size_t))dlsym(h, "fakecuda_stats");
    D.stats_fields = (size_t (*)(void))dlsym(h, "fakecuda_stats_fields");
    D.pending = (uint64_t (*)(void))dlsym(h, "fakecuda_pending");
    int (*reg)(int, const volatile uint64_t *) =
        (int (*)(int, const volatile uint64_t *))dlsym(h, "fakecuda_register_launch_counter");
    if (reg) reg(FAKECUDA_PATH_RUNTIME, &g_rt.launches_runtime);
    int e = D.cuInit(0);
    g_init_error = e == cudaErrorNoDevice ? e : e ? cudaErrorInitializationError : 0; /* 100: none visible */
}

/* 0 once the driver is loaded and initialised, else cudaErrorInitializationError. */
static int rt_init(void) {
    pthread_once(&g_once, init_driver);
    return g_init_error;
}

static int set_err(int e) {
    if (e && e != cudaErrorNotReady) g_last_error = e;
    return e;
}

#define INIT_OR_FAIL()                   \
    do {                                 \
        int e_ = rt_init();              \
        if (e_) return set_err(e_);      \
    } while (0)

/* ---------------------------------------------------------------- launches ------------------- */

API cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                 size_t sharedMem, cudaStream_t stream) {
    API_ENTER();
    if (!func) return set_err(cudaErrorInvalidValue);
    COUNT(launch_kernel);
    INIT_OR_FAIL();
    COUNT(launches_runtime);
    int e = D.cuLaunchKernel((CUfunction)func, gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y,
                             blockDim.z, (unsigned)sharedMem, stream, args, NULL);
    return set_err(e);
}

/* Internal alias so __cudaLaunchKernel jumps straight into cudaLaunchKernel (not through the PLT),
 * exactly like the real library: a probe on cudaLaunchKernel also sees these launches. */
extern __typeof__(cudaLaunchKernel) fc_cudaLaunchKernel_local
    __attribute__((alias("cudaLaunchKernel"), visibility("hidden")));

/* Exactly the real library's code: push %rbp; mov %rsp,%rbp; pop %rbp; jmp cudaLaunchKernel. */
#ifdef __CET__
#define FC_ENDBR "    endbr64\n"
#else
#define FC_ENDBR ""
#endif
__asm__(".text\n"
        ".globl __cudaLaunchKernel\n"
        ".type __cudaLaunchKernel, @function\n"
        ".p2align 4\n"
        "__cudaLaunchKernel:\n"
        FC_ENDBR
        "    push %rbp\n"
        "    mov %rsp, %rbp\n"
        "    pop %rbp\n"
        "    jmp fc_cudaLaunchKernel_local\n"
        ".size __cudaLaunchKernel, .-__cudaLaunchKernel\n");

API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) {
    API_ENTER();
    if (!config || !func) return set_err(cudaErrorInvalidValue);
    COUNT(launch_kernel_ex);
    INIT_OR_FAIL();
    COUNT(launches_runtime);
    CUlaunchConfig c = {config->gridDim.x, config->gridDim.y, config->gridDim.z, config->blockDim.x,
                        config->blockDim.y, config->blockDim.z, (unsigned)config->dynamicSmemBytes,
                        config->stream, NULL, 0};
    int e = D.cuLaunchKernelEx(&c, (CUfunction)func, args, NULL);
    return set_err(e);
}

API cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                            size_t sharedMem, cudaStream_t stream) {
    API_ENTER();
    if (!func) return set_err(cudaErrorInvalidValue);
    COUNT(coop_launch);
    INIT_OR_FAIL();
    COUNT(launches_runtime);
    int e = D.cuLaunchCooperativeKernel((CUfunction)func, gridDim.x, gridDim.y, gridDim.z, blockDim.x,
                                        blockDim.y, blockDim.z, (unsigned)sharedMem, stream, args);
    return set_err(e);
}

API cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    API_ENTER();
    if (!graphExec) return set_err(cudaErrorInvalidResourceHandle);
    COUNT(graph_launch);
    INIT_OR_FAIL();
    COUNT(launches_runtime);
    int e = D.cuGraphLaunch(graphExec, stream);
    return set_err(e);
}

/* ---------------------------------------------------------------- copies --------------------- */

API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    API_ENTER();
    COUNT(memcpy_calls);
    if ((int)kind < 0 || (int)kind > 4) return set_err(cudaErrorInvalidValue);
    INIT_OR_FAIL();
    int e;
    switch (kind) {
    case cudaMemcpyHostToDevice: e = D.cuMemcpyHtoD(DP(dst), src, count); break;
    case cudaMemcpyDeviceToHost: e = D.cuMemcpyDtoH(dst, DP(src), count); break;
    case cudaMemcpyDeviceToDevice: e = D.cuMemcpyDtoD(DP(dst), DP(src), count); break;
    default: e = D.cuMemcpy(DP(dst), DP(src), count); break; /* H2H, default: by the pointers */
    }
    return set_err(e);
}

API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                cudaStream_t stream) {
    API_ENTER();
    COUNT(memcpy_async_calls);
    if ((int)kind < 0 || (int)kind > 4) return set_err(cudaErrorInvalidValue);
    INIT_OR_FAIL();
    int e;
    switch (kind) {
    case cudaMemcpyHostToDevice: e = D.cuMemcpyHtoDAsync(DP(dst), src, count, stream); break;
    case cudaMemcpyDeviceToHost: e = D.cuMemcpyDtoHAsync(dst, DP(src), count, stream); break;
    case cudaMemcpyDeviceToDevice: e = D.cuMemcpyDtoDAsync(DP(dst), DP(src), count, stream); break;
    default: e = D.cuMemcpyAsync(DP(dst), DP(src), count, stream); break;
    }
    return set_err(e);
}

API cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                                    cudaStream_t stream) {
    API_ENTER();
    COUNT(memcpy_peer_calls);
    if (dstDevice != 0 || srcDevice != 0) return set_err(cudaErrorInvalidDevice);
    INIT_OR_FAIL();
    CUcontext ctx = NULL;
    int e = D.cuCtxGetCurrent(&ctx);
    if (!e) e = D.cuMemcpyPeerAsync(DP(dst), ctx, DP(src), ctx, count, stream);
    return set_err(e);
}

/* ---------------------------------------------------------------- syncs, streams ------------- */

API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    API_ENTER();
    COUNT(stream_sync);
    INIT_OR_FAIL();
    int e = D.cuStreamSynchronize(stream);
    return set_err(e);
}

API cudaError_t cudaDeviceSynchronize(void) {
    API_ENTER();
    COUNT(device_sync);
    INIT_OR_FAIL();
    int e = D.cuCtxSynchronize();
    return set_err(e);
}

API cudaError_t cudaStreamQuery(cudaStream_t stream) {
    API_ENTER();
    INIT_OR_FAIL();
    int e = D.cuStreamQuery(stream);
    return set_err(e);
}

API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    API_ENTER();
    if (!pStream) return set_err(cudaErrorInvalidValue);
    INIT_OR_FAIL();
    int e = D.cuStreamCreate(pStream, flags);
    return set_err(e);
}

API cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    API_ENTER();
    return cudaStreamCreateWithFlags(pStream, 0);
}

API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    API_ENTER();
    INIT_OR_FAIL();
    int e = D.cuStreamDestroy(stream);
    return set_err(e);
}

/* ---------------------------------------------------------------- events --------------------- */

API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    API_ENTER();
    if (!event) return set_err(cudaErrorInvalidValue);
    INIT_OR_FAIL();
    int e = D.cuEventCreate(event, flags);
    return set_err(e);
}

API cudaError_t cudaEventCreate(cudaEvent_t *event) {
    API_ENTER();
    return cudaEventCreateWithFlags(event, 0);
}

API cudaError_t cudaEventDestroy(cudaEvent_t event) {
    API_ENTER();
    INIT_OR_FAIL();
    int e = D.cuEventDestroy(event);
    return set_err(e);
}

API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    API_ENTER();
    COUNT(event_record);
    INIT_OR_FAIL();
    int e = D.cuEventRecord(event, stream);
    return set_err(e);
}

API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    API_ENTER();
    COUNT(event_sync);
    INIT_OR_FAIL();
    int e = D.cuEventSynchronize(event);
    return set_err(e);
}

API cudaError_t cudaEventQuery(cudaEvent_t event) {
    API_ENTER();
    INIT_OR_FAIL();
    int e = D.cuEventQuery(event);
    return set_err(e);
}

API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    API_ENTER();
    INIT_OR_FAIL();
    int e = D.cuEventElapsedTime(ms, start, end);
    return set_err(e);
}

/* ---------------------------------------------------------------- memory --------------------- */

API cudaError_t cudaMalloc(void **devPtr, size_t size) {
    API_ENTER();
    if (!devPtr) return set_err(cudaErrorInvalidValue);
    INIT_OR_FAIL();
    COUNT(malloc_calls);
    CUdeviceptr p = 0;
    int e = D.cuMemAlloc(&p, size);
    if (!e) *devPtr = (void *)(uintptr_t)p;
    return set_err(e);
}

API cudaError_t cudaFree(void *devPtr) {
    API_ENTER();
    INIT_OR_FAIL();
    if (!devPtr) return cudaSuccess; /* cudaFree(0) is the classic "init the context" call */
    COUNT(free_calls);
    int e = D.cuMemFree(DP(devPtr)); /* synchronises, like the real one */
    return set_err(e);
}

API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    API_ENTER();
    if (!pHost) return set_err(cudaErrorInvalidValue);
    INIT_OR_FAIL();
    COUNT(malloc_host_calls);
    int e = D.cuMemHostAlloc(pHost, size, flags);
    return set_err(e);
}

API cudaError_t cudaMallocHost(void **ptr, size_t size) {
    API_ENTER();
    if (!ptr) return set_err(cudaErrorInvalidValue);
    INIT_OR_FAIL();
    COUNT(malloc_host_calls);
    int e = D.cuMemAllocHost(ptr, size);
    return set_err(e);
}

API cudaError_t cudaFreeHost(void *ptr) {
    API_ENTER();
    if (!ptr) return cudaSuccess;
    COUNT(free_host_calls);
    INIT_OR_FAIL();
    int e = D.cuMemFreeHost(ptr); /* synchronises, like the real one */
    return set_err(e);
}

/* ---------------------------------------------------------------- device info ---------------- */

API cudaError_t cudaGetDeviceCount(int *count) {
    API_ENTER();
    if (!count) return set_err(cudaErrorInvalidValue);
    INIT_OR_FAIL();
    int e = D.cuDeviceGetCount(count);
    return set_err(e);
}

/* The current device is per thread, as in the real runtime (default 0). */
static __thread int t_device;

API cudaError_t cudaGetDevice(int *device) {
    API_ENTER();
    if (!device) return set_err(cudaErrorInvalidValue);
    *device = t_device;
    return cudaSuccess;
}

/* Like the real runtime: the device's primary context becomes the thread's current context. */
API cudaError_t cudaSetDevice(int device) {
    API_ENTER();
    INIT_OR_FAIL();
    int dev = 0;
    CUcontext ctx = NULL;
    int e = D.cuDeviceGet(&dev, device);
    if (!e) e = D.cuDevicePrimaryCtxRetain(&ctx, dev);
    if (!e) e = D.cuCtxSetCurrent(ctx);
    if (!e) t_device = device;
    return set_err(e);
}

API cudaError_t cudaGetLastError(void) {
    API_ENTER();
    int e = g_last_error;
    g_last_error = 0;
    return e;
}

API cudaError_t cudaPeekAtLastError(void) {
    API_ENTER();
    return g_last_error;
}

API const char *cudaGetErrorName(cudaError_t e) {
    API_ENTER();
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
    }
}

API const char *cudaGetErrorString(cudaError_t e) {
    API_ENTER();
    return cudaGetErrorName(e);
}

API cudaError_t cudaRuntimeGetVersion(int *v) {
    API_ENTER();
    if (!v) return set_err(cudaErrorInvalidValue);
    *v = FAKECUDA_VERSION;
    return cudaSuccess;
}

API cudaError_t cudaDriverGetVersion(int *v) {
    API_ENTER();
    if (!v) return set_err(cudaErrorInvalidValue);
    INIT_OR_FAIL();
    int e = D.cuDriverGetVersion(v);
    return set_err(e);
}

/* ---------------------------------------------------------------- test controls -------------- */
/* Implemented by the driver; these forward (the driver is loaded on first use). */

API void fakecuda_set_kernel_ns(uint64_t ns) {
    if (rt_init() == 0 && D.set_kernel_ns) D.set_kernel_ns(ns);
}
API uint64_t fakecuda_get_kernel_ns(void) {
    return rt_init() == 0 && D.get_kernel_ns ? D.get_kernel_ns() : 0;
}
API void fakecuda_set_bandwidth(uint64_t bytes_per_s) {
    if (rt_init() == 0 && D.set_bandwidth) D.set_bandwidth(bytes_per_s);
}
API uint64_t fakecuda_get_bandwidth(void) {
    return rt_init() == 0 && D.get_bandwidth ? D.get_bandwidth() : 0;
}

/* The driver's counters with this runtime's API-call counters in place of the driver's. */
API size_t fakecuda_stats(void *out, size_t size) {
    struct fakecuda_stats s;
    memset(&s, 0, sizeof s);
    s.version = FAKECUDA_STATS_VERSION;
    if (rt_init() == 0 && D.stats) D.stats(&s, sizeof s);
#define RT(f) s.f = __atomic_load_n(&g_rt.f, __ATOMIC_RELAXED)
    RT(launch_kernel); RT(launch_kernel_ex); RT(graph_launch); RT(memcpy_calls); RT(memcpy_async_calls);
    RT(stream_sync); RT(device_sync); RT(event_sync); RT(event_record); RT(malloc_calls); RT(free_calls);
    RT(malloc_host_calls); RT(free_host_calls); RT(api_calls); RT(coop_launch); RT(memcpy_peer_calls);
#undef RT
    if (out) memcpy(out, &s, size < sizeof s ? size : sizeof s);
    return sizeof s;
}

API size_t fakecuda_stats_fields(void) { return sizeof(struct fakecuda_stats) / sizeof(uint64_t); }

API uint64_t fakecuda_pending(void) {
    return rt_init() == 0 && D.pending ? D.pending() : 0;
}
