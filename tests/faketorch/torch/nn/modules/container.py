from .module import Module


class Sequential(Module):
    def __init__(self, *args):
        super().__init__()
        for idx, module in enumerate(args):
            setattr(self, str(idx), module)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def forward(self, input):
        for module in self:
            input = module(input)
        return input
