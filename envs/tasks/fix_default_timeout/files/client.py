"""Tiny HTTP client wrapper (transport injected for testing)."""

DEFAULT_TIMEOUT = 0  # seconds


class Client:
    def __init__(self, base_url, timeout=None, transport=None):
        self.base_url = base_url.rstrip("/")
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self.transport = transport

    def url(self, path):
        return f"{self.base_url}/{path.lstrip('/')}"

    def get(self, path):
        return self.transport("GET", self.url(path), timeout=self.timeout)
