"""default_collate: items are Tensors (or tuples of them) -> one batched Tensor per field."""
from ...._tensor import Tensor


def default_collate(batch):
    elem = batch[0]
    if isinstance(elem, Tensor):
        return Tensor((len(batch),) + elem.shape, "cpu", sum(t.nbytes for t in batch))
    if isinstance(elem, (tuple, list)):
        return [default_collate(list(s)) for s in zip(*batch)]
    if isinstance(elem, dict):
        return {k: default_collate([d[k] for d in batch]) for k in elem}
    return batch


def default_convert(data):
    return data
