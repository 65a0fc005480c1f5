import pytest
from stack import Stack


def test_push_pop():
    s = Stack()
    s.push(1)
    s.push(2)
    assert s.pop() == 2
    assert len(s) == 1


def test_peek():
    s = Stack()
    s.push("x")
    s.push("y")
    assert s.peek() == "y"
    assert len(s) == 2


def test_peek_empty():
    with pytest.raises(IndexError):
        Stack().peek()


def test_is_empty():
    s = Stack()
    assert s.is_empty()
    s.push(0)
    assert not s.is_empty()
