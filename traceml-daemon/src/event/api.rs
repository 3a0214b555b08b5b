//! The native calls the probes mark (CUDA runtime and driver, torch, collectives) and what
//! they are: a copy's direction, a collective's operation.
use super::*;

/// Which CUDA API an event came from (runtime or driver), for the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    CudaLaunchKernel,
    CudaLaunchKernelExC,
    CudaGraphLaunch,
    CudaMemcpy,
    CudaMemcpyAsync,
    CudaStreamSynchronize,
    CudaDeviceSynchronize,
    CudaEventSynchronize,
    CuLaunchKernel,
    CuLaunchKernelEx,
    CuStreamSynchronize,
    CuCtxSynchronize,
    CuEventSynchronize,
    CuMemcpyHtoD,
    CuMemcpyDtoH,
    CuMemcpyHtoDAsync,
    CuMemcpyDtoHAsync,
    TorchBackward,
    /// A thread blocks until a collective completes (c10d): the `collective_wait` phase.
    CollectiveWait,
    /// A c10d collective issued (op unknown: recordings made before the ops were told apart).
    Collective,
    /// c10d collectives issued through gloo, by op.
    C10dAllReduce,
    C10dBroadcast,
    C10dAllGather,
    C10dReduceScatter,
    C10dBarrier,
    NcclAllReduce,
    NcclReduceScatter,
    NcclAllGather,
    NcclBroadcast,
    NcclReduce,
    NcclSend,
    NcclRecv,
    /// `cuLaunchCooperativeKernel` (driver): a kernel launch, as [`Api::CuLaunchKernel`].
    CuLaunchCooperativeKernel,
    /// `cudaMemcpyPeerAsync`: a device-to-device copy between two devices.
    CudaMemcpyPeerAsync,
    NcclAllToAll,
    NcclGather,
    NcclScatter,
}

impl Api {
    /// The function a user would search for: the CUDA symbol, or torch's / NCCL's entry point.
    pub fn symbol(self) -> &'static str {
        match self {
            Api::CudaLaunchKernel => "cudaLaunchKernel",
            Api::CudaLaunchKernelExC => "cudaLaunchKernelExC",
            Api::CudaGraphLaunch => "cudaGraphLaunch",
            Api::CudaMemcpy => "cudaMemcpy",
            Api::CudaMemcpyAsync => "cudaMemcpyAsync",
            Api::CudaStreamSynchronize => "cudaStreamSynchronize",
            Api::CudaDeviceSynchronize => "cudaDeviceSynchronize",
            Api::CudaEventSynchronize => "cudaEventSynchronize",
            Api::CuLaunchKernel => "cuLaunchKernel",
            Api::CuLaunchKernelEx => "cuLaunchKernelEx",
            Api::CuStreamSynchronize => "cuStreamSynchronize",
            Api::CuCtxSynchronize => "cuCtxSynchronize",
            Api::CuEventSynchronize => "cuEventSynchronize",
            Api::CuMemcpyHtoD => "cuMemcpyHtoD",
            Api::CuMemcpyDtoH => "cuMemcpyDtoH",
            Api::CuMemcpyHtoDAsync => "cuMemcpyHtoDAsync",
            Api::CuMemcpyDtoHAsync => "cuMemcpyDtoHAsync",
            Api::TorchBackward => "torch.autograd.backward",
            Api::CollectiveWait => "c10d Work.wait",
            Api::Collective => "c10d collective",
            Api::C10dAllReduce => "all_reduce",
            Api::C10dBroadcast => "broadcast",
            Api::C10dAllGather => "all_gather",
            Api::C10dReduceScatter => "reduce_scatter",
            Api::C10dBarrier => "barrier",
            Api::NcclAllReduce => "ncclAllReduce",
            Api::NcclReduceScatter => "ncclReduceScatter",
            Api::NcclAllGather => "ncclAllGather",
            Api::NcclBroadcast => "ncclBroadcast",
            Api::NcclReduce => "ncclReduce",
            Api::NcclSend => "ncclSend",
            Api::NcclRecv => "ncclRecv",
            Api::CuLaunchCooperativeKernel => "cuLaunchCooperativeKernel",
            Api::CudaMemcpyPeerAsync => "cudaMemcpyPeerAsync",
            Api::NcclAllToAll => "ncclAlltoAll",
            Api::NcclGather => "ncclGather",
            Api::NcclScatter => "ncclScatter",
        }
    }

    pub fn from_probe(p: ProbeId) -> Option<Api> {
        use ProbeId as P;
        Some(match p {
            P::CudaLaunchKernel => Api::CudaLaunchKernel,
            P::CudaLaunchKernelExC => Api::CudaLaunchKernelExC,
            P::CudaGraphLaunch => Api::CudaGraphLaunch,
            P::CudaMemcpy => Api::CudaMemcpy,
            P::CudaMemcpyAsync => Api::CudaMemcpyAsync,
            P::CudaStreamSynchronize => Api::CudaStreamSynchronize,
            P::CudaDeviceSynchronize => Api::CudaDeviceSynchronize,
            P::CudaEventSynchronize => Api::CudaEventSynchronize,
            P::CuLaunchKernel => Api::CuLaunchKernel,
            P::CuLaunchKernelEx => Api::CuLaunchKernelEx,
            P::CuStreamSynchronize => Api::CuStreamSynchronize,
            P::CuCtxSynchronize => Api::CuCtxSynchronize,
            P::CuEventSynchronize => Api::CuEventSynchronize,
            P::CuMemcpyHtoD => Api::CuMemcpyHtoD,
            P::CuMemcpyDtoH => Api::CuMemcpyDtoH,
            P::CuMemcpyHtoDAsync => Api::CuMemcpyHtoDAsync,
            P::CuMemcpyDtoHAsync => Api::CuMemcpyDtoHAsync,
            P::TorchBackward => Api::TorchBackward,
            P::TorchCollectiveWait => Api::CollectiveWait,
            P::TorchCollective => Api::Collective,
            P::C10dAllReduce => Api::C10dAllReduce,
            P::C10dBroadcast => Api::C10dBroadcast,
            P::C10dAllGather => Api::C10dAllGather,
            P::C10dReduceScatter => Api::C10dReduceScatter,
            P::C10dBarrier => Api::C10dBarrier,
            P::NcclAllReduce => Api::NcclAllReduce,
            P::NcclReduceScatter => Api::NcclReduceScatter,
            P::NcclAllGather => Api::NcclAllGather,
            P::NcclBroadcast => Api::NcclBroadcast,
            P::NcclReduce => Api::NcclReduce,
            P::NcclSend => Api::NcclSend,
            P::NcclRecv => Api::NcclRecv,
            P::CuLaunchCooperativeKernel => Api::CuLaunchCooperativeKernel,
            P::CudaMemcpyPeerAsync => Api::CudaMemcpyPeerAsync,
            P::NcclAllToAll => Api::NcclAllToAll,
            P::NcclGather => Api::NcclGather,
            P::NcclScatter => Api::NcclScatter,
            P::PyEval
            | P::TorchRecordEnter
            | P::TorchRecordExit
            | P::ProcessExec
            | P::SchedSwitch
            | P::CuGetProcAddress
            | P::TorchGradMode => {
                return None;
            }
        })
    }

    /// True for the driver-level (`libcuda`) entry points.
    pub fn is_driver(self) -> bool {
        matches!(
            self,
            Api::CuLaunchKernel
                | Api::CuLaunchKernelEx
                | Api::CuLaunchCooperativeKernel
                | Api::CuStreamSynchronize
                | Api::CuCtxSynchronize
                | Api::CuEventSynchronize
                | Api::CuMemcpyHtoD
                | Api::CuMemcpyDtoH
                | Api::CuMemcpyHtoDAsync
                | Api::CuMemcpyDtoHAsync
        )
    }

    /// Blocking waits for the device (the host thread sleeps until the GPU catches up).
    pub fn is_sync(self) -> bool {
        matches!(
            self,
            Api::CudaStreamSynchronize
                | Api::CudaDeviceSynchronize
                | Api::CudaEventSynchronize
                | Api::CuStreamSynchronize
                | Api::CuCtxSynchronize
                | Api::CuEventSynchronize
        )
    }

    /// A collective issued (c10d or NCCL): counted per step, no phase of its own (the wait for
    /// it is [`Api::CollectiveWait`]).
    pub fn is_collective(self) -> bool {
        matches!(
            self,
            Api::Collective
                | Api::C10dAllReduce
                | Api::C10dBroadcast
                | Api::C10dAllGather
                | Api::C10dReduceScatter
                | Api::C10dBarrier
                | Api::NcclAllReduce
                | Api::NcclReduceScatter
                | Api::NcclAllGather
                | Api::NcclBroadcast
                | Api::NcclReduce
                | Api::NcclSend
                | Api::NcclRecv
                | Api::NcclAllToAll
                | Api::NcclGather
                | Api::NcclScatter
        )
    }

    /// A collective whose op is known (a c10d op through gloo, or an NCCL call): its place in
    /// the ledger.
    pub fn collective_op(self) -> Option<CollectiveOp> {
        use CollectiveOp as O;
        Some(match self {
            Api::C10dAllReduce | Api::NcclAllReduce => O::AllReduce,
            Api::C10dBroadcast | Api::NcclBroadcast => O::Broadcast,
            Api::C10dAllGather | Api::NcclAllGather => O::AllGather,
            Api::C10dReduceScatter | Api::NcclReduceScatter => O::ReduceScatter,
            Api::C10dBarrier => O::Barrier,
            Api::NcclReduce => O::Reduce,
            Api::NcclSend => O::Send,
            Api::NcclRecv => O::Recv,
            Api::NcclAllToAll => O::AllToAll,
            Api::NcclGather => O::Gather,
            Api::NcclScatter => O::Scatter,
            _ => return None,
        })
    }

    /// Whether this api's entry carries the process group: c10d's `this`, in the second
    /// argument register (the first holds the hidden pointer to the returned
    /// `c10::intrusive_ptr<Work>`, a class returned in memory).
    pub fn has_group(self) -> bool {
        matches!(
            self,
            Api::C10dAllReduce
                | Api::C10dBroadcast
                | Api::C10dAllGather
                | Api::C10dReduceScatter
                | Api::C10dBarrier
        )
    }

    /// Bytes of an NCCL call from its raw arguments (`count`, `ncclDataType_t`), each read at
    /// its own position in nccl.h's signature (NCCL 2.30):
    /// `ncclSend(sendbuff, count, datatype, peer, comm, stream)`,
    /// `ncclRecv(recvbuff, count, datatype, peer, comm, stream)`; every other probed call is
    /// `(sendbuff, recvbuff, count, datatype, ...)`: `ncclAllReduce(…, op, comm, stream)`,
    /// `ncclReduceScatter(…, recvcount, datatype, op, comm, stream)`,
    /// `ncclAllGather(…, sendcount, datatype, comm, stream)`,
    /// `ncclBroadcast(…, root, comm, stream)`, `ncclReduce(…, op, root, comm, stream)`,
    /// `ncclAlltoAll(…, comm, stream)` (count per peer), `ncclGather(…, root, comm, stream)`,
    /// `ncclScatter(…, root, comm, stream)`.
    pub fn nccl_bytes(self, args: &[u64; 5]) -> Option<u64> {
        let (count, dtype) = match self {
            Api::NcclSend | Api::NcclRecv => (args[1], args[2]),
            Api::NcclAllReduce
            | Api::NcclReduceScatter
            | Api::NcclAllGather
            | Api::NcclBroadcast
            | Api::NcclReduce
            | Api::NcclAllToAll
            | Api::NcclGather
            | Api::NcclScatter => (args[2], args[3]),
            _ => return None,
        };
        // ncclInt8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Bfloat16,
        // Float8e4m3, Float8e5m2 (nccl.h).
        const SIZE: [u64; 12] = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1];
        let size = SIZE.get(usize::try_from(dtype).ok()?)?;
        count.checked_mul(*size)
    }

    pub fn is_copy(self) -> bool {
        matches!(
            self,
            Api::CudaMemcpy
                | Api::CudaMemcpyAsync
                | Api::CuMemcpyHtoD
                | Api::CuMemcpyDtoH
                | Api::CuMemcpyHtoDAsync
                | Api::CuMemcpyDtoHAsync
                | Api::CudaMemcpyPeerAsync
        )
    }
}

/// A collective's op, as the ledger names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveOp {
    AllReduce,
    Broadcast,
    AllGather,
    ReduceScatter,
    Barrier,
    Reduce,
    Send,
    Recv,
    AllToAll,
    Gather,
    Scatter,
    /// Issued, op not told (recordings made before the ops were told apart).
    Collective,
}

impl CollectiveOp {
    pub fn as_str(self) -> &'static str {
        match self {
            CollectiveOp::AllReduce => "all_reduce",
            CollectiveOp::Broadcast => "broadcast",
            CollectiveOp::AllGather => "all_gather",
            CollectiveOp::ReduceScatter => "reduce_scatter",
            CollectiveOp::Barrier => "barrier",
            CollectiveOp::Reduce => "reduce",
            CollectiveOp::Send => "send",
            CollectiveOp::Recv => "recv",
            CollectiveOp::AllToAll => "all_to_all",
            CollectiveOp::Gather => "gather",
            CollectiveOp::Scatter => "scatter",
            CollectiveOp::Collective => "collective",
        }
    }
}

/// `cudaMemcpyKind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyKind {
    HostToHost,
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
    /// `cudaMemcpyDefault`: direction inferred by the driver from the pointers (unified addressing).
    Default,
    Unknown,
}

impl CopyKind {
    pub fn from_raw(k: u64) -> CopyKind {
        match k {
            0 => CopyKind::HostToHost,
            1 => CopyKind::HostToDevice,
            2 => CopyKind::DeviceToHost,
            3 => CopyKind::DeviceToDevice,
            4 => CopyKind::Default,
            _ => CopyKind::Unknown,
        }
    }
}

/// How a kernel launch reached the GPU (the kernel decides it from the launch probe's caller:
/// [`traceml_common::LaunchPath`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum LaunchPath {
    /// A runtime entry point (`cudaLaunchKernel`, `cudaLaunchKernelExC`, `cudaGraphLaunch`).
    Runtime,
    /// A driver entry point called by a CUDA runtime: the runtime launch's own driver call,
    /// not a launch of its own.
    Nested,
    /// A driver entry point called by a library with its own copy of the runtime (cuBLAS,
    /// cuDNN, NCCL).
    Library,
    /// A driver entry point called directly (Triton's launcher, inductor's static launcher).
    Direct,
}

impl LaunchPath {
    /// The path of a launch event: what the kernel read, or for events recorded before it
    /// did (`raw` 0, or `None`), a runtime probe's launch is the runtime's and a driver
    /// probe's direct.
    pub fn of(api: Api, raw: Option<u64>) -> LaunchPath {
        use traceml_common::LaunchPath as K;
        match raw.map(K::from_u64) {
            Some(K::Runtime) => LaunchPath::Runtime,
            Some(K::Nested) => LaunchPath::Nested,
            Some(K::Library) => LaunchPath::Library,
            Some(K::Direct) => LaunchPath::Direct,
            Some(K::Unknown) | None if api.is_driver() => LaunchPath::Direct,
            Some(K::Unknown) | None => LaunchPath::Runtime,
        }
    }

    /// The raw code ([`traceml_common::LaunchPath`]).
    pub fn code(self) -> u8 {
        use traceml_common::LaunchPath as K;
        (match self {
            LaunchPath::Runtime => K::Runtime,
            LaunchPath::Nested => K::Nested,
            LaunchPath::Library => K::Library,
            LaunchPath::Direct => K::Direct,
        }) as u8
    }

    /// The paths a launch is counted on (a nested driver call is the runtime's launch), in
    /// the order of the summary's `launches_by_path`.
    pub const COUNTED: [LaunchPath; 3] =
        [LaunchPath::Runtime, LaunchPath::Library, LaunchPath::Direct];

    /// Index in [`LaunchPath::COUNTED`]; `None` for a nested call.
    pub fn counted_index(self) -> Option<usize> {
        LaunchPath::COUNTED.iter().position(|&p| p == self)
    }
}
