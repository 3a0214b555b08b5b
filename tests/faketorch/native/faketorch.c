/*
 * Native side of the fake `torch` package. Built twice (see ../build.sh):
 *
 *   -DFT_CPU    -> torch/lib/libtorch_cpu.so    (the file where real torch defines these)
 *   -DFT_PYTHON -> torch/lib/libtorch_python.so (NEEDED libtorch_cpu.so, like real torch)
 *
 * It defines functions under THE SAME (mangled) symbol names, binding and calling convention as
 * real torch 2.x (checked against the torch 2.15.0 wheel; see tests/README.md):
 *
 * libtorch_cpu.so
 *   GLOBAL _ZN5torch8autograd8profiler25record_function_enter_newERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEERKSt8optionalIS7_E
 *          c10::intrusive_ptr<PythonRecordFunction>
 *          torch::autograd::profiler::record_function_enter_new(const std::string& name,
 *                                                              const std::optional<std::string>& args)
 *          The result is a non-trivial class returned through a hidden pointer, so at the ABI
 *          level: rdi = return slot, rsi = &name (std::string: char* data first, then size_t
 *          length, then 16 bytes of SSO buffer / capacity), rdx = &args.
 *   LOCAL  _ZN5torch8autograd8profilerL24record_function_exit_newERKN3c1013intrusive_ptrINS1_20PythonRecordFunctionENS2_6detail34intrusive_target_default_null_typeIS4_EEEE
 *          static void record_function_exit_new(const c10::intrusive_ptr<PythonRecordFunction>&)
 *          (local symbol, only in .symtab, like the real one); it calls RecordFunction::end.
 *   GLOBAL _ZN2at14RecordFunction3endEv      at::RecordFunction::end()  (this = rdi)
 *   GLOBAL _ZN5torch8autograd6Engine7executeERKSt6vectorINS0_4EdgeESaIS3_EERKS2_IN2at6TensorESaIS9_EEbbbS7_
 *          torch::autograd::Engine::execute(roots, inputs, keep_graph, create_graph,
 *                                           accumulate_grad, outputs)  (this = rdi)
 *
 * libtorch_python.so
 *   LOCAL  _ZL22THPEngine_run_backwardP7_objectS0_S0_
 *          static PyObject* THPEngine_run_backward(PyObject* self, PyObject* args, PyObject* kwargs)
 *          returns non-NULL on success (NULL = Python exception), calls Engine::execute.
 *
 * Real torch reaches these through pybind/the dispatcher; the fake Python package reaches them
 * through ctypes and the exported faketorch_* entry points below, which only forward.
 *
 * The fake autograd engine runs, on the calling thread (as real torch does for CPU graphs),
 * simulated CPU work and kernel launches through the libcudart the process loaded.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default"), noinline))

/* libstdc++ (new ABI) std::string layout. */
struct std_string {
    char *data;
    size_t len;
    union {
        char local[16];
        size_t capacity;
    };
};
/* std::optional<std::string> */
struct std_optional_string {
    struct std_string value;
    unsigned char engaged;
};

/* What at::RecordFunction looks like to us: only what we need. */
struct RecordFunction {
    uint64_t magic;
    char name[128];
    int active;
};
#define RF_MAGIC 0x5265636f726446ull

/* PythonRecordFunction: intrusive_ptr target (vtable, refcounts) with the RecordFunction at +0x10,
 * the same offset real torch uses (record_function_exit_new does `mov (%rdi),%rdi; add $0x10,%rdi;
 * jmp RecordFunction::end`). */
struct PythonRecordFunction {
    void *vtable;
    uint32_t refcount, weakcount;
    struct RecordFunction record;
};

/* Parameters of a simulated backward, passed as the `args` object of THPEngine_run_backward. */
struct ft_backward {
    uint64_t cpu_ns;      /* simulated CPU work, spread evenly around the launches */
    uint64_t launches;    /* kernels launched through cudaLaunchKernel */
    uint64_t kernel_ns;   /* duration of each kernel on the simulated device */
};

__attribute__((unused)) static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Busy-wait (the thread stays on CPU, like real CPU work). */
__attribute__((unused)) static void spin_ns(uint64_t ns) {
    uint64_t end = now_ns() + ns;
    while (now_ns() < end) {
    }
}

#ifdef FT_CPU
/* ------------------------------------------------------------------ libtorch_cpu.so ---------- */

static uint64_t g_enter_calls, g_exit_calls, g_end_calls, g_execute_calls;

EXPORT void at_RecordFunction_end(struct RecordFunction *self) __asm__("_ZN2at14RecordFunction3endEv");
EXPORT void at_RecordFunction_end(struct RecordFunction *self) {
    /* Real: starts `cmpb $0x0,0x68(%rdi)` (reads its object first). Test the argument before
     * touching the counter so the first instruction is never a LOCK-prefixed add. */
    if (!self) return;
    __atomic_add_fetch(&g_end_calls, 1, __ATOMIC_RELAXED);
    if (self->magic == RF_MAGIC) self->active = 0;
}

/* c10::intrusive_ptr<PythonRecordFunction> is one pointer; returned through the hidden slot. */
EXPORT void record_function_enter_new(struct PythonRecordFunction **ret, const struct std_string *name,
                                      const struct std_optional_string *args)
    __asm__("_ZN5torch8autograd8profiler25record_function_enter_newERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEERKSt8optionalIS7_E");
EXPORT void record_function_enter_new(struct PythonRecordFunction **ret, const struct std_string *name,
                                      const struct std_optional_string *args) {
    (void)args;
    struct PythonRecordFunction *p = calloc(1, sizeof *p);
    p->refcount = 1;
    p->weakcount = 1;
    p->record.magic = RF_MAGIC;
    size_t n = name->len < sizeof p->record.name - 1 ? name->len : sizeof p->record.name - 1;
    memcpy(p->record.name, name->data, n);
    p->record.active = 1;
    __atomic_add_fetch(&g_enter_calls, 1, __ATOMIC_RELAXED);
    *ret = p;
}

__attribute__((noipa, used)) static void record_function_exit_new(struct PythonRecordFunction *const *rec)
    __asm__("_ZN5torch8autograd8profilerL24record_function_exit_newERKN3c1013intrusive_ptrINS1_20PythonRecordFunctionENS2_6detail34intrusive_target_default_null_typeIS4_EEEE");
__attribute__((noipa, used)) static void record_function_exit_new(struct PythonRecordFunction *const *rec) {
    struct PythonRecordFunction *p = *rec; /* real: mov (%rdi),%rdi; add $0x10,%rdi; jmp end */
    if (!p) return;
    __atomic_add_fetch(&g_exit_calls, 1, __ATOMIC_RELAXED);
    at_RecordFunction_end(&p->record);
}

/* The dispatcher's boxed kernel for profiler::_record_function_exit._RecordFunction. */
EXPORT void faketorch_dispatch_record_function_exit(struct PythonRecordFunction *handle) {
    struct PythonRecordFunction *h = handle;
    record_function_exit_new(&h);
    if (--h->refcount == 0) free(h);
}

/* libcudart.so.12/13 function pointers, resolved from the handle the Python side loaded. */
typedef struct { unsigned int x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef void (*set_ns_fn)(uint64_t);
static launch_fn g_launch;
static set_ns_fn g_set_kernel_ns;

static launch_fn g_rt_launch;
static set_ns_fn g_rt_set_kernel_ns;
typedef int (*ext_launch_fn)(int, unsigned long long, void *);
static ext_launch_fn g_ext_launch;

EXPORT int faketorch_set_cudart(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(path, RTLD_NOW);
    if (!h) return -1;
    g_rt_launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
    g_rt_set_kernel_ns = (set_ns_fn)dlsym(h, "fakecuda_set_kernel_ns");
    if (!g_ext_launch) {
        g_launch = g_rt_launch;
        g_set_kernel_ns = g_rt_set_kernel_ns;
    }
    return g_rt_launch ? 0 : -2;
}

/* Where the engine's kernels go (faketorch_set_launcher): path 0 the runtime (cudaLaunchKernel),
 * 1 the vendor library in `lib` (fakeblas_gemm: cuBLAS's shape), 2 the Triton launcher in `lib`
 * (faketriton_launch). The engine keeps calling g_launch / g_set_kernel_ns; for paths 1 and 2
 * these are the two functions below, which hand each kernel to the library. */
static uint64_t g_ext_kernel_ns;
static void ext_set_kernel_ns(uint64_t ns) { g_ext_kernel_ns = ns; }
static int ext_launch(const void *func, dim3 g, dim3 b, void **args, size_t smem, void *stream) {
    (void)func; (void)g; (void)b; (void)args; (void)smem;
    return g_ext_launch(1, g_ext_kernel_ns, stream);
}

EXPORT int faketorch_set_launcher(int path, const char *lib) {
    if (path == 0) {
        g_ext_launch = NULL;
        g_launch = g_rt_launch;
        g_set_kernel_ns = g_rt_set_kernel_ns;
        return 0;
    }
    void *h = lib ? dlopen(lib, RTLD_NOW) : NULL;
    if (!h) return -1;
    ext_launch_fn f = (ext_launch_fn)dlsym(h, path == 1 ? "fakeblas_gemm" : "faketriton_launch");
    if (!f) return -2;
    g_ext_launch = f;
    g_set_kernel_ns = ext_set_kernel_ns;
    g_launch = ext_launch;
    return 0;
}

static void backward_kernel(void) {}

EXPORT int engine_execute(void *ret, void *self, const void *roots, const void *inputs, int keep_graph, int create_graph,
                          int accumulate_grad, const void *outputs)
    __asm__("_ZN5torch8autograd6Engine7executeERKSt6vectorINS0_4EdgeESaIS3_EERKS2_IN2at6TensorESaIS9_EEbbbS7_");
/* Real: returns variable_list (a std::vector) through a hidden pointer (rdi, before `this` in rsi,
 * Itanium ABI); here the roots vector
 * stands in for the graph: `roots` points to a struct ft_backward. */
EXPORT int engine_execute(void *ret, void *self, const void *roots, const void *inputs, int keep_graph, int create_graph,
                          int accumulate_grad, const void *outputs) {
    (void)ret; (void)self; (void)inputs; (void)keep_graph; (void)create_graph; (void)accumulate_grad; (void)outputs;
    const struct ft_backward *b = roots;
    __atomic_add_fetch(&g_execute_calls, 1, __ATOMIC_RELAXED);
    if (!b) return -1;
    uint64_t n = b->launches;
    if (n && !g_launch) return -2;
    uint64_t slice = b->cpu_ns / (n + 1);
    if (n && g_set_kernel_ns) g_set_kernel_ns(b->kernel_ns);
    dim3 g = {1, 1, 1}, bl = {128, 1, 1};
    for (uint64_t i = 0; i < n; i++) {
        spin_ns(slice);
        int e = g_launch((const void *)backward_kernel, g, bl, NULL, 0, NULL);
        if (e) return e;
    }
    spin_ns(b->cpu_ns - slice * n);
    return 0;
}

EXPORT void faketorch_cpu_counters(uint64_t out[4]) {
    out[0] = g_enter_calls;
    out[1] = g_exit_calls;
    out[2] = g_end_calls;
    out[3] = g_execute_calls;
}
#endif /* FT_CPU */

#ifdef FT_PYTHON
/* ------------------------------------------------------------------ libtorch_python.so ------- */

void record_function_enter_new(struct PythonRecordFunction **ret, const struct std_string *name,
                               const struct std_optional_string *args)
    __asm__("_ZN5torch8autograd8profiler25record_function_enter_newERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEERKSt8optionalIS7_E");
int engine_execute(void *ret, void *self, const void *roots, const void *inputs, int keep_graph, int create_graph,
                   int accumulate_grad, const void *outputs)
    __asm__("_ZN5torch8autograd6Engine7executeERKSt6vectorINS0_4EdgeESaIS3_EERKS2_IN2at6TensorESaIS9_EEbbbS7_");
void faketorch_dispatch_record_function_exit(struct PythonRecordFunction *handle);

static uint64_t g_engine_object[4]; /* the Engine singleton (`this`) */
static uint64_t g_engine_result[3]; /* variable_list return slot */
static uint64_t g_none_object[2];   /* stands in for Py_None */

/* torch.ops.profiler._record_function_enter_new(name, args): builds the std::string the way
 * libstdc++ does (SSO for up to 15 bytes, heap otherwise) and calls into libtorch_cpu. */
EXPORT void *faketorch_record_function_enter(const char *name, size_t len) {
    struct std_string s;
    struct std_optional_string none;
    memset(&none, 0, sizeof none);
    if (len < sizeof s.local) {
        s.data = s.local;
        memcpy(s.local, name, len);
        s.local[len] = 0;
    } else {
        s.data = malloc(len + 1);
        memcpy(s.data, name, len);
        s.data[len] = 0;
        s.capacity = len;
    }
    s.len = len;
    struct PythonRecordFunction *ret = NULL;
    record_function_enter_new(&ret, &s, &none);
    if (s.data != s.local) free(s.data);
    return ret;
}

/* torch.ops.profiler._record_function_exit._RecordFunction(record) */
EXPORT void faketorch_record_function_exit(void *handle) {
    faketorch_dispatch_record_function_exit(handle);
}

__attribute__((noipa, used)) static void *THPEngine_run_backward(void *self, void *args, void *kwargs)
    __asm__("_ZL22THPEngine_run_backwardP7_objectS0_S0_");
__attribute__((noipa, used)) static void *THPEngine_run_backward(void *self, void *args, void *kwargs) {
    (void)self; (void)kwargs;
    /* Real: parses args, releases the GIL (ctypes already released it), runs the engine. */
    int e = engine_execute(g_engine_result, g_engine_object, args, NULL, 0, 0, 1, NULL);
    return e == 0 ? (void *)g_none_object : NULL;
}

/* Variable._execution_engine.run_backward(...): returns 0 on success. */
EXPORT int faketorch_run_backward(uint64_t cpu_ns, uint64_t launches, uint64_t kernel_ns) {
    struct ft_backward b = {cpu_ns, launches, kernel_ns};
    static uint64_t engine_self[2];
    return THPEngine_run_backward(engine_self, &b, NULL) ? 0 : -1;
}
#endif /* FT_PYTHON */
