/* Layout of fakecuda_stats() (stand-in driver libcuda.so.1 and stand-in runtime libcudart.so.*);
 * append only, bump FAKECUDA_STATS_VERSION. Every field is a uint64_t. See tests/README.md. */
#ifndef FAKECUDA_STATS_H
#define FAKECUDA_STATS_H
#include <stdint.h>

#define FAKECUDA_STATS_VERSION 2

struct fakecuda_stats {
    uint64_t version;              /* FAKECUDA_STATS_VERSION */
    /* API-call counters: read through the runtime, its cuda* calls (as in version 1); read from
     * the driver directly, the driver's cu* calls from every caller. */
    uint64_t launch_kernel;        /* rt: cudaLaunchKernel (incl. __cudaLaunchKernel); drv: cuLaunchKernel(_ptsz) */
    uint64_t launch_kernel_ex;     /* rt: cudaLaunchKernelExC; drv: cuLaunchKernelEx(_ptsz) */
    uint64_t graph_launch;         /* rt: cudaGraphLaunch; drv: cuGraphLaunch(_ptsz) */
    uint64_t memcpy_calls;         /* rt: cudaMemcpy; drv: synchronous cuMemcpy* */
    uint64_t memcpy_async_calls;   /* rt: cudaMemcpyAsync; drv: cuMemcpy*Async (not peer) */
    /* device counters (always the driver's) */
    uint64_t bytes_h2h, bytes_h2d, bytes_d2h, bytes_d2d; /* by resolved kind, every copy entry point */
    uint64_t copies_h2d, copies_d2h; /* number of copies by resolved kind */
    uint64_t stream_sync;          /* rt: cudaStreamSynchronize; drv: cuStreamSynchronize(_ptsz) */
    uint64_t device_sync;          /* rt: cudaDeviceSynchronize; drv: cuCtxSynchronize */
    uint64_t event_sync;           /* rt: cudaEventSynchronize; drv: cuEventSynchronize */
    uint64_t event_record;         /* rt: cudaEventRecord; drv: cuEventRecord(_ptsz) */
    uint64_t kernel_ns_enqueued;   /* simulated kernel time enqueued (kernels + graphs) */
    uint64_t kernel_ns_executed;   /* simulated kernel time the device has finished */
    uint64_t copy_ns_executed;     /* simulated copy time on the device timeline */
    uint64_t ops_enqueued, ops_completed;
    uint64_t host_blocked_ns;      /* time callers spent blocked in syncs and blocking copies */
    uint64_t malloc_calls, free_calls, malloc_host_calls, free_host_calls; /* rt: cuda*; drv: cuMem* */
    uint64_t api_calls;            /* rt: calls of any cuda* API function; drv: of any cu* entry point */
    /* version 2 */
    uint64_t launches_runtime;     /* driver launches made by stand-in runtimes (their own count) */
    uint64_t launches_library;     /* made by vendor libraries with their own runtime copy (their count) */
    uint64_t launches_direct;      /* made by callers of the driver's exports (Triton shape; their count) */
    uint64_t launches_driver;      /* the driver's own count of every launch entry point call */
    uint64_t coop_launch;          /* rt: cudaLaunchCooperativeKernel; drv: cuLaunchCooperativeKernel(_ptsz) */
    uint64_t memcpy_peer_calls;    /* rt: cudaMemcpyPeerAsync; drv: cuMemcpyPeerAsync(_ptsz) */
    uint64_t procaddr_calls;       /* cuGetProcAddress(_v2) calls */
    uint64_t procaddr_internal;    /* pointers handed out that are not the exported function */
};

/* Paths of fakecuda_register_launch_counter() */
enum { FAKECUDA_PATH_RUNTIME = 0, FAKECUDA_PATH_LIBRARY = 1, FAKECUDA_PATH_DIRECT = 2 };

#endif
