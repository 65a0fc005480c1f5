import mathutils
import pytest


def test_lerp():
    assert mathutils.lerp(0, 10, 0.5) == 5


def test_clamp():
    assert mathutils.clamp(5, 0, 10) == 5
    assert mathutils.clamp(-1, 0, 10) == 0
    assert mathutils.clamp(11, 0, 10) == 10


def test_clamp_bad_bounds():
    with pytest.raises(ValueError):
        mathutils.clamp(1, 5, 0)
