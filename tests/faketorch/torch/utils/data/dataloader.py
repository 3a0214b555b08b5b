"""DataLoader shaped like torch's where probes look: `_BaseDataLoaderIter.__next__` runs inside
`torch.autograd.profiler.record_function(self._profile_name)` with
_profile_name = f"enumerate(DataLoader)#{self.__class__.__name__}.__next__";
`_SingleProcessDataLoaderIter` fetches in the calling thread; `_MultiProcessingDataLoaderIter`
starts `num_workers` worker processes (multiprocessing, fork), each with an index queue, sharing
one data queue, `prefetch_factor` batches outstanding per worker, results reordered by index."""
import multiprocessing
import queue

import torch

from . import _utils
from ._utils.collate import default_collate
from ._utils.fetch import _MapDatasetFetcher
from ._utils.worker import get_worker_info  # noqa: F401
from .sampler import BatchSampler, SequentialSampler


class DataLoader:
    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device=""):
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor if prefetch_factor is not None else (2 if num_workers else None)
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.multiprocessing_context = multiprocessing_context
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler if sampler is not None else SequentialSampler(dataset)
        if batch_sampler is None and batch_size is not None:
            batch_sampler = BatchSampler(self.sampler, batch_size, drop_last)
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn or default_collate
        self._iterator = None

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def _get_iterator(self):
        if self.num_workers == 0:
            return _SingleProcessDataLoaderIter(self)
        return _MultiProcessingDataLoaderIter(self)

    def __iter__(self):
        return self._get_iterator()

    def __len__(self):
        return len(self._index_sampler)


class _BaseDataLoaderIter:
    def __init__(self, loader):
        self._dataset = loader.dataset
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._num_workers = loader.num_workers
        self._prefetch_factor = loader.prefetch_factor
        self._pin_memory = loader.pin_memory
        self._timeout = loader.timeout
        self._collate_fn = loader.collate_fn
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        self._profile_name = f"enumerate(DataLoader)#{self.__class__.__name__}.__next__"

    def __iter__(self):
        return self

    def _reset(self, loader, first_iter=False):
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0

    def _next_index(self):
        return next(self._sampler_iter)

    def _next_data(self):
        raise NotImplementedError

    def __next__(self):
        with torch.autograd.profiler.record_function(self._profile_name):
            if self._sampler_iter is None:
                self._reset(None)
            data = self._next_data()
            self._num_yielded += 1
            return data

    def __len__(self):
        return len(self._index_sampler)


class _SingleProcessDataLoaderIter(_BaseDataLoaderIter):
    def __init__(self, loader):
        super().__init__(loader)
        self._dataset_fetcher = _MapDatasetFetcher(self._dataset, self._auto_collation, self._collate_fn,
                                                   self._drop_last)

    def _next_data(self):
        index = self._next_index()  # may raise StopIteration
        data = self._dataset_fetcher.fetch(index)
        if self._pin_memory:
            data = _pin(data)
        return _materialize(data)


def _materialize(data):
    """Give the batch's CPU tensors their host memory now (inside __next__), as real torch batches
    already own their storage when the loader yields them; so `.to('cuda')` later only copies."""
    if isinstance(data, torch.Tensor):
        if data.device == "cpu":
            data._ensure_buffer()
    elif isinstance(data, (list, tuple)):
        for d in data:
            _materialize(d)
    elif isinstance(data, dict):
        for d in data.values():
            _materialize(d)
    return data


def _pin(data):
    if isinstance(data, torch.Tensor):
        return data.pin_memory()
    if isinstance(data, (list, tuple)):
        return type(data)(_pin(d) for d in data)
    return data


class _MultiProcessingDataLoaderIter(_BaseDataLoaderIter):
    def __init__(self, loader):
        super().__init__(loader)
        ctx = loader.multiprocessing_context or multiprocessing.get_context("fork")
        if isinstance(ctx, str):
            ctx = multiprocessing.get_context(ctx)
        self._worker_result_queue = ctx.Queue()
        self._workers_done_event = ctx.Event()
        self._index_queues = []
        self._workers = []
        for i in range(self._num_workers):
            index_queue = ctx.Queue()
            index_queue.cancel_join_thread()
            w = ctx.Process(target=_utils.worker._worker_loop,
                            args=(self._dataset, index_queue, self._worker_result_queue,
                                  self._workers_done_event, self._auto_collation, self._collate_fn,
                                  self._drop_last, i, self._num_workers))
            w.daemon = True
            w.start()
            self._index_queues.append(index_queue)
            self._workers.append(w)
        self._data_queue = self._worker_result_queue
        self._shutdown = False
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info = {}
        self._tasks_outstanding = 0
        self._worker_queue_idx_cycle = iter(range(1 << 62))
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _try_put_index(self):
        try:
            index = self._next_index()
        except StopIteration:
            return
        worker_queue_idx = next(self._worker_queue_idx_cycle) % self._num_workers
        self._index_queues[worker_queue_idx].put((self._send_idx, index))
        self._task_info[self._send_idx] = (worker_queue_idx,)
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _try_get_data(self, timeout=_utils.MP_STATUS_CHECK_INTERVAL):
        try:
            data = self._data_queue.get(timeout=timeout)
            return (True, data)
        except queue.Empty:
            for w in self._workers:
                if not w.is_alive():
                    raise RuntimeError(f"DataLoader worker (pid {w.pid}) exited unexpectedly")
            return (False, None)

    def _get_data(self):
        while True:
            success, data = self._try_get_data()
            if success:
                return data

    def _next_data(self):
        while True:
            while self._rcvd_idx < self._send_idx:
                info = self._task_info[self._rcvd_idx]
                if len(info) == 2:  # already received, out of order
                    break
                break
            else:
                self._shutdown_workers()
                raise StopIteration
            info = self._task_info[self._rcvd_idx]
            if len(info) == 2:
                data = self._task_info.pop(self._rcvd_idx)[1]
                return self._process_data(data)
            idx, data = self._get_data()
            self._tasks_outstanding -= 1
            if idx != self._rcvd_idx:
                self._task_info[idx] += (data,)
            else:
                del self._task_info[idx]
                return self._process_data(data)

    def _process_data(self, data):
        self._rcvd_idx += 1
        self._try_put_index()
        if isinstance(data, Exception):
            raise data
        if self._pin_memory:
            data = _pin(data)
        return _materialize(data)

    def _shutdown_workers(self):
        if self._shutdown:
            return
        self._shutdown = True
        self._workers_done_event.set()
        for q in self._index_queues:
            try:
                q.put(None)
            except Exception:
                pass
        for w in self._workers:
            w.join(timeout=5.0)
            if w.is_alive():
                w.terminate()
        for q in self._index_queues:
            q.cancel_join_thread()
            q.close()
        self._worker_result_queue.cancel_join_thread()
        self._worker_result_queue.close()

    def __del__(self):
        try:
            self._shutdown_workers()
        except Exception:
            pass
