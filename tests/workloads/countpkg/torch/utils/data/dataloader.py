"""A minimal stand-in for torch's DataLoader iterator, at the path the daemon classifies
(torch/utils/data/dataloader.py), for the exact-count attach tests."""


class _BaseDataLoaderIter:
    def __init__(self, n):
        self.i = 0
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i
