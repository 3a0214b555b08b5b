"""Fake Tensor: a size in bytes, a device, an optional host/device buffer, and the autograd cost
of the ops that produced it. CUDA work goes through the stand-in libcudart:
  .to('cuda', non_blocking=b)  cudaMemcpyAsync(kind=1) [+ cudaStreamSynchronize unless b]
  .to('cpu') / .cpu()          cudaMemcpyAsync(kind=2) + cudaStreamSynchronize
  .item()                      cudaMemcpyAsync(kind=2, 4 bytes, pageable) + cudaStreamSynchronize
  .backward()                  torch.autograd.backward -> native THPEngine_run_backward
"""
import ctypes

from . import _C


class device:
    def __init__(self, spec, index=None):
        if isinstance(spec, device):
            spec, index = spec.type, spec.index if index is None else index
        t, _, i = str(spec).partition(":")
        self.type = t
        self.index = int(i) if i else (None if index is None else int(index))

    def __repr__(self):
        return f"device(type='{self.type}')" if self.index is None else \
            f"device(type='{self.type}', index={self.index})"


def _dev(d):
    return d.type if isinstance(d, device) else str(d).split(":")[0]


_POOL = {}  # (kind, nbytes) -> free pointers: a caching allocator like torch's (no cudaFree per step)
# Device bytes held by live tensors, and cudaMalloc'd in all (torch.cuda.memory_allocated/_reserved).
DEVICE_BYTES = {"allocated": 0, "reserved": 0}


class _Buffer:
    """Memory behind a tensor: pageable host (ctypes buffer), pinned host (cudaMallocHost) or device
    (cudaMalloc). Pinned and device memory is cached on release and reused, never freed, like
    torch's CUDACachingAllocator / CachingHostAllocator (so steady-state steps call no cudaFree)."""

    def __init__(self, nbytes, kind):
        self.nbytes, self.kind, self.ptr, self._keep = nbytes, kind, None, None
        if kind == "pageable":
            self._keep = ctypes.create_string_buffer(max(nbytes, 1))
            self.ptr = ctypes.addressof(self._keep)
            return
        free = _POOL.get((kind, nbytes))
        if free:
            self.ptr = free.pop()
        else:
            p = ctypes.c_void_p()
            lib = _C.cudart()
            fn = lib.cudaMalloc if kind == "device" else lib.cudaMallocHost
            _C.check(fn(ctypes.byref(p), max(nbytes, 1)), fn.__name__)
            self.ptr = p.value
            if kind == "device":
                DEVICE_BYTES["reserved"] += max(nbytes, 1)
        if kind == "device":
            DEVICE_BYTES["allocated"] += nbytes

    def __del__(self):
        if self.kind != "pageable" and self.ptr is not None:
            _POOL.setdefault((self.kind, self.nbytes), []).append(self.ptr)
            if self.kind == "device":
                DEVICE_BYTES["allocated"] -= self.nbytes


class Tensor:
    def __init__(self, shape=(1,), device="cpu", nbytes=None, requires_grad=False, pinned=False,
                 _cost=None, _buffer=None):
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        n = 1
        for s in self.shape:
            n *= int(s)
        self.nbytes = int(nbytes) if nbytes is not None else 4 * n
        self.device = device if isinstance(device, str) else _dev(device)
        self.requires_grad = requires_grad
        self.grad = None
        # autograd cost accumulated along the graph: [cpu_ns, launches, kernel_ns_total]
        self._cost = list(_cost) if _cost else [0, 0, 0]
        self._buffer = _buffer
        self._pinned = pinned

    # -- memory --------------------------------------------------------------------------------
    def _ensure_buffer(self):
        if self._buffer is None:
            kind = "device" if self.device == "cuda" else ("pinned" if self._pinned else "pageable")
            self._buffer = _Buffer(self.nbytes, kind)
        return self._buffer

    def pin_memory(self):
        t = Tensor(self.shape, "cpu", self.nbytes, pinned=True)
        t._ensure_buffer()
        return t

    def is_pinned(self):
        return self._pinned

    @property
    def is_cuda(self):
        return self.device == "cuda"

    def numel(self):
        return self.nbytes // 4

    def element_size(self):
        return 4

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self):
        return len(self.shape)

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"tensor(shape={self.shape}, device='{self.device}', nbytes={self.nbytes})"

    # -- copies --------------------------------------------------------------------------------
    def to(self, dev, non_blocking=False, **kwargs):
        target = _dev(dev)
        if target == self.device:
            return self
        src = self._ensure_buffer()
        out = Tensor(self.shape, target, self.nbytes, self.requires_grad, _cost=self._cost)
        dst = out._ensure_buffer()
        lib = _C.cudart()
        kind = 1 if target == "cuda" else 2
        _C.check(lib.cudaMemcpyAsync(dst.ptr, src.ptr, self.nbytes, kind, None), "cudaMemcpyAsync")
        if not non_blocking:
            _C.check(lib.cudaStreamSynchronize(None), "cudaStreamSynchronize")
        return out

    def cuda(self, non_blocking=False):
        return self.to("cuda", non_blocking=non_blocking)

    def cpu(self):
        return self.to("cpu")

    def item(self):
        if self.device == "cuda":
            lib = _C.cudart()
            host = ctypes.create_string_buffer(8)
            _C.check(lib.cudaMemcpyAsync(ctypes.addressof(host), self._ensure_buffer().ptr, 4, 2, None),
                     "cudaMemcpyAsync")
            _C.check(lib.cudaStreamSynchronize(None), "cudaStreamSynchronize")
        return 0.5

    def detach(self):
        return Tensor(self.shape, self.device, self.nbytes, _buffer=self._buffer)

    # -- autograd ------------------------------------------------------------------------------
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        from . import autograd
        autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)

    def _derive(self, shape, nbytes, cpu_ns, launches, kernel_ns):
        c = self._cost
        return Tensor(shape, self.device, nbytes, True,
                      _cost=[c[0] + cpu_ns, c[1] + launches, c[2] + launches * kernel_ns])


def tensor(data, device="cpu"):
    n = len(data) if hasattr(data, "__len__") else 1
    return Tensor((n,), device)


def empty(*shape, device="cpu", nbytes=None, pin_memory=False):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    t = Tensor(shape, device, nbytes, pinned=pin_memory)
    return t


randn = zeros = ones = empty
