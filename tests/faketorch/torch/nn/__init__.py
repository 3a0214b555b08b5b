from .modules import Module, Linear, ReLU, MSELoss, Sequential, Parameter  # noqa: F401
from . import modules  # noqa: F401
