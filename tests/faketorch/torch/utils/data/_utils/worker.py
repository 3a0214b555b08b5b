"""Worker process loop (like torch.utils.data._utils.worker._worker_loop)."""
import os
import queue

from .fetch import _MapDatasetFetcher

_worker_info = None


class WorkerInfo:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


def get_worker_info():
    return _worker_info


def _worker_loop(dataset, index_queue, data_queue, done_event, auto_collation, collate_fn, drop_last,
                 worker_id, num_workers):
    global _worker_info
    _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, dataset=dataset)
    fetcher = _MapDatasetFetcher(dataset, auto_collation, collate_fn, drop_last)
    parent = os.getppid()  # like torch's ManagerWatchdog: exit when the main process is gone
    while True:
        try:
            r = index_queue.get(timeout=1.0)
        except queue.Empty:
            if done_event.is_set() or os.getppid() != parent:
                break
            continue
        if r is None:
            break
        idx, index = r
        try:
            data = fetcher.fetch(index)
        except Exception as e:  # noqa: BLE001
            data = e
        data_queue.put((idx, data))
    data_queue.cancel_join_thread()
