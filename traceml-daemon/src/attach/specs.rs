//! The probes the daemon places, by the role of the file they go in: which function, which
//! eBPF program at its entry, whether a return probe too (the table [`specs`] reads).
use traceml_common::ProbeId;

use super::maps::Role;
use super::python;
use Matcher::{Contains, Exact};
use ProbeId as P;

/// The return program of most probes with a return probe.
pub const EXIT_PROGRAM: &str = "any_exit";

/// How a probe finds its function in a file.
#[derive(Clone, Copy, Debug)]
pub enum Matcher {
    Exact(&'static str),
    /// A (mangled C++) name containing this text; the first match in the symbol tables.
    Contains(&'static str),
}

/// One probe to place in files of one role.
#[derive(Clone, Copy, Debug)]
pub struct ProbeSpec {
    pub probe: ProbeId,
    /// eBPF program for the entry.
    pub entry: &'static str,
    /// Also attach [`ProbeSpec::exit_program`] as a uretprobe. Never for C++ functions that can
    /// throw: unwinding cannot cross the uretprobe trampoline.
    pub exit: bool,
    /// The return program: `any_exit`, but for `cuGetProcAddress`'s own.
    pub exit_program: &'static str,
    pub matcher: Matcher,
    /// A missing symbol is a failure to report (otherwise the variant is just absent).
    pub required: bool,
    /// The entry program reads neither arguments nor the stack, so the probe may sit on the
    /// first emulated instruction of the function's straight-line start (see
    /// [`super::elf::ElfFile::probe_site`]).
    pub movable: bool,
}

const fn spec(probe: ProbeId, entry: &'static str, exit: bool, matcher: Matcher) -> ProbeSpec {
    ProbeSpec {
        probe,
        entry,
        exit,
        exit_program: EXIT_PROGRAM,
        matcher,
        required: false,
        movable: false,
    }
}

/// CPython's frame evaluator: entry and return.
pub const PYTHON: &[ProbeSpec] = &[ProbeSpec {
    probe: P::PyEval,
    entry: "py_enter",
    exit: true,
    exit_program: EXIT_PROGRAM,
    matcher: Exact(python::EVAL_SYMBOL),
    required: true,
    movable: false,
}];

/// libcudart: launches (entry only), copies and syncs (entry + return; C API, never throws).
/// `_ptsz`/`_ptds` are the per-thread-default-stream variants.
pub const CUDA_RUNTIME: &[ProbeSpec] = &[
    spec(
        P::CudaLaunchKernel,
        "launch",
        false,
        Exact("cudaLaunchKernel"),
    ),
    spec(
        P::CudaLaunchKernel,
        "launch",
        false,
        Exact("cudaLaunchKernel_ptsz"),
    ),
    spec(
        P::CudaLaunchKernelExC,
        "launch",
        false,
        Exact("cudaLaunchKernelExC"),
    ),
    spec(
        P::CudaLaunchKernelExC,
        "launch",
        false,
        Exact("cudaLaunchKernelExC_ptsz"),
    ),
    spec(
        P::CudaGraphLaunch,
        "launch",
        false,
        Exact("cudaGraphLaunch"),
    ),
    spec(
        P::CudaGraphLaunch,
        "launch",
        false,
        Exact("cudaGraphLaunch_ptsz"),
    ),
    spec(P::CudaMemcpy, "call_enter", true, Exact("cudaMemcpy")),
    spec(P::CudaMemcpy, "call_enter", true, Exact("cudaMemcpy_ptds")),
    spec(
        P::CudaMemcpyAsync,
        "call_enter",
        true,
        Exact("cudaMemcpyAsync"),
    ),
    spec(
        P::CudaMemcpyAsync,
        "call_enter",
        true,
        Exact("cudaMemcpyAsync_ptsz"),
    ),
    // `cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream)` (libc10_cuda's
    // copies between devices): `call_enter` maps it to [count, 3 (D2D), dst, src, stream].
    // CUDA 13.2 has no `_ptsz` variant of it.
    spec(
        P::CudaMemcpyPeerAsync,
        "call_enter",
        true,
        Exact("cudaMemcpyPeerAsync"),
    ),
    spec(
        P::CudaStreamSynchronize,
        "call_enter",
        true,
        Exact("cudaStreamSynchronize"),
    ),
    spec(
        P::CudaStreamSynchronize,
        "call_enter",
        true,
        Exact("cudaStreamSynchronize_ptsz"),
    ),
    spec(
        P::CudaDeviceSynchronize,
        "call_enter",
        true,
        Exact("cudaDeviceSynchronize"),
    ),
    spec(
        P::CudaEventSynchronize,
        "call_enter",
        true,
        Exact("cudaEventSynchronize"),
    ),
];

/// libcuda (driver): what cuBLAS, cuDNN, NCCL and Triton use.
pub const CUDA_DRIVER: &[ProbeSpec] = &[
    spec(P::CuLaunchKernel, "launch", false, Exact("cuLaunchKernel")),
    spec(
        P::CuLaunchKernel,
        "launch",
        false,
        Exact("cuLaunchKernel_ptsz"),
    ),
    spec(
        P::CuLaunchKernelEx,
        "launch",
        false,
        Exact("cuLaunchKernelEx"),
    ),
    spec(
        P::CuLaunchKernelEx,
        "launch",
        false,
        Exact("cuLaunchKernelEx_ptsz"),
    ),
    // Same arguments as `cuLaunchKernel`; libcaffe2_nvrtc (torch's lazy NVRTC/driver stub)
    // imports it.
    spec(
        P::CuLaunchCooperativeKernel,
        "launch",
        false,
        Exact("cuLaunchCooperativeKernel"),
    ),
    spec(
        P::CuLaunchCooperativeKernel,
        "launch",
        false,
        Exact("cuLaunchCooperativeKernel_ptsz"),
    ),
    spec(
        P::CuStreamSynchronize,
        "call_enter",
        true,
        Exact("cuStreamSynchronize"),
    ),
    spec(
        P::CuStreamSynchronize,
        "call_enter",
        true,
        Exact("cuStreamSynchronize_ptsz"),
    ),
    spec(
        P::CuCtxSynchronize,
        "call_enter",
        true,
        Exact("cuCtxSynchronize"),
    ),
    spec(
        P::CuEventSynchronize,
        "call_enter",
        true,
        Exact("cuEventSynchronize"),
    ),
    spec(
        P::CuMemcpyHtoD,
        "call_enter",
        true,
        Exact("cuMemcpyHtoD_v2"),
    ),
    spec(
        P::CuMemcpyDtoH,
        "call_enter",
        true,
        Exact("cuMemcpyDtoH_v2"),
    ),
    spec(
        P::CuMemcpyHtoDAsync,
        "call_enter",
        true,
        Exact("cuMemcpyHtoDAsync_v2"),
    ),
    spec(
        P::CuMemcpyDtoHAsync,
        "call_enter",
        true,
        Exact("cuMemcpyDtoHAsync_v2"),
    ),
    // `cuGetProcAddress` (plain and `_v2`): the pointers it hands out, followed (`follow.rs`)
    // where they are not the exported functions' addresses. At library load only.
    ProbeSpec {
        exit_program: "procaddr_exit",
        ..spec(
            P::CuGetProcAddress,
            "procaddr_enter",
            true,
            Exact("cuGetProcAddress"),
        )
    },
    ProbeSpec {
        exit_program: "procaddr_exit",
        ..spec(
            P::CuGetProcAddress,
            "procaddr_enter",
            true,
            Exact("cuGetProcAddress_v2"),
        )
    },
];

/// torch's native entry points (checked in torch 2.15: `docs/torch-hooks.md`).
/// `record_function_enter_new` (libtorch_cpu, exported) and `record_function_exit_new` (static,
/// found in the full symbol table the wheels keep) get entry probes only: C++ that can throw.
/// `THPEngine_run_backward` (libtorch_python, static) is the CPython method behind
/// `loss.backward()`; its body is wrapped in `HANDLE_TH_ERRORS`, which catches every C++
/// exception (verified by forcing `Engine::execute` to throw), so a uretprobe on it is safe.
pub const TORCH: &[ProbeSpec] = &[
    spec(
        P::TorchRecordEnter,
        "record_enter",
        false,
        Contains("record_function_enter_new"),
    ),
    ProbeSpec {
        probe: P::TorchRecordExit,
        entry: "record_exit",
        exit: false,
        exit_program: EXIT_PROGRAM,
        matcher: Contains("record_function_exit_new"),
        required: false,
        movable: true,
    },
    spec(
        P::TorchBackward,
        "call_enter",
        true,
        Contains("THPEngine_run_backward"),
    ),
    // Collectives (docs/torch-hooks.md, "Collectives"): entry markers only, the wait's end is
    // the entry of what follows it (both waits can rethrow: no return probes).
    // `dist.all_reduce` / `work.wait()`: blocked in `c10d::Work::wait`, which then calls
    // `allow_inflight_collective_as_graph_input`.
    spec(
        P::TorchCollectiveWait,
        "mark_enter",
        false,
        Exact("_ZN4c10d4Work4waitENSt6chrono8durationIlSt5ratioILl1ELl1000EEEE"),
    ),
    spec(
        P::TorchCollectiveWait,
        "mark_exit",
        false,
        Exact("_ZN4c10d40allow_inflight_collective_as_graph_inputEv"),
    ),
    // DDP: blocked in `Reducer::finalize_backward` (the bucket futures' waits are inlined),
    // which then parses each bucket's result.
    spec(
        P::TorchCollectiveWait,
        "mark_enter",
        false,
        Exact("_ZN4c10d7Reducer17finalize_backwardEv"),
    ),
    spec(
        P::TorchCollectiveWait,
        "mark_exit",
        false,
        Exact("_ZN4c10d6detail22parseCppCommHookResultERKN3c106IValueE"),
    ),
    // Collectives issued through gloo (a rank's arrival), one probe id per op; `this` (the
    // process group, the ledger's group) is the second argument: the first is the hidden
    // pointer to the returned `c10::intrusive_ptr<Work>`.
    spec(
        P::C10dAllReduce,
        "mark_enter",
        false,
        Contains("_ZN4c10d16ProcessGroupGloo9allreduceE"),
    ),
    spec(
        P::C10dBarrier,
        "mark_enter",
        false,
        Contains("_ZN4c10d16ProcessGroupGloo7barrierE"),
    ),
    spec(
        P::C10dBroadcast,
        "mark_enter",
        false,
        Contains("_ZN4c10d16ProcessGroupGloo9broadcastE"),
    ),
    spec(
        P::C10dAllGather,
        "mark_enter",
        false,
        Contains("_ZN4c10d16ProcessGroupGloo9allgatherE"),
    ),
    spec(
        P::C10dReduceScatter,
        "mark_enter",
        false,
        Contains("_ZN4c10d16ProcessGroupGloo14reduce_scatterE"),
    ),
];

/// NCCL's API (libnccl): entry markers with the element count and datatype (bytes). Each
/// `ncclX` is a weak alias of `pncclX` at the same address: one probe each. `mark_enter` sends
/// the first five arguments; where each call's `count` and `datatype` are is
/// [`crate::event::Api::nccl_bytes`]'s (nccl.h of NCCL 2.30).
pub const NCCL: &[ProbeSpec] = &[
    spec(
        P::NcclAllReduce,
        "mark_enter",
        false,
        Exact("ncclAllReduce"),
    ),
    spec(
        P::NcclReduceScatter,
        "mark_enter",
        false,
        Exact("ncclReduceScatter"),
    ),
    spec(
        P::NcclAllGather,
        "mark_enter",
        false,
        Exact("ncclAllGather"),
    ),
    spec(
        P::NcclBroadcast,
        "mark_enter",
        false,
        Exact("ncclBroadcast"),
    ),
    spec(P::NcclReduce, "mark_enter", false, Exact("ncclReduce")),
    spec(P::NcclSend, "mark_enter", false, Exact("ncclSend")),
    spec(P::NcclRecv, "mark_enter", false, Exact("ncclRecv")),
    spec(P::NcclAllToAll, "mark_enter", false, Exact("ncclAlltoAll")),
    spec(P::NcclGather, "mark_enter", false, Exact("ncclGather")),
    spec(P::NcclScatter, "mark_enter", false, Exact("ncclScatter")),
];

/// libc10: `c10::GradMode::set_enabled(bool)` (exported; starts `push %rbx`), what
/// `torch.no_grad()` and the optimizer's own guard switch. Evaluation is grad mode off.
const TORCH_CORE: &[ProbeSpec] = &[ProbeSpec {
    probe: P::TorchGradMode,
    entry: "grad_mode",
    exit: false,
    exit_program: EXIT_PROGRAM,
    matcher: Exact("_ZN3c108GradMode11set_enabledEb"),
    required: false,
    movable: false,
}];

pub fn specs(role: Role) -> &'static [ProbeSpec] {
    match role {
        Role::Python => PYTHON,
        Role::CudaRuntime => CUDA_RUNTIME,
        Role::CudaDriver => CUDA_DRIVER,
        Role::Torch => TORCH,
        Role::TorchCore => TORCH_CORE,
        Role::Nccl => NCCL,
    }
}
