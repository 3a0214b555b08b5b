/*
 * Stand-in CUDA driver (libcuda.so.1) for machines without a GPU. It owns the simulated device;
 * the stand-in runtime (fakecudart.c), the stand-in vendor library (fakeblas.c) and the Triton-shape
 * launcher (faketriton.c) all reach it through driver entry points, as real PyTorch does.
 *
 * Simulated device (moved here unchanged from the runtime; documented in tests/README.md):
 *   - one device thread executes a single FIFO queue of operations (kernels, graph launches,
 *     asynchronous copies, event markers) shared by all streams, on its own timeline: an
 *     operation starts at max(now, end of the previous one) and lasts its duration.
 *   - launches enqueue an operation lasting the calling thread's kernel time
 *     (fakecuda_set_kernel_ns, default 10 us) and return at once.
 *   - copies take bytes / bandwidth (fakecuda_set_bandwidth, default 10e9 B/s; D2D at 10x):
 *       synchronous cuMemcpy*                enqueue, block until done (waits for the queue).
 *       async H2D, pinned source             enqueue, return.
 *       async H2D, pageable source           host-blocking staging copy of bytes/bandwidth, then
 *                                            the DMA (same duration) is enqueued.
 *       async D2H, pinned destination, D2D   enqueue, return.
 *       async D2H, pageable destination      enqueue, block until done.
 *       H2H                                  host copy, blocking for bytes/bandwidth.
 *     cuMemcpy/cuMemcpyAsync (unified addressing) resolve the kind from the pointers.
 *   - cuStreamSynchronize / cuCtxSynchronize block until the queue is empty; cuEventRecord
 *     enqueues a marker, cuEventSynchronize waits for it; cuMemFree / cuMemFreeHost synchronise.
 *   - a process forked after the device started gets CUDA_ERROR_NOT_INITIALIZED (3) everywhere.
 *
 * Devices: with FAKECUDA_DEVICES=N set the node has N physical devices and CUDA_VISIBLE_DEVICES (a
 * comma list of indices or UUIDs, read once) picks the visible ones, which CUDA ordinals index;
 * without it there is one device and CUDA_VISIBLE_DEVICES is ignored (a GPU runner's own setting
 * must not hide the stand-in's only device). Contexts are the primary contexts, one per ordinal;
 * the current one is per thread. The process still has ONE queue: its physical device is the one
 * last made current (cuCtxSetCurrent, from any thread) when the device started, or before the
 * first operation was enqueued; later changes move nothing.
 *
 * NVML record: when the device starts the driver makes $FAKECUDA_NVML_DIR/proc-<pid> (struct
 * fakecuda_nvml_proc, fakecuda_nvml.h) and keeps it current: device memory in use, busy time of
 * kernels and copies. The stand-in NVML (fakenvml.c) reads these; the file goes at normal exit.
 *
 * cuGetProcAddress(_v2) hands out the exported function (default) or, with
 * FAKECUDA_PROCADDR=internal in the environment (read at cuInit or the first cuGetProcAddress),
 * a different, non-exported implementation of the same entry point (fcd_<name>, static). Flag
 * CU_GET_PROCADDRESS_PER_THREAD_DEFAULT_STREAM (2) picks the _ptsz variant where one exists.
 *
 * Every exported entry point calls its internal implementation (a real call); the internal one
 * does the work. Both start with push %rbp (checked by build.sh).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda_nvml.h"
#include "fakecuda_stats.h"

#define API __attribute__((visibility("default"), noinline))
#define INTERNAL static __attribute__((noipa, used))

typedef int CUresult;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
};
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUlaunchAttribute_st { int id; char pad[4]; char value[64]; } CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "CUlaunchConfig.hStream at 32 as in cuda.h");

enum { K_H2H = 0, K_H2D = 1, K_D2H = 2, K_D2D = 3, K_DEFAULT = 4 };
#define CU_GET_PROCADDRESS_PER_THREAD_DEFAULT_STREAM 2

/* ---------------------------------------------------------------- stats ---------------------- */

static struct fakecuda_stats g_stats = { .version = FAKECUDA_STATS_VERSION };
#define COUNT(f) __atomic_add_fetch(&g_stats.f, 1, __ATOMIC_RELAXED)

/* Each entry point first calls the driver's entry hook through a pointer (keeps a frame in tiny
 * functions and any LOCK-prefixed atomic away from the entry). */
static void api_hook(void) { COUNT(api_calls); }
static void (*volatile g_api_hook)(void) = api_hook;
#define API_ENTER() g_api_hook()

/* Launch counters the calling layers own and registered (fakecuda_register_launch_counter). */
#define MAX_COUNTERS 32
static struct { int path; const volatile uint64_t *p; } g_counters[MAX_COUNTERS];
static int g_ncounters;

/* ---------------------------------------------------------------- devices, contexts ---------- */

static int g_visible[FAKECUDA_NVML_MAX_DEVICES]; /* CUDA ordinal -> physical index */
static int g_nvisible = 1;
static pthread_once_t g_topo_once = PTHREAD_ONCE_INIT;
static uint64_t g_ctx_objects[FAKECUDA_NVML_MAX_DEVICES][4]; /* primary context of each ordinal */
static __thread int t_ctx_ordinal = -1; /* the thread's current context; -1: none (ordinal 0's) */
static int g_cur_ordinal;               /* last made current by any thread (g_mu) */

/* One CUDA_VISIBLE_DEVICES entry -> physical index, or -1: an index below n, or a UUID (or unique
 * prefix of one, at least "GPU-" and one more character) as real CUDA accepts. */
static int visible_entry(const char *tok, int n) {
    if (strncmp(tok, "GPU-", 4) == 0) {
        int found = -1;
        size_t len = strlen(tok);
        if (len < 5) return -1;
        for (int i = 0; i < n; i++) {
            char uuid[64];
            fakecuda_uuid((unsigned)i, uuid, sizeof uuid);
            if (strncmp(uuid, tok, len) == 0) {
                if (found >= 0) return -1; /* ambiguous */
                found = i;
            }
        }
        return found;
    }
    char *end;
    errno = 0;
    long v = strtol(tok, &end, 10);
    if (end == tok || *end || errno || v < 0 || v >= n) return -1;
    return (int)v;
}

static void read_topology(void) {
    const char *d = getenv("FAKECUDA_DEVICES");
    g_visible[0] = 0;
    g_nvisible = 1;
    if (!d || !*d) return;
    long n = strtol(d, NULL, 10);
    if (n < 1) n = 1;
    if (n > FAKECUDA_NVML_MAX_DEVICES) n = FAKECUDA_NVML_MAX_DEVICES;
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) {
        for (int i = 0; i < n; i++) g_visible[i] = i;
        g_nvisible = (int)n;
        return;
    }
    /* Like real CUDA, the list ends at its first entry that names no device (or repeats one). */
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", v);
    g_nvisible = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        for (char *e = tok + strlen(tok); e > tok && e[-1] == ' ';) *--e = 0;
        int phys = visible_entry(tok, (int)n), dup = 0;
        for (int i = 0; i < g_nvisible; i++) dup |= g_visible[i] == phys;
        if (phys < 0 || dup) break;
        g_visible[g_nvisible++] = phys;
    }
}

static int nvisible(void) {
    pthread_once(&g_topo_once, read_topology);
    return g_nvisible;
}

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
static uint64_t g_enqueued, g_completed;
static uint64_t g_device_free_at;
static int g_started;
static pid_t g_owner_pid;
static volatile uint64_t g_bandwidth = 10000000000ull;
static __thread uint64_t t_kernel_ns = 10000;
static int g_procaddr_internal = -1; /* -1: not read yet */

struct region { uintptr_t base; size_t len; int device; struct region *next; };
static struct region *g_regions;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- NVML record ---------------- */

static struct fakecuda_nvml_proc *g_rec; /* NULL until the device starts, or when it could not be made */
static char g_rec_path[1024];

static void rec_unlink(void) {
    /* atexit handlers survive fork: a child must not remove its parent's record */
    if (g_rec && getpid() == g_owner_pid) unlink(g_rec_path);
}

/* Records of processes that died without exiting normally (SIGKILL) stay behind; the next process
 * to start a device removes those whose pid is gone, so the directory does not grow. */
static void rec_sweep(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid;
        char tail;
        if (sscanf(e->d_name, "proc-%d%c", &pid, &tail) != 1 || pid <= 0) continue;
        if (kill(pid, 0) == -1 && errno == ESRCH) {
            char p[1200];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    }
    closedir(d);
}

/* Makes this process's record (g_mu held, before the device thread starts). Written under a
 * temporary name and renamed, so a reader never maps a half-made file. Any failure leaves g_rec
 * NULL: the device works without it. */
static void rec_make(int phys) {
    const char *dir = getenv("FAKECUDA_NVML_DIR");
    if (!dir || !*dir) dir = FAKECUDA_NVML_DIR_DEFAULT;
    if (mkdir(dir, 0777) == 0) chmod(dir, 0777); /* every user's processes write here; umask would narrow it */
    rec_sweep(dir);
    pid_t me = getpid();
    char tmp[1200];
    snprintf(g_rec_path, sizeof g_rec_path, "%s/proc-%d", dir, (int)me);
    snprintf(tmp, sizeof tmp, "%s/.proc-%d.tmp", dir, (int)me);
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    struct fakecuda_nvml_proc *r = MAP_FAILED;
    if (fchmod(fd, 0644) == 0 && ftruncate(fd, sizeof *r) == 0)
        r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (r == MAP_FAILED) {
        unlink(tmp);
        return;
    }
    uint64_t ticks = 0;
    fakecuda_proc_stat(me, NULL, &ticks);
    r->version = FAKECUDA_NVML_VERSION;
    r->pid = (uint64_t)me;
    r->device = (uint64_t)phys;
    r->started_ns = now_ns();
    r->start_ticks = ticks;
    __atomic_store_n(&r->magic, FAKECUDA_NVML_MAGIC, __ATOMIC_RELEASE);
    if (rename(tmp, g_rec_path) != 0) {
        unlink(tmp);
        munmap(r, sizeof *r);
        return;
    }
    g_rec = r;
    atexit(rec_unlink);
}

/* The device thread (the only writer of the busy fields) publishes an operation's start or end
 * under the record's sequence count. */
static void rec_busy(int type, uint64_t done_ns, uint64_t start, uint64_t end) {
    struct fakecuda_nvml_proc *r = g_rec;
    if (!r || (type != OP_KERNEL && type != OP_COPY)) return;
    uint64_t s = __atomic_load_n(&r->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&r->seq, s + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    uint64_t *busy = type == OP_KERNEL ? &r->kernel_busy_ns : &r->copy_busy_ns;
    uint64_t *b0 = type == OP_KERNEL ? &r->busy_start_ns : &r->copy_start_ns;
    uint64_t *b1 = type == OP_KERNEL ? &r->busy_end_ns : &r->copy_end_ns;
    __atomic_store_n(busy, __atomic_load_n(busy, __ATOMIC_RELAXED) + done_ns, __ATOMIC_RELAXED);
    __atomic_store_n(b0, start, __ATOMIC_RELAXED);
    __atomic_store_n(b1, end, __ATOMIC_RELAXED);
    __atomic_store_n(&r->seq, s + 2, __ATOMIC_RELEASE);
}

static void rec_mem(int64_t delta) {
    if (g_rec) __atomic_add_fetch(&g_rec->mem_used_bytes, (uint64_t)delta, __ATOMIC_RELAXED);
}

/* The device of the process's queue follows the current device until the first operation. */
static void set_process_device(int ordinal) {
    pthread_mutex_lock(&g_mu);
    g_cur_ordinal = ordinal;
    if (g_rec && g_enqueued == 0) __atomic_store_n(&g_rec->device, (uint64_t)g_visible[ordinal], __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_mu);
}

static void sleep_until(uint64_t t) {
    struct timespec ts = { (time_t)(t / 1000000000ull), (long)(t % 1000000000ull) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static uint64_t copy_ns(size_t bytes, int kind) {
    uint64_t bw = g_bandwidth ? g_bandwidth : 1;
    if (kind == K_D2D) bw *= 10;
    return (uint64_t)((unsigned __int128)bytes * 1000000000ull / bw);
}

/* The timer's floor: a clock_nanosleep wakes 50-100 us late on a VM, so a device that slept once
 * per operation would take that floor per operation, not its simulated time (20,000 kernels of
 * 2 us took 1.6 s, not 40 ms). The device keeps a virtual clock instead (g_device_free_at: each
 * operation starts where the last one ended, or now when the device was idle) and sleeps only
 * (a) to end the last queued operation on time, so that a host waiting on it sees it end when
 * it should, and (b) when the virtual clock runs ahead of real time by more than the floor, to
 * half the floor behind it (so that waking late does not let real time overtake it: no drift).
 * Operations queued behind others complete up to the floor before their simulated end; their
 * simulated times (counters, events, the NVML record) are exact. */
#define SLEEP_FLOOR_NS 200000ull

static void *device_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_mu);
    for (;;) {
        while (!g_head) pthread_cond_wait(&g_work, &g_mu);
        struct op *o = g_head;
        int last = o->next == NULL;
        uint64_t start = now_ns();
        if (g_device_free_at > start) start = g_device_free_at;
        uint64_t end = start + o->dur_ns;
        g_device_free_at = end;
        pthread_mutex_unlock(&g_mu);
        rec_busy(o->type, 0, start, end);
        if (o->type == OP_COPY && o->dst && o->src && o->bytes) memmove(o->dst, o->src, o->bytes);
        uint64_t t = now_ns();
        if (last && end > t) sleep_until(end);
        else if (end > t + SLEEP_FLOOR_NS) sleep_until(end - SLEEP_FLOOR_NS / 2);
        rec_busy(o->type, o->dur_ns, 0, 0);
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
    /* The child has no device thread; the driver is unusable there (like real CUDA). */
    pthread_mutex_init(&g_mu, NULL);
    pthread_cond_init(&g_work, NULL);
    pthread_cond_init(&g_done, NULL);
}

/* 0 when the device is usable (starting it if needed), else a CUresult. Call unlocked. */
static int device_ready(void) {
    pid_t me = getpid();
    if (__atomic_load_n(&g_started, __ATOMIC_ACQUIRE)) return g_owner_pid == me ? 0 : CUDA_ERROR_NOT_INITIALIZED;
    if (nvisible() == 0) return CUDA_ERROR_NO_DEVICE;
    pthread_mutex_lock(&g_mu);
    if (!g_started) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        g_owner_pid = me; /* before the record: its exit handler checks it */
        if (!g_rec) rec_make(g_visible[g_cur_ordinal]);
        if (pthread_create(&th, &at, device_main, NULL) != 0) {
            pthread_mutex_unlock(&g_mu);
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        pthread_setname_np(th, "fakecuda-dev");
        pthread_atfork(NULL, NULL, after_fork_child);
        __atomic_store_n(&g_started, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_mu);
    return g_owner_pid == me ? 0 : CUDA_ERROR_NOT_INITIALIZED;
}

/* Enqueues an op (g_mu held); the device thread frees it: use the result only under g_mu. */
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

static int remove_region(void *p, int device, size_t *len) {
    pthread_mutex_lock(&g_mu);
    for (struct region **pp = &g_regions; *pp; pp = &(*pp)->next) {
        if ((*pp)->base == (uintptr_t)p && (*pp)->device == device) {
            struct region *r = *pp;
            *pp = r->next;
            pthread_mutex_unlock(&g_mu);
            if (len) *len = r->len;
            free(r);
            return 1;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return 0;
}

static int launch(uint64_t dur) {
    int e = device_ready();
    if (e) return e;
    pthread_mutex_lock(&g_mu);
    enqueue_locked(OP_KERNEL, dur, NULL, NULL, 0, NULL);
    g_stats.kernel_ns_enqueued += dur;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

static int resolve_kind(int kind, const void *dst, const void *src) {
    if (kind != K_DEFAULT) return kind;
    int d = ptr_class(dst) == 1, s = ptr_class(src) == 1;
    if (d && s) return K_D2D;
    if (d) return K_H2D;
    if (s) return K_D2H;
    return K_H2H;
}

static void count_copy_locked(int kind, size_t n) {
    switch (kind) {
    case K_H2H: g_stats.bytes_h2h += n; break;
    case K_H2D: g_stats.bytes_h2d += n; g_stats.copies_h2d++; break;
    case K_D2H: g_stats.bytes_d2h += n; g_stats.copies_d2h++; break;
    case K_D2D: g_stats.bytes_d2d += n; break;
    }
}

static int do_copy(void *dst, const void *src, size_t count, int kind, int async) {
    int e = device_ready();
    if (e) return e;
    uint64_t t0 = now_ns();
    pthread_mutex_lock(&g_mu);
    int k = resolve_kind(kind, dst, src);
    count_copy_locked(k, count);
    uint64_t dur = copy_ns(count, k);
    if (k == K_H2H) {
        pthread_mutex_unlock(&g_mu);
        if (dst && src && count) memmove(dst, src, count);
        sleep_until(t0 + dur);
        pthread_mutex_lock(&g_mu);
    } else if (!async) {
        wait_seq_locked(enqueue_locked(OP_COPY, dur, dst, src, count, NULL)->seq);
    } else if (k == K_H2D && ptr_class(src) != 0) {
        /* pageable source: host-blocking staging copy, then the DMA from the staging buffer. */
        pthread_mutex_unlock(&g_mu);
        void *staging = (src && count) ? malloc(count) : NULL;
        if (staging) memcpy(staging, src, count);
        sleep_until(t0 + dur);
        pthread_mutex_lock(&g_mu);
        enqueue_locked(OP_COPY, dur, dst, staging, count, NULL)->staging = staging;
    } else if (k == K_D2H && ptr_class(dst) != 0) {
        /* pageable destination: returns only once the copy has completed. */
        wait_seq_locked(enqueue_locked(OP_COPY, dur, dst, src, count, NULL)->seq);
    } else {
        enqueue_locked(OP_COPY, dur, dst, src, count, NULL);
    }
    g_stats.host_blocked_ns += now_ns() - t0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

static int drain(uint64_t *counter) {
    __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
    int e = device_ready();
    if (e) return e;
    uint64_t t0 = now_ns();
    pthread_mutex_lock(&g_mu);
    wait_seq_locked(g_enqueued);
    g_stats.host_blocked_ns += now_ns() - t0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

static void read_procaddr_env(void) {
    if (__atomic_load_n(&g_procaddr_internal, __ATOMIC_ACQUIRE) >= 0) return;
    const char *v = getenv("FAKECUDA_PROCADDR");
    __atomic_store_n(&g_procaddr_internal, v && strcmp(v, "internal") == 0, __ATOMIC_RELEASE);
}

/* ---------------------------------------------------------------- internal implementations --- */
/* fcd_<export>: what cuGetProcAddress hands out with FAKECUDA_PROCADDR=internal; each export
 * calls its fcd_ function. */

INTERNAL CUresult fcd_cuInit(unsigned int flags) {
    API_ENTER();
    (void)flags;
    read_procaddr_env();
    return nvisible() ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

INTERNAL CUresult fcd_cuDriverGetVersion(int *v) {
    API_ENTER();
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuDeviceGetCount(int *count) {
    API_ENTER();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = nvisible();
    return CUDA_SUCCESS;
}

/* A CUdevice is its ordinal, as in real CUDA. */
INTERNAL CUresult fcd_cuDeviceGet(CUdevice *dev, int ordinal) {
    API_ENTER();
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= nvisible()) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    API_ENTER();
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= nvisible()) return CUDA_ERROR_INVALID_DEVICE;
    *ctx = (CUcontext)g_ctx_objects[dev];
    return CUDA_SUCCESS;
}

/* A thread that made no context current sees ordinal 0's (what the runtime would make current
 * at its first call there). */
INTERNAL CUresult fcd_cuCtxGetCurrent(CUcontext *ctx) {
    API_ENTER();
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = (CUcontext)g_ctx_objects[t_ctx_ordinal < 0 ? 0 : t_ctx_ordinal];
    return CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuCtxSetCurrent(CUcontext ctx) {
    API_ENTER();
    if (!ctx) {
        t_ctx_ordinal = -1;
        return CUDA_SUCCESS;
    }
    uintptr_t off = (uintptr_t)ctx - (uintptr_t)g_ctx_objects;
    if ((uintptr_t)ctx < (uintptr_t)g_ctx_objects || off % sizeof g_ctx_objects[0] ||
        off / sizeof g_ctx_objects[0] >= (uintptr_t)nvisible())
        return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx_ordinal = (int)(off / sizeof g_ctx_objects[0]);
    set_process_device(t_ctx_ordinal);
    return CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuCtxSynchronize(void) {
    API_ENTER();
    return drain(&g_stats.device_sync);
}

/* launches */
static CUresult launch_kernel_common(CUfunction f) {
    COUNT(launch_kernel);
    COUNT(launches_driver);
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    return launch(t_kernel_ns);
}

INTERNAL CUresult fcd_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                     unsigned by, unsigned bz, unsigned smem, CUstream s, void **params,
                                     void **extra) {
    API_ENTER();
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)s; (void)params; (void)extra;
    return launch_kernel_common(f);
}

INTERNAL CUresult fcd_cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned smem, CUstream s, void **params,
                                          void **extra) {
    API_ENTER();
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)s; (void)params; (void)extra;
    return launch_kernel_common(f);
}

static CUresult launch_ex_common(const CUlaunchConfig *cfg, CUfunction f) {
    COUNT(launch_kernel_ex);
    COUNT(launches_driver);
    if (!cfg || !f) return CUDA_ERROR_INVALID_VALUE;
    return launch(t_kernel_ns);
}

INTERNAL CUresult fcd_cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    API_ENTER();
    (void)params; (void)extra;
    return launch_ex_common(cfg, f);
}

INTERNAL CUresult fcd_cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    API_ENTER();
    (void)params; (void)extra;
    return launch_ex_common(cfg, f);
}

static CUresult launch_coop_common(CUfunction f) {
    COUNT(coop_launch);
    COUNT(launches_driver);
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    return launch(t_kernel_ns);
}

INTERNAL CUresult fcd_cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                                unsigned by, unsigned bz, unsigned smem, CUstream s, void **params) {
    API_ENTER();
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)s; (void)params;
    return launch_coop_common(f);
}

INTERNAL CUresult fcd_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                     unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                                     CUstream s, void **params) {
    API_ENTER();
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)s; (void)params;
    return launch_coop_common(f);
}

static CUresult graph_common(CUgraphExec g) {
    COUNT(graph_launch);
    COUNT(launches_driver);
    if (!g) return CUDA_ERROR_INVALID_HANDLE;
    return launch(t_kernel_ns);
}

INTERNAL CUresult fcd_cuGraphLaunch(CUgraphExec g, CUstream s) {
    API_ENTER();
    (void)s;
    return graph_common(g);
}

INTERNAL CUresult fcd_cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    API_ENTER();
    (void)s;
    return graph_common(g);
}

/* copies */
#define P(x) ((void *)(uintptr_t)(x))

INTERNAL CUresult fcd_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    API_ENTER();
    COUNT(memcpy_calls);
    return do_copy(P(dst), P(src), n, K_DEFAULT, 0);
}

INTERNAL CUresult fcd_cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    API_ENTER();
    COUNT(memcpy_calls);
    return do_copy(P(dst), src, n, K_H2D, 0);
}

INTERNAL CUresult fcd_cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    API_ENTER();
    COUNT(memcpy_calls);
    return do_copy(dst, P(src), n, K_D2H, 0);
}

INTERNAL CUresult fcd_cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    API_ENTER();
    COUNT(memcpy_calls);
    return do_copy(P(dst), P(src), n, K_D2D, 0);
}

#define ASYNC_COPY(NAME, DT, ST, KIND)                                          \
    INTERNAL CUresult fcd_##NAME(DT dst, ST src, size_t n, CUstream s) {        \
        API_ENTER();                                                            \
        (void)s;                                                                \
        COUNT(memcpy_async_calls);                                              \
        return do_copy(P(dst), (const void *)(uintptr_t)src, n, KIND, 1);       \
    }
ASYNC_COPY(cuMemcpyAsync, CUdeviceptr, CUdeviceptr, K_DEFAULT)
ASYNC_COPY(cuMemcpyAsync_ptsz, CUdeviceptr, CUdeviceptr, K_DEFAULT)
ASYNC_COPY(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void *, K_H2D)
ASYNC_COPY(cuMemcpyHtoDAsync_v2_ptsz, CUdeviceptr, const void *, K_H2D)
ASYNC_COPY(cuMemcpyDtoHAsync_v2, void *, CUdeviceptr, K_D2H)
ASYNC_COPY(cuMemcpyDtoHAsync_v2_ptsz, void *, CUdeviceptr, K_D2H)
ASYNC_COPY(cuMemcpyDtoDAsync_v2, CUdeviceptr, CUdeviceptr, K_D2D)
ASYNC_COPY(cuMemcpyDtoDAsync_v2_ptsz, CUdeviceptr, CUdeviceptr, K_D2D)

INTERNAL CUresult fcd_cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx,
                                        size_t n, CUstream s) {
    API_ENTER();
    (void)dctx; (void)sctx; (void)s;
    COUNT(memcpy_peer_calls);
    return do_copy(P(dst), P(src), n, K_D2D, 1);
}

INTERNAL CUresult fcd_cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx,
                                             size_t n, CUstream s) {
    API_ENTER();
    (void)dctx; (void)sctx; (void)s;
    COUNT(memcpy_peer_calls);
    return do_copy(P(dst), P(src), n, K_D2D, 1);
}

/* streams */
INTERNAL CUresult fcd_cuStreamSynchronize(CUstream s) {
    API_ENTER();
    (void)s;
    return drain(&g_stats.stream_sync);
}

INTERNAL CUresult fcd_cuStreamSynchronize_ptsz(CUstream s) {
    API_ENTER();
    (void)s;
    return drain(&g_stats.stream_sync);
}

static CUresult stream_query(void) {
    int e = device_ready();
    if (e) return e;
    pthread_mutex_lock(&g_mu);
    int busy = g_completed < g_enqueued;
    pthread_mutex_unlock(&g_mu);
    return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuStreamQuery(CUstream s) {
    API_ENTER();
    (void)s;
    return stream_query();
}

INTERNAL CUresult fcd_cuStreamQuery_ptsz(CUstream s) {
    API_ENTER();
    (void)s;
    return stream_query();
}

INTERNAL CUresult fcd_cuStreamCreate(CUstream *ps, unsigned int flags) {
    API_ENTER();
    static uintptr_t next = 0x5000;
    (void)flags;
    if (!ps) return CUDA_ERROR_INVALID_VALUE;
    int e = device_ready();
    if (e) return e;
    *ps = (CUstream)__atomic_add_fetch(&next, 0x10, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuStreamDestroy_v2(CUstream s) {
    API_ENTER();
    (void)s;
    return CUDA_SUCCESS;
}

/* events */
INTERNAL CUresult fcd_cuEventCreate(CUevent *pe, unsigned int flags) {
    API_ENTER();
    (void)flags;
    if (!pe) return CUDA_ERROR_INVALID_VALUE;
    int e = device_ready();
    if (e) return e;
    struct fake_event *ev = calloc(1, sizeof *ev);
    ev->magic = EVENT_MAGIC;
    *pe = (CUevent)ev;
    return CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuEventDestroy_v2(CUevent event) {
    API_ENTER();
    struct fake_event *ev = (struct fake_event *)event;
    if (!ev || ev->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_mu);
    int pending = g_completed < ev->seq;
    pthread_mutex_unlock(&g_mu);
    if (!pending) { /* leaked on purpose if still queued */
        ev->magic = 0;
        free(ev);
    }
    return CUDA_SUCCESS;
}

static CUresult event_record(CUevent event) {
    struct fake_event *ev = (struct fake_event *)event;
    if (!ev || ev->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    int e = device_ready();
    if (e) return e;
    pthread_mutex_lock(&g_mu);
    g_stats.event_record++;
    ev->done_ns = 0;
    ev->seq = enqueue_locked(OP_EVENT, 0, NULL, NULL, 0, ev)->seq;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuEventRecord(CUevent ev, CUstream s) {
    API_ENTER();
    (void)s;
    return event_record(ev);
}

INTERNAL CUresult fcd_cuEventRecord_ptsz(CUevent ev, CUstream s) {
    API_ENTER();
    (void)s;
    return event_record(ev);
}

INTERNAL CUresult fcd_cuEventSynchronize(CUevent event) {
    API_ENTER();
    struct fake_event *ev = (struct fake_event *)event;
    if (!ev || ev->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    int e = device_ready();
    if (e) return e;
    uint64_t t0 = now_ns();
    pthread_mutex_lock(&g_mu);
    g_stats.event_sync++;
    wait_seq_locked(ev->seq);
    g_stats.host_blocked_ns += now_ns() - t0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuEventQuery(CUevent event) {
    API_ENTER();
    struct fake_event *ev = (struct fake_event *)event;
    if (!ev || ev->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_mu);
    int busy = g_completed < ev->seq;
    pthread_mutex_unlock(&g_mu);
    return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    API_ENTER();
    struct fake_event *a = (struct fake_event *)start, *b = (struct fake_event *)end;
    if (!ms || !a || !b || a->magic != EVENT_MAGIC || b->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    if (!a->done_ns || !b->done_ns) return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(b->done_ns - a->done_ns)) / 1e6);
    return CUDA_SUCCESS;
}

/* memory */
INTERNAL CUresult fcd_cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    API_ENTER();
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    int e = device_ready();
    if (e) return e;
    COUNT(malloc_calls);
    void *p = malloc(size ? size : 1);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    add_region(p, size, 1);
    rec_mem((int64_t)size);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

static void sync_all(void) {
    pthread_mutex_lock(&g_mu);
    wait_seq_locked(g_enqueued);
    pthread_mutex_unlock(&g_mu);
}

INTERNAL CUresult fcd_cuMemFree_v2(CUdeviceptr dptr) {
    API_ENTER();
    if (!dptr) return CUDA_SUCCESS;
    COUNT(free_calls);
    int e = device_ready(); /* the real one synchronises the device */
    if (e) return e;
    sync_all();
    size_t len = 0;
    if (!remove_region(P(dptr), 1, &len)) return CUDA_ERROR_INVALID_VALUE;
    rec_mem(-(int64_t)len);
    free(P(dptr));
    return CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    API_ENTER();
    (void)flags;
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    int e = device_ready();
    if (e) return e;
    COUNT(malloc_host_calls);
    void *p = malloc(size ? size : 1);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    add_region(p, size, 0);
    *pp = p;
    return CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuMemAllocHost_v2(void **pp, size_t size) {
    API_ENTER();
    return fcd_cuMemHostAlloc(pp, size, 0);
}

INTERNAL CUresult fcd_cuMemFreeHost(void *p) {
    API_ENTER();
    if (!p) return CUDA_SUCCESS;
    COUNT(free_host_calls);
    if (device_ready() == 0) sync_all(); /* the real one synchronises */
    if (!remove_region(p, 0, NULL)) return CUDA_ERROR_INVALID_VALUE;
    free(p);
    return CUDA_SUCCESS;
}

INTERNAL CUresult fcd_cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags, int *status);
INTERNAL CUresult fcd_cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    API_ENTER();
    return fcd_cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}

/* ---------------------------------------------------------------- exports -------------------- */

#define EXPORT0(NAME)                                                                 \
    API CUresult NAME(void) { return fcd_##NAME(); }
#define EXPORT(NAME, PARAMS, ARGS)                                                     \
    API CUresult NAME PARAMS { return fcd_##NAME ARGS; }

EXPORT(cuInit, (unsigned int flags), (flags))
EXPORT(cuDriverGetVersion, (int *v), (v))
EXPORT(cuGetProcAddress, (const char *sym, void **pfn, int ver, cuuint64_t flags), (sym, pfn, ver, flags))
EXPORT(cuGetProcAddress_v2, (const char *sym, void **pfn, int ver, cuuint64_t flags, int *status),
       (sym, pfn, ver, flags, status))
EXPORT(cuDeviceGetCount, (int *count), (count))
EXPORT(cuDeviceGet, (CUdevice *dev, int ordinal), (dev, ordinal))
EXPORT(cuDevicePrimaryCtxRetain, (CUcontext *ctx, CUdevice dev), (ctx, dev))
EXPORT(cuCtxGetCurrent, (CUcontext *ctx), (ctx))
EXPORT(cuCtxSetCurrent, (CUcontext ctx), (ctx))
EXPORT0(cuCtxSynchronize)
#define LK_PARAMS (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                   unsigned smem, CUstream s, void **params, void **extra)
#define LK_ARGS (f, gx, gy, gz, bx, by, bz, smem, s, params, extra)
EXPORT(cuLaunchKernel, LK_PARAMS, LK_ARGS)
EXPORT(cuLaunchKernel_ptsz, LK_PARAMS, LK_ARGS)
EXPORT(cuLaunchKernelEx, (const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra), (cfg, f, params, extra))
EXPORT(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra), (cfg, f, params, extra))
#define LC_PARAMS (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                   unsigned smem, CUstream s, void **params)
#define LC_ARGS (f, gx, gy, gz, bx, by, bz, smem, s, params)
EXPORT(cuLaunchCooperativeKernel, LC_PARAMS, LC_ARGS)
EXPORT(cuLaunchCooperativeKernel_ptsz, LC_PARAMS, LC_ARGS)
EXPORT(cuGraphLaunch, (CUgraphExec g, CUstream s), (g, s))
EXPORT(cuGraphLaunch_ptsz, (CUgraphExec g, CUstream s), (g, s))
EXPORT(cuMemcpy, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n))
EXPORT(cuMemcpyHtoD_v2, (CUdeviceptr dst, const void *src, size_t n), (dst, src, n))
EXPORT(cuMemcpyDtoH_v2, (void *dst, CUdeviceptr src, size_t n), (dst, src, n))
EXPORT(cuMemcpyDtoD_v2, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n))
EXPORT(cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))
EXPORT(cuMemcpyAsync_ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))
EXPORT(cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void *src, size_t n, CUstream s), (dst, src, n, s))
EXPORT(cuMemcpyHtoDAsync_v2_ptsz, (CUdeviceptr dst, const void *src, size_t n, CUstream s), (dst, src, n, s))
EXPORT(cuMemcpyDtoHAsync_v2, (void *dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))
EXPORT(cuMemcpyDtoHAsync_v2_ptsz, (void *dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))
EXPORT(cuMemcpyDtoDAsync_v2, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))
EXPORT(cuMemcpyDtoDAsync_v2_ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))
#define PEER_PARAMS (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream s)
EXPORT(cuMemcpyPeerAsync, PEER_PARAMS, (dst, dctx, src, sctx, n, s))
EXPORT(cuMemcpyPeerAsync_ptsz, PEER_PARAMS, (dst, dctx, src, sctx, n, s))
EXPORT(cuStreamSynchronize, (CUstream s), (s))
EXPORT(cuStreamSynchronize_ptsz, (CUstream s), (s))
EXPORT(cuStreamQuery, (CUstream s), (s))
EXPORT(cuStreamQuery_ptsz, (CUstream s), (s))
EXPORT(cuStreamCreate, (CUstream *ps, unsigned int flags), (ps, flags))
EXPORT(cuStreamDestroy_v2, (CUstream s), (s))
EXPORT(cuEventCreate, (CUevent *pe, unsigned int flags), (pe, flags))
EXPORT(cuEventDestroy_v2, (CUevent e), (e))
EXPORT(cuEventRecord, (CUevent e, CUstream s), (e, s))
EXPORT(cuEventRecord_ptsz, (CUevent e, CUstream s), (e, s))
EXPORT(cuEventSynchronize, (CUevent e), (e))
EXPORT(cuEventQuery, (CUevent e), (e))
EXPORT(cuEventElapsedTime, (float *ms, CUevent a, CUevent b), (ms, a, b))
EXPORT(cuMemAlloc_v2, (CUdeviceptr *p, size_t n), (p, n))
EXPORT(cuMemFree_v2, (CUdeviceptr p), (p))
EXPORT(cuMemAllocHost_v2, (void **p, size_t n), (p, n))
EXPORT(cuMemHostAlloc, (void **p, size_t n, unsigned int flags), (p, n, flags))
EXPORT(cuMemFreeHost, (void *p), (p))

/* ---------------------------------------------------------------- cuGetProcAddress ----------- */

/* name: what the runtime asks for (the unversioned name, as the real runtimes do); alias: the
 * versioned export name, also accepted. ptsz: the per-thread-default-stream variant. */
struct proc {
    const char *name, *alias;
    void *exp, *internal, *exp_ptsz, *internal_ptsz;
};
#define E(N) #N, NULL, (void *)N, (void *)fcd_##N, NULL, NULL
#define EV(B, N) B, #N, (void *)N, (void *)fcd_##N, NULL, NULL
#define EP(N, NP) #N, NULL, (void *)N, (void *)fcd_##N, (void *)NP, (void *)fcd_##NP
#define EVP(B, N, NP) B, #N, (void *)N, (void *)fcd_##N, (void *)NP, (void *)fcd_##NP
static const struct proc g_procs[] = {
    {E(cuInit)},
    {E(cuDriverGetVersion)},
    {EV("cuGetProcAddress", cuGetProcAddress_v2)},
    {E(cuDeviceGetCount)},
    {E(cuDeviceGet)},
    {E(cuDevicePrimaryCtxRetain)},
    {E(cuCtxGetCurrent)},
    {E(cuCtxSetCurrent)},
    {E(cuCtxSynchronize)},
    {EP(cuLaunchKernel, cuLaunchKernel_ptsz)},
    {EP(cuLaunchKernelEx, cuLaunchKernelEx_ptsz)},
    {EP(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz)},
    {EP(cuGraphLaunch, cuGraphLaunch_ptsz)},
    {E(cuMemcpy)},
    {EV("cuMemcpyHtoD", cuMemcpyHtoD_v2)},
    {EV("cuMemcpyDtoH", cuMemcpyDtoH_v2)},
    {EV("cuMemcpyDtoD", cuMemcpyDtoD_v2)},
    {EP(cuMemcpyAsync, cuMemcpyAsync_ptsz)},
    {EVP("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz)},
    {EVP("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz)},
    {EVP("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz)},
    {EP(cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz)},
    {EP(cuStreamSynchronize, cuStreamSynchronize_ptsz)},
    {EP(cuStreamQuery, cuStreamQuery_ptsz)},
    {E(cuStreamCreate)},
    {EV("cuStreamDestroy", cuStreamDestroy_v2)},
    {E(cuEventCreate)},
    {EV("cuEventDestroy", cuEventDestroy_v2)},
    {EP(cuEventRecord, cuEventRecord_ptsz)},
    {E(cuEventSynchronize)},
    {E(cuEventQuery)},
    {E(cuEventElapsedTime)},
    {EV("cuMemAlloc", cuMemAlloc_v2)},
    {EV("cuMemFree", cuMemFree_v2)},
    {EV("cuMemAllocHost", cuMemAllocHost_v2)},
    {E(cuMemHostAlloc)},
    {E(cuMemFreeHost)},
};

static int name_is(const char *sym, const char *name, const char *suffix) {
    size_t n = strlen(name);
    return name && strncmp(sym, name, n) == 0 && strcmp(sym + n, suffix) == 0;
}

INTERNAL CUresult fcd_cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags, int *status) {
    API_ENTER();
    (void)ver;
    COUNT(procaddr_calls);
    read_procaddr_env();
    if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int internal = g_procaddr_internal == 1;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const struct proc *p = &g_procs[i];
        int ptsz;
        if (name_is(sym, p->name, "") || (p->alias && name_is(sym, p->alias, "")))
            ptsz = (flags & CU_GET_PROCADDRESS_PER_THREAD_DEFAULT_STREAM) && p->exp_ptsz;
        else if (p->exp_ptsz && (name_is(sym, p->name, "_ptsz") || (p->alias && name_is(sym, p->alias, "_ptsz"))))
            ptsz = 1;
        else
            continue;
        void *exp = ptsz ? p->exp_ptsz : p->exp;
        *pfn = internal ? (ptsz ? p->internal_ptsz : p->internal) : exp;
        if (*pfn != exp) COUNT(procaddr_internal);
        if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_NOT_FOUND;
}

/* ---------------------------------------------------------------- test controls -------------- */

/* Duration of the kernels (and graphs) the calling thread launches from now on. */
API void fakecuda_set_kernel_ns(uint64_t ns) { t_kernel_ns = ns; }
API uint64_t fakecuda_get_kernel_ns(void) { return t_kernel_ns; }

/* Copy bandwidth in bytes per second (global). D2D copies run at 10x. */
API void fakecuda_set_bandwidth(uint64_t bytes_per_s) { g_bandwidth = bytes_per_s ? bytes_per_s : 1; }
API uint64_t fakecuda_get_bandwidth(void) { return g_bandwidth; }

/* A calling layer's own launch counter (FAKECUDA_PATH_*), summed into launches_runtime /
 * _library / _direct by fakecuda_stats. Returns 0, or -1 when the table is full. */
API int fakecuda_register_launch_counter(int path, const volatile uint64_t *counter) {
    if (!counter || path < 0 || path > 2) return -1;
    pthread_mutex_lock(&g_mu);
    int ok = g_ncounters < MAX_COUNTERS;
    if (ok) {
        g_counters[g_ncounters].path = path;
        g_counters[g_ncounters].p = counter;
        g_ncounters++;
    }
    pthread_mutex_unlock(&g_mu);
    return ok ? 0 : -1;
}

/* Copies the counters into *out (at most `size` bytes); returns sizeof(struct fakecuda_stats). */
API size_t fakecuda_stats(void *out, size_t size) {
    pthread_mutex_lock(&g_mu);
    struct fakecuda_stats s = g_stats;
    uint64_t by_path[3] = {0, 0, 0};
    for (int i = 0; i < g_ncounters; i++)
        by_path[g_counters[i].path] += __atomic_load_n(g_counters[i].p, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_mu);
    s.launches_runtime = by_path[FAKECUDA_PATH_RUNTIME];
    s.launches_library = by_path[FAKECUDA_PATH_LIBRARY];
    s.launches_direct = by_path[FAKECUDA_PATH_DIRECT];
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
