from client import Client


def test_default_timeout():
    assert Client("http://api.local/").timeout == 30


def test_explicit_timeout():
    assert Client("http://api.local", timeout=5).timeout == 5


def test_get_passes_timeout():
    seen = {}

    def transport(method, url, timeout):
        seen.update(method=method, url=url, timeout=timeout)
        return "ok"

    assert Client("http://api.local/", transport=transport).get("/users") == "ok"
    assert seen == {"method": "GET", "url": "http://api.local/users", "timeout": 30}
