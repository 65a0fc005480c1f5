"""Retry helper for flaky calls."""


def retry(func, retries=3, exceptions=(Exception,)):
    """Call `func`; on failure retry up to `retries` more times, then re-raise."""
    last = None
    for _ in range(retries):
        try:
            return func()
        except exceptions as err:
            last = err
    raise last
