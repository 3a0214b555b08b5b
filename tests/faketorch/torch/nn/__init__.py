from .modules import Module, Linear, Conv2d, ReLU, MSELoss, Sequential, Parameter  # noqa: F401
from . import modules  # noqa: F401
