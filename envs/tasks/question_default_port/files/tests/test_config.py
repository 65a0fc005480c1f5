from server.config import resolve_port


def test_env_wins():
    assert resolve_port({"SHOP_PORT": "1234"}) == 1234
