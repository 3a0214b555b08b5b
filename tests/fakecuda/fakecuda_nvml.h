/* Shared-memory record of one process's simulated device, written by the stand-in driver
 * (fakecuda_driver.c) and read by the stand-in NVML (fakenvml.c). See tests/README.md
 * ("Stand-in NVML").
 *
 * One file per process, $FAKECUDA_NVML_DIR/proc-<pid> (default directory FAKECUDA_NVML_DIR_DEFAULT,
 * created 0777), created (write + rename) when the process's device starts and unlinked at its
 * normal exit. The file holds exactly one struct fakecuda_nvml_proc: every field a uint64_t, so the
 * layout is the same from C, Rust (#[repr(C)]) or Python (ctypes / struct "<14Q"). Append only,
 * bump FAKECUDA_NVML_VERSION.
 *
 * Writers use atomic stores. The busy fields (kernel_* and copy_*) have one writer, the device
 * thread, and are published under a sequence count: `seq` is odd while they change, so a reader
 * that sees the same even `seq` before and after reading them has a consistent snapshot.
 * mem_used_bytes is updated by atomic adds from the allocation paths (any thread).
 *
 * Busy time of a record at CLOCK_MONOTONIC time t (what NVML's utilization is made of):
 *     kernel_busy_ns + (busy_start_ns ? clamp(min(t, busy_end_ns) - busy_start_ns, 0) : 0)
 * and the same with copy_*. Readers must skip a record whose process is gone: kill(pid, 0) fails
 * with ESRCH, /proc/<pid>/stat says zombie, or its start time (field 22) differs from start_ticks
 * (the pid was reused).
 */
#ifndef FAKECUDA_NVML_H
#define FAKECUDA_NVML_H
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#define FAKECUDA_NVML_MAGIC 0x6c6d766e61637566ull /* "fucanvml" little-endian: "fakecuda nvml" */
#define FAKECUDA_NVML_VERSION 1
#define FAKECUDA_NVML_DIR_DEFAULT "/dev/shm/fakecuda-nvml"
#define FAKECUDA_NVML_MAX_DEVICES 64

struct fakecuda_nvml_proc {
    uint64_t magic;          /* FAKECUDA_NVML_MAGIC, stored last when the record is made */
    uint64_t version;        /* FAKECUDA_NVML_VERSION */
    uint64_t pid;
    uint64_t device;         /* physical device index of the process's queue */
    uint64_t mem_used_bytes; /* cuMemAlloc_v2 bytes (as requested) minus the bytes freed */
    uint64_t kernel_busy_ns; /* simulated kernel (and graph) time the device finished */
    uint64_t busy_start_ns;  /* CLOCK_MONOTONIC start of the kernel now executing, 0 when none */
    uint64_t started_ns;     /* CLOCK_MONOTONIC time the device started (the record was made) */
    /* every field below is also version 1 */
    uint64_t busy_end_ns;    /* end of that kernel on the device timeline, 0 when none */
    uint64_t copy_busy_ns;   /* simulated copy time the device finished */
    uint64_t copy_start_ns;  /* start of the copy now executing, 0 when none */
    uint64_t copy_end_ns;    /* its end, 0 when none */
    uint64_t seq;            /* odd while the device thread updates the six busy fields */
    uint64_t start_ticks;    /* the process's start time, /proc/<pid>/stat field 22 */
};

/* Deterministic UUID of physical device `index` (NVML's nvmlDeviceGetUUID; the stand-in driver
 * also accepts it in CUDA_VISIBLE_DEVICES, as real CUDA does). */
static inline void fakecuda_uuid(unsigned index, char *buf, size_t len) {
    unsigned h = (index + 1) * 2654435761u;
    snprintf(buf, len, "GPU-7e57c0da-%04x-4%03x-8%03x-%012x", (h >> 16) & 0xffff, index & 0xfff,
             (h >> 4) & 0xfff, index);
}

/* State letter and start time (field 22, clock ticks since boot) of a process from
 * /proc/<pid>/stat; 0 on success, -1 when it cannot be read. */
static inline int fakecuda_proc_stat(pid_t pid, char *state, uint64_t *start_ticks) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p) return -1;
    unsigned long long st = 0;
    char c = 0;
    /* after ")": state (field 3), then fields 4..21, then starttime (22) */
    if (sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &c,
               &st) != 2)
        return -1;
    if (state) *state = c;
    if (start_ticks) *start_ticks = st;
    return 0;
}

#endif
