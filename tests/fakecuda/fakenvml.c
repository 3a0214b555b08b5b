/*
 * Stand-in NVML (libnvidia-ml.so.1) for machines without a GPU. It answers from the simulated
 * devices of the stand-in driver (fakecuda_driver.c): every process whose device started keeps a
 * shared-memory record in $FAKECUDA_NVML_DIR (struct fakecuda_nvml_proc, fakecuda_nvml.h) with its
 * physical device, the device memory it holds and the busy time of its kernels and copies. This
 * library maps those records read-only and sums them per device. See tests/README.md
 * ("Stand-in NVML").
 *
 * It includes NVIDIA's own nvml.h (PyPI nvidia-nvml-dev-cu12; build.sh finds it), so every
 * exported function is checked against the real prototype, and -Wmissing-prototypes makes a name
 * the header does not declare an error. NVML_NO_UNVERSIONED_FUNC_DEFS keeps the header from
 * renaming nvmlInit to nvmlInit_v2 etc., so the versioned names are defined under their own names
 * and the old ones (nvmlInit, nvmlDeviceGetCount, ...) can be exported too, as the real library does.
 *
 * Devices are physical (CUDA_VISIBLE_DEVICES means nothing here): FAKECUDA_DEVICES (default 1).
 * Utilization is the simulated device's busy time, which the records give exactly; NVML's own
 * sampling (1/6 s to 1 s periods) is not modelled. Each call's answers come from the records as they
 * are at the call, plus a short history of each record's busy time this library keeps (one point
 * per call, at most one per ms), from which the busy time at an earlier instant is interpolated.
 *
 * Failure switches, read at the first nvmlInit: FAKENVML_SLOW_MS, FAKENVML_LOST_AFTER_MS,
 * FAKENVML_INIT=mismatch, FAKENVML_PROCESS_UTIL=unsupported (README).
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda_nvml.h"

#define API __attribute__((visibility("default")))

#define GIB (1024ull * 1024 * 1024)
#define MEM_TOTAL (80 * GIB)
#define NAME "TraceML stand-in GPU"
#define DRIVER_VERSION "580.65.06"
#define NVML_VERSION_STR "13.580.65.06"
#define CUDA_DRIVER_VERSION 13000 /* the stand-in driver's cuDriverGetVersion */
#define POWER_LIMIT_MW 700000u
#define HIST 256 /* busy-time points kept per record */

struct nvmlDevice_st {
    unsigned index;
    uint64_t last_util_ns;      /* previous nvmlDeviceGetUtilizationRates; 0: none yet */
    uint64_t last_proc_util_ns; /* previous nvmlDeviceGetProcessUtilization that returned samples */
};

struct point { uint64_t t, kernel, copy; };

/* One mapped record. hist: busy time seen at earlier calls, oldest first (a ring once full). */
struct rec {
    struct rec *next;
    const struct fakecuda_nvml_proc *p;
    pid_t pid;
    dev_t dev;
    ino_t ino;
    int seen;
    uint64_t started_ns, start_ticks;
    uint64_t kernel_now, copy_now; /* at the current call's time */
    struct point hist[HIST];
    unsigned nhist, head;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_inits; /* nvmlInit reference count */
static unsigned g_ndev = 1;
static struct nvmlDevice_st g_dev[FAKECUDA_NVML_MAX_DEVICES];
static char g_dir[1024];
static uint64_t g_init_ns, g_slow_ms, g_lost_after_ms;
static int g_proc_util_unsupported;
static struct rec *g_recs;

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t real_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t env_u64(const char *name) {
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 10) : 0;
}

/* ---------------------------------------------------------------- records -------------------- */

static void rec_free(struct rec *r) {
    munmap((void *)r->p, sizeof *r->p);
    free(r);
}

static void drop_all_locked(void) {
    while (g_recs) {
        struct rec *r = g_recs;
        g_recs = r->next;
        rec_free(r);
    }
}

/* The process behind a record is gone: no such pid, a zombie (killed, not yet reaped), or a
 * different process under a reused pid. Unreadable /proc (hidepid) counts as alive. */
static int rec_dead(const struct rec *r) {
    if (kill(r->pid, 0) == -1 && errno == ESRCH) return 1;
    char state = 0;
    uint64_t ticks = 0;
    if (fakecuda_proc_stat(r->pid, &state, &ticks) != 0) return 0;
    if (state == 'Z' || state == 'X') return 1;
    return r->start_ticks && ticks != r->start_ticks;
}

static struct rec *rec_open(const char *path, pid_t pid) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    const struct fakecuda_nvml_proc *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof *p)
        p = mmap(NULL, sizeof *p, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return NULL;
    if (__atomic_load_n(&p->magic, __ATOMIC_ACQUIRE) != FAKECUDA_NVML_MAGIC ||
        p->version < FAKECUDA_NVML_VERSION || p->pid != (uint64_t)pid) {
        munmap((void *)p, sizeof *p);
        return NULL;
    }
    struct rec *r = calloc(1, sizeof *r);
    if (!r) {
        munmap((void *)p, sizeof *p);
        return NULL;
    }
    r->p = p;
    r->pid = pid;
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    r->started_ns = p->started_ns;
    r->start_ticks = p->start_ticks;
    return r;
}

static uint64_t partial(uint64_t start, uint64_t end, uint64_t now) {
    if (!start) return 0;
    uint64_t t = now < end ? now : end;
    return t > start ? t - start : 0;
}

/* Busy time of a record at `now` (kernels, copies): a consistent snapshot under its sequence count. */
static void rec_busy(const struct fakecuda_nvml_proc *p, uint64_t now, uint64_t *kernel, uint64_t *copy) {
    for (int tries = 0;; tries++) {
        uint64_t s1 = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        uint64_t kb = __atomic_load_n(&p->kernel_busy_ns, __ATOMIC_RELAXED);
        uint64_t ks = __atomic_load_n(&p->busy_start_ns, __ATOMIC_RELAXED);
        uint64_t ke = __atomic_load_n(&p->busy_end_ns, __ATOMIC_RELAXED);
        uint64_t cb = __atomic_load_n(&p->copy_busy_ns, __ATOMIC_RELAXED);
        uint64_t cs = __atomic_load_n(&p->copy_start_ns, __ATOMIC_RELAXED);
        uint64_t ce = __atomic_load_n(&p->copy_end_ns, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        uint64_t s2 = __atomic_load_n(&p->seq, __ATOMIC_RELAXED);
        /* a writer killed mid-update leaves seq odd for ever: take what is there */
        if ((s1 == s2 && !(s1 & 1)) || tries > 1000) {
            *kernel = kb + partial(ks, ke, now);
            *copy = cb + partial(cs, ce, now);
            return;
        }
        if (tries > 10) sched_yield();
    }
}

/* Brings g_recs up to date with the directory at `now`: maps new records, drops those whose file
 * went (normal exit) and those whose process is gone (their files are removed too), reads every
 * record's busy time at `now` and adds it to its history. */
static void scan_locked(uint64_t now) {
    for (struct rec *r = g_recs; r; r = r->next) r->seen = 0;
    DIR *d = opendir(g_dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid;
        char tail, path[1400];
        if (sscanf(e->d_name, "proc-%d%c", &pid, &tail) != 1 || pid <= 0) continue;
        snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        struct rec *r;
        for (r = g_recs; r; r = r->next)
            if (r->pid == pid && r->dev == st.st_dev && r->ino == st.st_ino) break;
        if (!r && (r = rec_open(path, pid))) {
            r->next = g_recs;
            g_recs = r;
        }
        if (!r) continue;
        r->seen = 1;
        if (rec_dead(r)) {
            unlink(path);
            r->seen = 0;
        }
    }
    if (d) closedir(d);
    for (struct rec **pp = &g_recs; *pp;) {
        struct rec *r = *pp;
        if (!r->seen) {
            *pp = r->next;
            rec_free(r);
            continue;
        }
        rec_busy(r->p, now, &r->kernel_now, &r->copy_now);
        struct point *last = r->nhist ? &r->hist[(r->head + r->nhist - 1) % HIST] : NULL;
        if (!last || now >= last->t + 1000000) {
            struct point pt = { now, r->kernel_now, r->copy_now };
            if (r->nhist < HIST) r->hist[(r->head + r->nhist++) % HIST] = pt;
            else r->hist[r->head] = pt, r->head = (r->head + 1) % HIST;
        }
        pp = &r->next;
    }
}

static unsigned rec_device(const struct rec *r) {
    return (unsigned)__atomic_load_n(&r->p->device, __ATOMIC_RELAXED);
}

/* Earliest instant the busy time of r is known at: its start, or its oldest point once the history
 * has wrapped. */
static uint64_t rec_known_from(const struct rec *r) {
    return r->nhist == HIST ? r->hist[r->head].t : r->started_ns;
}

/* Busy time of r at an earlier instant t (<= the current call's `now`), interpolated linearly
 * between the known points around it: (start, 0), the history, (now, busy now). */
static void rec_busy_at(const struct rec *r, uint64_t t, uint64_t now, uint64_t *kernel, uint64_t *copy) {
    struct point lo = { r->started_ns, 0, 0 }, hi = { now, r->kernel_now, r->copy_now };
    if (r->nhist == HIST) lo = r->hist[r->head];
    if (t <= lo.t) {
        *kernel = lo.kernel;
        *copy = lo.copy;
        return;
    }
    for (unsigned i = 0; i < r->nhist; i++) {
        const struct point *q = &r->hist[(r->head + i) % HIST];
        if (q->t <= t && q->t >= lo.t) lo = *q;
        if (q->t >= t && q->t < hi.t) hi = *q;
    }
    if (t >= hi.t || hi.t <= lo.t) {
        *kernel = hi.t <= t ? hi.kernel : lo.kernel;
        *copy = hi.t <= t ? hi.copy : lo.copy;
        return;
    }
    double f = (double)(t - lo.t) / (double)(hi.t - lo.t);
    *kernel = lo.kernel + (uint64_t)(f * (double)(hi.kernel - lo.kernel));
    *copy = lo.copy + (uint64_t)(f * (double)(hi.copy - lo.copy));
}

static unsigned pct(uint64_t busy, uint64_t period) {
    if (!period) return 0;
    uint64_t v = (busy * 100 + period / 2) / period;
    return v > 100 ? 100 : (unsigned)v;
}

/* Device-level busy percentages over [t0, now]: the busy time of every live record on the device
 * in that window over its length, clamped to 100. */
static void device_util_locked(unsigned dev, uint64_t t0, uint64_t now, unsigned *gpu, unsigned *mem) {
    uint64_t k = 0, c = 0;
    for (struct rec *r = g_recs; r; r = r->next) {
        if (rec_device(r) != dev) continue;
        uint64_t k0, c0;
        rec_busy_at(r, t0, now, &k0, &c0);
        k += r->kernel_now > k0 ? r->kernel_now - k0 : 0;
        c += r->copy_now > c0 ? r->copy_now - c0 : 0;
    }
    *gpu = pct(k, now > t0 ? now - t0 : 0);
    *mem = pct(c, now > t0 ? now - t0 : 0);
}

/* What temperature and power follow: the kernel utilization of the last second (no state). */
static unsigned recent_util(unsigned dev) {
    unsigned gpu, mem;
    pthread_mutex_lock(&g_mu);
    uint64_t now = mono_ns();
    scan_locked(now);
    device_util_locked(dev, now > 1000000000ull ? now - 1000000000ull : 0, now, &gpu, &mem);
    pthread_mutex_unlock(&g_mu);
    return gpu;
}

/* ---------------------------------------------------------------- entry checks --------------- */

static int initialized(void) { return __atomic_load_n(&g_inits, __ATOMIC_ACQUIRE) > 0; }

static void maybe_slow(void) {
    uint64_t ms = __atomic_load_n(&g_slow_ms, __ATOMIC_RELAXED);
    if (!ms) return;
    struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static int lost(void) {
    uint64_t after = __atomic_load_n(&g_lost_after_ms, __ATOMIC_RELAXED);
    return after && mono_ns() >= __atomic_load_n(&g_init_ns, __ATOMIC_RELAXED) + after * 1000000ull;
}

/* Every nvmlDevice* query on a handle: initialised, then the slow switch (outside the lock: a
 * slow NVML must not serialise a caller's threads more than the real one would), then the handle,
 * then the lost switch. */
static nvmlReturn_t dev_enter(nvmlDevice_t device) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    maybe_slow();
    if (!device || device < g_dev || device >= g_dev + g_ndev) return NVML_ERROR_INVALID_ARGUMENT;
    if (lost()) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define DEV_ENTER(device)                       \
    do {                                        \
        nvmlReturn_t e_ = dev_enter(device);    \
        if (e_ != NVML_SUCCESS) return e_;      \
    } while (0)

static nvmlReturn_t copy_str(char *dst, unsigned int length, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < strlen(src) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- init, system --------------- */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&g_mu);
    if (g_inits == 0) {
        const char *v = getenv("FAKENVML_INIT");
        if (v && strcmp(v, "mismatch") == 0) {
            pthread_mutex_unlock(&g_mu);
            return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
        }
        uint64_t n = env_u64("FAKECUDA_DEVICES");
        g_ndev = n < 1 ? 1 : n > FAKECUDA_NVML_MAX_DEVICES ? FAKECUDA_NVML_MAX_DEVICES : (unsigned)n;
        for (unsigned i = 0; i < FAKECUDA_NVML_MAX_DEVICES; i++) g_dev[i] = (struct nvmlDevice_st){ .index = i };
        const char *dir = getenv("FAKECUDA_NVML_DIR");
        snprintf(g_dir, sizeof g_dir, "%s", dir && *dir ? dir : FAKECUDA_NVML_DIR_DEFAULT);
        v = getenv("FAKENVML_PROCESS_UTIL");
        g_proc_util_unsupported = v && strcmp(v, "unsupported") == 0;
        __atomic_store_n(&g_slow_ms, env_u64("FAKENVML_SLOW_MS"), __ATOMIC_RELAXED);
        __atomic_store_n(&g_lost_after_ms, env_u64("FAKENVML_LOST_AFTER_MS"), __ATOMIC_RELAXED);
        __atomic_store_n(&g_init_ns, mono_ns(), __ATOMIC_RELAXED);
    }
    __atomic_store_n(&g_inits, g_inits + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_mu);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
API nvmlReturn_t nvmlInit(void) { return do_init(); }

/* Flags (NVML_INIT_FLAG_NO_GPUS, _NO_ATTACH) change nothing here. */
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

API nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_mu);
    if (g_inits == 0) {
        pthread_mutex_unlock(&g_mu);
        return NVML_ERROR_UNINITIALIZED;
    }
    __atomic_store_n(&g_inits, g_inits - 1, __ATOMIC_RELEASE);
    if (g_inits == 0) drop_all_locked();
    pthread_mutex_unlock(&g_mu);
    return NVML_SUCCESS;
}

API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupted by IRQ";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    return copy_str(version, length, DRIVER_VERSION);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    return copy_str(version, length, NVML_VERSION_STR);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion) return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = CUDA_DRIVER_VERSION;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---------------------------------------------------------------- device handles ------------- */

/* The count stays right on a lost GPU (the device is still enumerated); its handle does not. */
static nvmlReturn_t get_count(unsigned int *deviceCount) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    maybe_slow();
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = g_ndev;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { return get_count(deviceCount); }
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return get_count(deviceCount); }

static nvmlReturn_t get_handle(unsigned int index, nvmlDevice_t *device) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    maybe_slow();
    if (!device || index >= g_ndev) return NVML_ERROR_INVALID_ARGUMENT;
    if (lost()) return NVML_ERROR_GPU_IS_LOST;
    *device = &g_dev[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return get_handle(index, device);
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return get_handle(index, device);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEV_ENTER(device);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEV_ENTER(device);
    return copy_str(name, length, NAME);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEV_ENTER(device);
    char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    fakecuda_uuid(device->index, buf, sizeof buf);
    return copy_str(uuid, length, buf);
}

/* An H100 SXM's ids; bus 0x18 + index. */
API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV_ENTER(device);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->domain = 0;
    pci->bus = 0x18 + device->index;
    pci->device = 0;
    pci->pciDeviceId = 0x233010de;
    pci->pciSubSystemId = 0x16c110de;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus);
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", pci->bus);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- memory, processes ---------- */

static uint64_t mem_used_locked(unsigned dev) {
    uint64_t used = 0;
    for (struct rec *r = g_recs; r; r = r->next)
        if (rec_device(r) == dev) used += __atomic_load_n(&r->p->mem_used_bytes, __ATOMIC_RELAXED);
    return used;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEV_ENTER(device);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_mu);
    scan_locked(mono_ns());
    uint64_t used = mem_used_locked(device->index);
    pthread_mutex_unlock(&g_mu);
    memory->total = MEM_TOTAL;
    memory->used = used;
    memory->free = used < MEM_TOTAL ? MEM_TOTAL - used : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    DEV_ENTER(device);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    pthread_mutex_lock(&g_mu);
    scan_locked(mono_ns());
    uint64_t used = mem_used_locked(device->index);
    pthread_mutex_unlock(&g_mu);
    memory->total = MEM_TOTAL;
    memory->reserved = 0;
    memory->used = used;
    memory->free = used < MEM_TOTAL ? MEM_TOTAL - used : 0;
    return NVML_SUCCESS;
}

/* NVML's size protocol: *infoCount in = room in infos; too little (or infos NULL with processes
 * running) -> NVML_ERROR_INSUFFICIENT_SIZE with *infoCount = the number needed. */
#define RUNNING_PROCESSES(NAME, TYPE, EXTRA)                                                         \
    API nvmlReturn_t NAME(nvmlDevice_t device, unsigned int *infoCount, TYPE *infos) {               \
        DEV_ENTER(device);                                                                           \
        if (!infoCount) return NVML_ERROR_INVALID_ARGUMENT;                                          \
        pthread_mutex_lock(&g_mu);                                                                   \
        scan_locked(mono_ns());                                                                      \
        unsigned n = 0;                                                                              \
        for (struct rec *r = g_recs; r; r = r->next) n += rec_device(r) == device->index;            \
        if (n > *infoCount || (n && !infos)) {                                                       \
            pthread_mutex_unlock(&g_mu);                                                             \
            *infoCount = n;                                                                          \
            return NVML_ERROR_INSUFFICIENT_SIZE;                                                     \
        }                                                                                            \
        unsigned i = 0;                                                                              \
        for (struct rec *r = g_recs; r; r = r->next) {                                               \
            if (rec_device(r) != device->index) continue;                                            \
            memset(&infos[i], 0, sizeof infos[i]);                                                   \
            infos[i].pid = (unsigned)r->pid;                                                         \
            infos[i].usedGpuMemory = __atomic_load_n(&r->p->mem_used_bytes, __ATOMIC_RELAXED);       \
            EXTRA;                                                                                   \
            i++;                                                                                     \
        }                                                                                            \
        pthread_mutex_unlock(&g_mu);                                                                 \
        *infoCount = n;                                                                              \
        return NVML_SUCCESS;                                                                         \
    }

/* not MIG: no GPU or compute instance (0xFFFFFFFF, as the real one reports) */
#define NO_MIG infos[i].gpuInstanceId = 0xffffffffu, infos[i].computeInstanceId = 0xffffffffu
RUNNING_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, NO_MIG)
RUNNING_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, NO_MIG)
RUNNING_PROCESSES(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, (void)0)

/* ---------------------------------------------------------------- utilization ---------------- */

/* Over the period since the previous call on this device (the first call: since the earliest
 * live record's start; 0 % without one). utilization.memory is the copies' share of the period:
 * the simulated device has no memory traffic of its kernels, so it is a proxy, not what a real
 * GPU reports. */
API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    DEV_ENTER(device);
    if (!utilization) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_mu);
    uint64_t now = mono_ns();
    scan_locked(now);
    uint64_t t0 = device->last_util_ns;
    if (!t0)
        for (struct rec *r = g_recs; r; r = r->next)
            if (rec_device(r) == device->index && (!t0 || r->started_ns < t0)) t0 = r->started_ns;
    unsigned gpu = 0, mem = 0;
    if (t0) device_util_locked(device->index, t0, now, &gpu, &mem);
    device->last_util_ns = now;
    pthread_mutex_unlock(&g_mu);
    utilization->gpu = gpu;
    utilization->memory = mem;
    return NVML_SUCCESS;
}

/* One sample per live process on the device: its busy share since lastSeenTimeStamp (us since the
 * epoch), or, with 0, since the previous call that returned samples (else since its start). A
 * process's window starts no earlier than its own start. */
API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                 unsigned int *processSamplesCount,
                                                 unsigned long long lastSeenTimeStamp) {
    DEV_ENTER(device);
    if (!processSamplesCount) return NVML_ERROR_INVALID_ARGUMENT;
    if (g_proc_util_unsupported) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_mu);
    uint64_t now = mono_ns(), wall = real_ns();
    scan_locked(now);
    unsigned n = 0;
    for (struct rec *r = g_recs; r; r = r->next) n += rec_device(r) == device->index;
    uint64_t since = device->last_proc_util_ns;
    if (lastSeenTimeStamp) {
        uint64_t seen_wall = (uint64_t)lastSeenTimeStamp * 1000ull;
        since = seen_wall >= wall ? now : now - (wall - seen_wall < now ? wall - seen_wall : now);
    }
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!n || since >= now) {
        /* no process, or nothing newer than lastSeenTimeStamp: no samples, as the real one says */
        *processSamplesCount = 0;
        rc = NVML_ERROR_NOT_FOUND;
    } else if (!utilization || *processSamplesCount < n) {
        *processSamplesCount = n;
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        unsigned i = 0;
        for (struct rec *r = g_recs; r; r = r->next) {
            if (rec_device(r) != device->index) continue;
            uint64_t t0 = since, k0, c0;
            if (t0 < r->started_ns) t0 = r->started_ns;
            if (t0 < rec_known_from(r)) t0 = rec_known_from(r);
            if (t0 > now) t0 = now;
            rec_busy_at(r, t0, now, &k0, &c0);
            memset(&utilization[i], 0, sizeof utilization[i]);
            utilization[i].pid = (unsigned)r->pid;
            utilization[i].timeStamp = wall / 1000ull;
            utilization[i].smUtil = pct(r->kernel_now > k0 ? r->kernel_now - k0 : 0, now - t0);
            utilization[i].memUtil = pct(r->copy_now > c0 ? r->copy_now - c0 : 0, now - t0);
            i++;
        }
        *processSamplesCount = n;
        device->last_proc_util_ns = now;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* ---------------------------------------------------------------- thermals, power, clocks ---- */

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                          unsigned int *temp) {
    DEV_ENTER(device);
    if (!temp || sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 40 + 40 * recent_util(device->index) / 100;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    DEV_ENTER(device);
    if (!power) return NVML_ERROR_INVALID_ARGUMENT;
    *power = 100000 + 600000 * recent_util(device->index) / 100;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_ENTER(device);
    if (!limit) return NVML_ERROR_INVALID_ARGUMENT;
    *limit = POWER_LIMIT_MW;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_ENTER(device);
    if (!limit) return NVML_ERROR_INVALID_ARGUMENT;
    *limit = POWER_LIMIT_MW;
    return NVML_SUCCESS;
}

/* MHz, an H100 SXM's: graphics, SM, memory, video. */
static const unsigned g_clock[NVML_CLOCK_COUNT] = { 1755, 1755, 2619, 1545 };
static const unsigned g_max_clock[NVML_CLOCK_COUNT] = { 1980, 1980, 2619, 1710 };

API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    DEV_ENTER(device);
    if (!clock || (unsigned)type >= NVML_CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    *clock = g_clock[type];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    DEV_ENTER(device);
    if (!clock || (unsigned)type >= NVML_CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    *clock = g_max_clock[type];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *clocksEventReasons) {
    DEV_ENTER(device);
    if (!clocksEventReasons) return NVML_ERROR_INVALID_ARGUMENT;
    *clocksEventReasons = 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                           unsigned long long *clocksThrottleReasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, clocksThrottleReasons);
}
