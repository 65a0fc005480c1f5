import pytest
import users


def test_is_valid_email():
    assert users.is_valid_email("Ann@Example.org")
    assert not users.is_valid_email("no-at-sign.org")
    assert not users.is_valid_email("a b@c.de")


def test_register_uses_helper(monkeypatch):
    monkeypatch.setattr(users, "is_valid_email", lambda email: False)
    with pytest.raises(ValueError):
        users.register_user("x", "x@example.org")


def test_update_uses_helper(monkeypatch):
    users.register_user("y", "y@example.org")
    monkeypatch.setattr(users, "is_valid_email", lambda email: False)
    with pytest.raises(ValueError):
        users.update_email("y", "z@example.org")


def test_behaviour_kept():
    users.register_user("z", "z@example.org")
    with pytest.raises(ValueError):
        users.register_user("q", "bad")
    with pytest.raises(KeyError):
        users.update_email("nobody", "n@example.org")
