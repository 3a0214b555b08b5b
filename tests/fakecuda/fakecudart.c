/*
 * Stand-in CUDA runtime (libcudart.so.12 / .13) for machines without a GPU.
 *
 * It exports the part of the libcudart API that torch uses, with the real signatures, the real
 * return codes and the real SONAME / symbol version, and drives a *simulated device*:
 *
 *   - one device thread executes a single FIFO queue of operations (kernels, graph launches,
 *     asynchronous copies, event markers). All streams share this queue (simplification: real
 *     streams may overlap; here everything is serialised in issue order).
 *   - The device thread keeps its own timeline: an operation starts at max(now, end of previous)
 *     and ends `duration` later; the thread sleeps until that absolute CLOCK_MONOTONIC time.
 *   - Kernel launches (cudaLaunchKernel, __cudaLaunchKernel, cudaLaunchKernelExC) and
 *     cudaGraphLaunch are asynchronous: they enqueue an operation whose duration is the calling
 *     thread's current kernel time (fakecuda_set_kernel_ns, default 10 us) and return at once.
 *   - Copies take bytes / bandwidth (fakecuda_set_bandwidth, default 10e9 bytes/s, global).
 *     The simplified copy model (documented in tests/README.md):
 *       cudaMemcpy (any kind)            enqueue copy, block until it completes (so it waits for
 *                                        the whole queue first, then for the copy).
 *       cudaMemcpyAsync H2D, pinned src  enqueue copy, return at once.
 *       cudaMemcpyAsync H2D, pageable    host-blocking staging copy of bytes/bandwidth (does NOT
 *                                        wait for the queue), then enqueue the DMA (same duration).
 *       cudaMemcpyAsync D2H, pinned dst  enqueue copy, return at once.
 *       cudaMemcpyAsync D2H, pageable    enqueue copy, block until it completes (waits for the
 *                                        queue to drain, then the copy).
 *       cudaMemcpyAsync D2D              enqueue copy (bytes / (10 * bandwidth)), return at once.
 *       cudaMemcpyAsync H2H              host memcpy, blocking for bytes/bandwidth.
 *       kind 4 (default)                 resolved from the pointers (cudaMalloc'd = device).
 *     "Pinned" = allocated by cudaMallocHost / cudaHostAlloc. "Device" memory is host memory
 *     from malloc, so copies really move the bytes when both pointers are valid.
 *   - cudaStreamSynchronize / cudaDeviceSynchronize block until the queue is empty (every stream,
 *     since there is one queue). cudaEventRecord enqueues a marker; cudaEventSynchronize blocks
 *     until the device reached it; cudaEventElapsedTime uses the device timeline.
 *   - A process forked from one that used the device gets cudaErrorInitializationError (3) from
 *     every call, like the real runtime in a forked child.
 *
 * Counters for cross-checking are read with fakecuda_stats().
 *
 * Build: see build.sh (matches the real library's prologues: push %rbp; mov %rsp,%rbp, no endbr64).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default"), noinline))

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
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

/* ---------------------------------------------------------------- stats ---------------------- */

/* Layout of fakecuda_stats(); append only. Every field is a uint64_t. */
struct fakecuda_stats {
    uint64_t version;              /* 1 */
    uint64_t launch_kernel;        /* cudaLaunchKernel calls (incl. those through __cudaLaunchKernel) */
    uint64_t launch_kernel_ex;     /* cudaLaunchKernelExC calls */
    uint64_t graph_launch;         /* cudaGraphLaunch calls */
    uint64_t memcpy_calls;         /* cudaMemcpy calls */
    uint64_t memcpy_async_calls;   /* cudaMemcpyAsync calls */
    uint64_t bytes_h2h, bytes_h2d, bytes_d2h, bytes_d2d; /* by resolved kind, both copy APIs */
    uint64_t copies_h2d, copies_d2h; /* number of copies by resolved kind */
    uint64_t stream_sync;          /* cudaStreamSynchronize calls */
    uint64_t device_sync;          /* cudaDeviceSynchronize calls */
    uint64_t event_sync;           /* cudaEventSynchronize calls */
    uint64_t event_record;         /* cudaEventRecord calls */
    uint64_t kernel_ns_enqueued;   /* simulated kernel time enqueued (kernels + graphs) */
    uint64_t kernel_ns_executed;   /* simulated kernel time the device has finished */
    uint64_t copy_ns_executed;     /* simulated copy time on the device timeline */
    uint64_t ops_enqueued, ops_completed;
    uint64_t host_blocked_ns;      /* time callers spent blocked in syncs and blocking copies */
    uint64_t malloc_calls, free_calls, malloc_host_calls, free_host_calls;
    uint64_t api_calls;            /* calls of any cuda* API function */
};

static struct fakecuda_stats g_stats = { .version = 1 };

/* Like the real runtime (which starts every API function by calling its context lookup), each API
 * function first calls the runtime's entry hook through a pointer; this also keeps a frame
 * (push %rbp; mov %rsp,%rbp) at the start of leaf-like functions, as in the real library. */
static void api_hook(void) { __atomic_add_fetch(&g_stats.api_calls, 1, __ATOMIC_RELAXED); }
static void (*volatile g_api_hook)(void) = api_hook;
#define API_ENTER() g_api_hook()

/* ---------------------------------------------------------------- device --------------------- */

enum op_type { OP_KERNEL = 1, OP_COPY = 2, OP_EVENT = 3 };
struct op {
    struct op *next;
    uint64_t seq;
    uint64_t dur_ns;
    int type;
    void *dst;
    const void *src;
    size_t bytes;
    struct fake_event *event;
    void *staging; /* freed when the op completes */
};
struct fake_event {
    uint64_t magic;
    uint64_t seq;      /* queue position recorded; 0 = never recorded (complete) */
    uint64_t done_ns;  /* device time the marker was reached */
};
#define EVENT_MAGIC 0x6576656e74ull

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_done = PTHREAD_COND_INITIALIZER;
static struct op *g_head, *g_tail;
static uint64_t g_enqueued, g_completed; /* sequence numbers */
static uint64_t g_device_free_at;        /* device timeline: end of the last operation */
static int g_started;
static pid_t g_owner_pid;                 /* process that started the device */
static volatile uint64_t g_bandwidth = 10000000000ull; /* bytes per second */
static __thread uint64_t t_kernel_ns = 10000;
static int g_last_error;

/* pinned host allocations and device allocations, for kind resolution */
struct region { uintptr_t base; size_t len; int device; struct region *next; };
static struct region *g_regions;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    struct timespec ts = { (time_t)(t / 1000000000ull), (long)(t % 1000000000ull) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static uint64_t copy_ns(size_t bytes, int kind) {
    uint64_t bw = g_bandwidth ? g_bandwidth : 1;
    if (kind == cudaMemcpyDeviceToDevice) bw *= 10;
    return (uint64_t)((unsigned __int128)bytes * 1000000000ull / bw);
}

static void *device_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_mu);
    for (;;) {
        while (!g_head) pthread_cond_wait(&g_work, &g_mu);
        struct op *o = g_head;
        uint64_t start = now_ns();
        if (g_device_free_at > start) start = g_device_free_at;
        uint64_t end = start + o->dur_ns;
        g_device_free_at = end;
        pthread_mutex_unlock(&g_mu);
        if (o->type == OP_COPY && o->dst && o->src && o->bytes) memmove(o->dst, o->src, o->bytes);
        sleep_until(end);
        pthread_mutex_lock(&g_mu);
        g_head = o->next;
        if (!g_head) g_tail = NULL;
        g_completed = o->seq;
        g_stats.ops_completed++;
        if (o->type == OP_KERNEL) g_stats.kernel_ns_executed += o->dur_ns;
        if (o->type == OP_COPY) g_stats.copy_ns_executed += o->dur_ns;
        if (o->type == OP_EVENT && o->event) o->event->done_ns = end;
        pthread_cond_broadcast(&g_done);
        /* free outside the lock: releasing a large staging buffer (munmap) can take ms */
        pthread_mutex_unlock(&g_mu);
        free(o->staging);
        free(o);
        pthread_mutex_lock(&g_mu);
    }
    return NULL;
}

static void after_fork_child(void) {
    /* The child has no device thread; the runtime is unusable there (like real CUDA). */
    pthread_mutex_init(&g_mu, NULL);
    pthread_cond_init(&g_work, NULL);
    pthread_cond_init(&g_done, NULL);
}

/* Returns 0 when the device is usable (starting it if needed), else a CUDA error. Call unlocked. */
static int device_ready(void) {
    pid_t me = getpid();
    if (__atomic_load_n(&g_started, __ATOMIC_ACQUIRE)) return g_owner_pid == me ? 0 : cudaErrorInitializationError;
    pthread_mutex_lock(&g_mu);
    if (!g_started) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &at, device_main, NULL) != 0) {
            pthread_mutex_unlock(&g_mu);
            return cudaErrorInitializationError;
        }
        pthread_setname_np(th, "fakecuda-dev");
        pthread_atfork(NULL, NULL, after_fork_child);
        g_owner_pid = me;
        __atomic_store_n(&g_started, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_mu);
    return g_owner_pid == me ? 0 : cudaErrorInitializationError;
}

/* Enqueues an op; returns it (its seq is the queue position). Call with g_mu held. The op is
 * freed by the device thread: use the result only while g_mu is still held. */
static struct op *enqueue_locked(int type, uint64_t dur, void *dst, const void *src, size_t bytes, struct fake_event *ev) {
    struct op *o = calloc(1, sizeof *o);
    o->type = type;
    o->dur_ns = dur;
    o->dst = dst;
    o->src = src;
    o->bytes = bytes;
    o->event = ev;
    o->seq = ++g_enqueued;
    if (g_tail) g_tail->next = o; else g_head = o;
    g_tail = o;
    g_stats.ops_enqueued++;
    pthread_cond_signal(&g_work);
    return o;
}

static void wait_seq_locked(uint64_t seq) {
    while (g_completed < seq) pthread_cond_wait(&g_done, &g_mu);
}

static int set_err(int e) {
    if (e) g_last_error = e;
    return e;
}

static struct region *find_region(const void *p) {
    uintptr_t a = (uintptr_t)p;
    for (struct region *r = g_regions; r; r = r->next)
        if (a >= r->base && a < r->base + (r->len ? r->len : 1)) return r;
    return NULL;
}

/* 1 device, 0 pinned host, -1 unknown (pageable host). Call with g_mu held. */
static int ptr_class(const void *p) {
    struct region *r = find_region(p);
    return r ? r->device : -1;
}

static void add_region(void *p, size_t len, int device) {
    struct region *r = malloc(sizeof *r);
    r->base = (uintptr_t)p;
    r->len = len;
    r->device = device;
    pthread_mutex_lock(&g_mu);
    r->next = g_regions;
    g_regions = r;
    pthread_mutex_unlock(&g_mu);
}

static int remove_region(void *p, int device) {
    pthread_mutex_lock(&g_mu);
    for (struct region **pp = &g_regions; *pp; pp = &(*pp)->next) {
        if ((*pp)->base == (uintptr_t)p && (*pp)->device == device) {
            struct region *r = *pp;
            *pp = r->next;
            pthread_mutex_unlock(&g_mu);
            free(r);
            return 1;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return 0;
}

static int launch(uint64_t dur) {
    int e = device_ready();
    if (e) return set_err(e);
    pthread_mutex_lock(&g_mu);
    enqueue_locked(OP_KERNEL, dur, NULL, NULL, 0, NULL);
    g_stats.kernel_ns_enqueued += dur;
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

/* ---------------------------------------------------------------- launches ------------------- */

API cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                 size_t sharedMem, cudaStream_t stream) {
    API_ENTER();
    (void)gridDim; (void)blockDim; (void)args; (void)sharedMem; (void)stream;
    if (!func) return set_err(cudaErrorInvalidValue);
    __atomic_add_fetch(&g_stats.launch_kernel, 1, __ATOMIC_RELAXED);
    return launch(t_kernel_ns);
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
    (void)args;
    if (!config || !func) return set_err(cudaErrorInvalidValue);
    __atomic_add_fetch(&g_stats.launch_kernel_ex, 1, __ATOMIC_RELAXED);
    return launch(t_kernel_ns);
}

API cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    API_ENTER();
    (void)stream;
    if (!graphExec) return set_err(cudaErrorInvalidResourceHandle);
    __atomic_add_fetch(&g_stats.graph_launch, 1, __ATOMIC_RELAXED);
    return launch(t_kernel_ns);
}

/* ---------------------------------------------------------------- copies --------------------- */

static int resolve_kind(int kind, const void *dst, const void *src) {
    if (kind != cudaMemcpyDefault) return kind;
    int d = ptr_class(dst) == 1, s = ptr_class(src) == 1;
    if (d && s) return cudaMemcpyDeviceToDevice;
    if (d) return cudaMemcpyHostToDevice;
    if (s) return cudaMemcpyDeviceToHost;
    return cudaMemcpyHostToHost;
}

static void count_copy_locked(int kind, size_t n) {
    switch (kind) {
    case cudaMemcpyHostToHost: g_stats.bytes_h2h += n; break;
    case cudaMemcpyHostToDevice: g_stats.bytes_h2d += n; g_stats.copies_h2d++; break;
    case cudaMemcpyDeviceToHost: g_stats.bytes_d2h += n; g_stats.copies_d2h++; break;
    case cudaMemcpyDeviceToDevice: g_stats.bytes_d2d += n; break;
    }
}

static int do_copy(void *dst, const void *src, size_t count, int kind, int async) {
    if (kind < 0 || kind > 4) return set_err(cudaErrorInvalidValue);
    int e = device_ready();
    if (e) return set_err(e);
    uint64_t t0 = now_ns();
    pthread_mutex_lock(&g_mu);
    int k = resolve_kind(kind, dst, src);
    count_copy_locked(k, count);
    uint64_t dur = copy_ns(count, k);
    if (k == cudaMemcpyHostToHost) {
        pthread_mutex_unlock(&g_mu);
        if (dst && src && count) memmove(dst, src, count);
        sleep_until(t0 + dur);
        pthread_mutex_lock(&g_mu);
    } else if (!async) {
        wait_seq_locked(enqueue_locked(OP_COPY, dur, dst, src, count, NULL)->seq);
    } else if (k == cudaMemcpyHostToDevice && ptr_class(src) != 0) {
        /* pageable source: host-blocking staging copy (the caller may free src as soon as we
         * return), then the DMA from the staging buffer runs on the device. */
        pthread_mutex_unlock(&g_mu);
        void *staging = (src && count) ? malloc(count) : NULL;
        if (staging) memcpy(staging, src, count);
        sleep_until(t0 + dur);
        pthread_mutex_lock(&g_mu);
        enqueue_locked(OP_COPY, dur, dst, staging, count, NULL)->staging = staging;
    } else if (k == cudaMemcpyDeviceToHost && ptr_class(dst) != 0) {
        /* pageable destination: returns only once the copy has completed. */
        wait_seq_locked(enqueue_locked(OP_COPY, dur, dst, src, count, NULL)->seq);
    } else {
        enqueue_locked(OP_COPY, dur, dst, src, count, NULL);
    }
    g_stats.host_blocked_ns += now_ns() - t0;
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    API_ENTER();
    __atomic_add_fetch(&g_stats.memcpy_calls, 1, __ATOMIC_RELAXED);
    return do_copy(dst, src, count, (int)kind, 0);
}

API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                cudaStream_t stream) {
    API_ENTER();
    (void)stream;
    __atomic_add_fetch(&g_stats.memcpy_async_calls, 1, __ATOMIC_RELAXED);
    return do_copy(dst, src, count, (int)kind, 1);
}

/* ---------------------------------------------------------------- syncs ---------------------- */

static int drain(uint64_t *counter) {
    int e = device_ready();
    if (e) return set_err(e);
    uint64_t t0 = now_ns();
    pthread_mutex_lock(&g_mu);
    (*counter)++;
    wait_seq_locked(g_enqueued);
    g_stats.host_blocked_ns += now_ns() - t0;
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    API_ENTER();
    (void)stream;
    return drain(&g_stats.stream_sync);
}

API cudaError_t cudaDeviceSynchronize(void) {
    API_ENTER();
    return drain(&g_stats.device_sync);
}

API cudaError_t cudaStreamQuery(cudaStream_t stream) {
    API_ENTER();
    (void)stream;
    int e = device_ready();
    if (e) return set_err(e);
    pthread_mutex_lock(&g_mu);
    int busy = g_completed < g_enqueued;
    pthread_mutex_unlock(&g_mu);
    return busy ? cudaErrorNotReady : cudaSuccess;
}

API cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    API_ENTER();
    static uintptr_t next = 0x5000;
    if (!pStream) return set_err(cudaErrorInvalidValue);
    int e = device_ready();
    if (e) return set_err(e);
    *pStream = (cudaStream_t)__atomic_add_fetch(&next, 0x10, __ATOMIC_RELAXED);
    return cudaSuccess;
}

API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    API_ENTER();
    (void)flags;
    return cudaStreamCreate(pStream);
}

API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    API_ENTER();
    (void)stream;
    return cudaSuccess;
}

/* ---------------------------------------------------------------- events --------------------- */

API cudaError_t cudaEventCreate(cudaEvent_t *event) {
    API_ENTER();
    if (!event) return set_err(cudaErrorInvalidValue);
    int e = device_ready();
    if (e) return set_err(e);
    struct fake_event *ev = calloc(1, sizeof *ev);
    ev->magic = EVENT_MAGIC;
    *event = (cudaEvent_t)ev;
    return cudaSuccess;
}

API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    API_ENTER();
    (void)flags;
    return cudaEventCreate(event);
}

API cudaError_t cudaEventDestroy(cudaEvent_t event) {
    API_ENTER();
    struct fake_event *ev = (struct fake_event *)event;
    if (!ev || ev->magic != EVENT_MAGIC) return set_err(cudaErrorInvalidResourceHandle);
    /* Leaked on purpose if still queued; mark dead. */
    pthread_mutex_lock(&g_mu);
    int pending = g_completed < ev->seq;
    pthread_mutex_unlock(&g_mu);
    if (!pending) {
        ev->magic = 0;
        free(ev);
    }
    return cudaSuccess;
}

API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    API_ENTER();
    (void)stream;
    struct fake_event *ev = (struct fake_event *)event;
    if (!ev || ev->magic != EVENT_MAGIC) return set_err(cudaErrorInvalidResourceHandle);
    int e = device_ready();
    if (e) return set_err(e);
    pthread_mutex_lock(&g_mu);
    g_stats.event_record++;
    ev->done_ns = 0;
    ev->seq = enqueue_locked(OP_EVENT, 0, NULL, NULL, 0, ev)->seq;
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    API_ENTER();
    struct fake_event *ev = (struct fake_event *)event;
    if (!ev || ev->magic != EVENT_MAGIC) return set_err(cudaErrorInvalidResourceHandle);
    int e = device_ready();
    if (e) return set_err(e);
    uint64_t t0 = now_ns();
    pthread_mutex_lock(&g_mu);
    g_stats.event_sync++;
    wait_seq_locked(ev->seq);
    g_stats.host_blocked_ns += now_ns() - t0;
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

API cudaError_t cudaEventQuery(cudaEvent_t event) {
    API_ENTER();
    struct fake_event *ev = (struct fake_event *)event;
    if (!ev || ev->magic != EVENT_MAGIC) return set_err(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_mu);
    int busy = g_completed < ev->seq;
    pthread_mutex_unlock(&g_mu);
    return busy ? cudaErrorNotReady : cudaSuccess;
}

API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    API_ENTER();
    struct fake_event *a = (struct fake_event *)start, *b = (struct fake_event *)end;
    if (!ms || !a || !b || a->magic != EVENT_MAGIC || b->magic != EVENT_MAGIC) return set_err(cudaErrorInvalidValue);
    if (!a->done_ns || !b->done_ns) return cudaErrorNotReady;
    *ms = (float)((double)((int64_t)(b->done_ns - a->done_ns)) / 1e6);
    return cudaSuccess;
}

/* ---------------------------------------------------------------- memory --------------------- */

API cudaError_t cudaMalloc(void **devPtr, size_t size) {
    API_ENTER();
    if (!devPtr) return set_err(cudaErrorInvalidValue);
    int e = device_ready();
    if (e) return set_err(e);
    __atomic_add_fetch(&g_stats.malloc_calls, 1, __ATOMIC_RELAXED);
    void *p = malloc(size ? size : 1);
    if (!p) return set_err(cudaErrorMemoryAllocation);
    add_region(p, size, 1);
    *devPtr = p;
    return cudaSuccess;
}

API cudaError_t cudaFree(void *devPtr) {
    API_ENTER();
    if (!devPtr) return cudaSuccess; /* cudaFree(0) is the classic "init the context" call */
    __atomic_add_fetch(&g_stats.free_calls, 1, __ATOMIC_RELAXED);
    /* Real cudaFree synchronises the device. */
    int e = device_ready();
    if (e) return set_err(e);
    pthread_mutex_lock(&g_mu);
    wait_seq_locked(g_enqueued);
    pthread_mutex_unlock(&g_mu);
    if (!remove_region(devPtr, 1)) return set_err(cudaErrorInvalidValue);
    free(devPtr);
    return cudaSuccess;
}

API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    API_ENTER();
    (void)flags;
    if (!pHost) return set_err(cudaErrorInvalidValue);
    int e = device_ready();
    if (e) return set_err(e);
    __atomic_add_fetch(&g_stats.malloc_host_calls, 1, __ATOMIC_RELAXED);
    void *p = malloc(size ? size : 1);
    if (!p) return set_err(cudaErrorMemoryAllocation);
    add_region(p, size, 0);
    *pHost = p;
    return cudaSuccess;
}

API cudaError_t cudaMallocHost(void **ptr, size_t size) {
    API_ENTER();
    return cudaHostAlloc(ptr, size, 0);
}

API cudaError_t cudaFreeHost(void *ptr) {
    API_ENTER();
    if (!ptr) return cudaSuccess;
    __atomic_add_fetch(&g_stats.free_host_calls, 1, __ATOMIC_RELAXED);
    /* Real cudaFreeHost synchronises the device. */
    if (device_ready() == 0) {
        pthread_mutex_lock(&g_mu);
        wait_seq_locked(g_enqueued);
        pthread_mutex_unlock(&g_mu);
    }
    if (!remove_region(ptr, 0)) return set_err(cudaErrorInvalidValue);
    free(ptr);
    return cudaSuccess;
}

/* ---------------------------------------------------------------- device info ---------------- */

API cudaError_t cudaGetDeviceCount(int *count) {
    API_ENTER();
    if (!count) return set_err(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}

API cudaError_t cudaGetDevice(int *device) {
    API_ENTER();
    if (!device) return set_err(cudaErrorInvalidValue);
    *device = 0;
    return cudaSuccess;
}

API cudaError_t cudaSetDevice(int device) {
    API_ENTER();
    return device == 0 ? cudaSuccess : set_err(101 /* cudaErrorInvalidDevice */);
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
    return cudaRuntimeGetVersion(v);
}

/* ---------------------------------------------------------------- test controls -------------- */

/* Duration of the kernels (and graphs) the calling thread launches from now on. */
API void fakecuda_set_kernel_ns(uint64_t ns) { t_kernel_ns = ns; }
API uint64_t fakecuda_get_kernel_ns(void) { return t_kernel_ns; }

/* Copy bandwidth in bytes per second (global). D2D copies run at 10x. */
API void fakecuda_set_bandwidth(uint64_t bytes_per_s) { g_bandwidth = bytes_per_s ? bytes_per_s : 1; }
API uint64_t fakecuda_get_bandwidth(void) { return g_bandwidth; }

/* Copies the counters into *out (at most `size` bytes); returns sizeof(struct fakecuda_stats). */
API size_t fakecuda_stats(void *out, size_t size) {
    pthread_mutex_lock(&g_mu);
    struct fakecuda_stats s = g_stats;
    pthread_mutex_unlock(&g_mu);
    if (out) memcpy(out, &s, size < sizeof s ? size : sizeof s);
    return sizeof s;
}

/* Number of uint64 fields in the stats struct. */
API size_t fakecuda_stats_fields(void) { return sizeof(struct fakecuda_stats) / sizeof(uint64_t); }

/* Operations enqueued but not yet finished by the device. */
API uint64_t fakecuda_pending(void) {
    pthread_mutex_lock(&g_mu);
    uint64_t n = g_enqueued - g_completed;
    pthread_mutex_unlock(&g_mu);
    return n;
}
