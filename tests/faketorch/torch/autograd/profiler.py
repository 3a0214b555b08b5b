"""torch.autograd.profiler.record_function, shaped like torch's: __enter__ calls the native
record_function_enter_new with the name, __exit__ calls the native record_function_exit."""
from .. import _C


class _ContextDecorator:
    def __call__(self, func):
        import functools

        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        return wrapped


class record_function(_ContextDecorator):
    def __init__(self, name, args=None):
        self.name = name
        self.args = args
        self.run_callbacks_on_exit = True
        self.record = None

    def __enter__(self):
        self.record = _C.record_function_enter(self.name)
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if not self.run_callbacks_on_exit:
            return
        record = self.record
        assert record is not None
        _C.record_function_exit(record)
