from .module import Module, Parameter  # noqa: F401
from .linear import Linear, Conv2d  # noqa: F401
from .activation import ReLU  # noqa: F401
from .loss import MSELoss  # noqa: F401
from .container import Sequential  # noqa: F401
