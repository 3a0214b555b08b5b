from . import collate, fetch, worker  # noqa: F401
MP_STATUS_CHECK_INTERVAL = 5.0
