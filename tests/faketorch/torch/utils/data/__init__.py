from .dataset import Dataset, IterableDataset, TensorDataset  # noqa: F401
from .dataloader import DataLoader, get_worker_info  # noqa: F401
from .sampler import Sampler, SequentialSampler, BatchSampler  # noqa: F401
