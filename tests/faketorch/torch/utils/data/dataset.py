class Dataset:
    def __getitem__(self, index):
        raise NotImplementedError

    def __add__(self, other):
        raise NotImplementedError


class IterableDataset(Dataset):
    def __iter__(self):
        raise NotImplementedError


class TensorDataset(Dataset):
    def __init__(self, *tensors):
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t for t in self.tensors)

    def __len__(self):
        return len(self.tensors[0])
