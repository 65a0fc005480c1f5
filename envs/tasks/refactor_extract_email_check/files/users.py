"""User registry."""
import re

_users = {}


def register_user(username, email):
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]{2,}", email.lower()):
        raise ValueError(f"invalid email: {email}")
    _users[username] = email
    return username


def update_email(username, email):
    if username not in _users:
        raise KeyError(username)
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]{2,}", email.lower()):
        raise ValueError(f"invalid email: {email}")
    _users[username] = email
