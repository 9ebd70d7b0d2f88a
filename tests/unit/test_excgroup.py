"""The one exception-group walker (vgpud.excgroup)."""

from __future__ import annotations

from vgpud.excgroup import leaves


def test_leaves_are_the_plain_exceptions_depth_first_in_order() -> None:
    a, b, c, d = ValueError("a"), KeyError("b"), KeyboardInterrupt(), OSError("d")
    group = BaseExceptionGroup("outer", [a, BaseExceptionGroup("inner", [b, ExceptionGroup("x", [d])]), c])
    assert list(leaves(group)) == [a, b, d, c]


def test_a_plain_exception_is_its_own_leaf() -> None:
    err = RuntimeError("alone")
    assert list(leaves(err)) == [err]
