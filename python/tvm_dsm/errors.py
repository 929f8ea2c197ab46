"""The one error type tvm-dsm raises for schedules it cannot lower correctly, a check of a
configuration asked as a yes or no, and the line of an error that says why."""

from collections.abc import Callable

import tvm_ffi


@tvm_ffi.register_error  # keeps its type when raised inside a pass run by TVM's pass manager
class ClusterError(ValueError):
    """A cluster or DSM schedule that would launch or run incorrectly.

    Raised instead of generating a kernel that silently computes the wrong answer: each message
    names the limit or the unsupported construct.
    """


def passes(check: Callable[..., object], *args) -> bool:
    """Whether ``check(*args)`` (a configuration's checks) raises no ClusterError."""
    try:
        check(*args)
    except ClusterError:
        return False
    return True


#: How TVM starts the line of an error that says why, where it prints the IR after it.
_REASON_STARTS = ("Error message:", "error:", "Check failed")


def last_line(err: BaseException | str) -> str:
    """The line of an error's message that says why: the last that starts like TVM's reasons
    (``Error message:``, ``error:``, ``Check failed``), else the last one (where TVM puts the
    reason), never the carets under a line of the IR TVM prints with it; the error's type's
    name where it has none."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip().strip("^~ ")]
    reasons = [line for line in lines if line.startswith(_REASON_STARTS)]
    if reasons or lines:
        return (reasons or lines)[-1]
    return type(err).__name__ if isinstance(err, BaseException) else "(no message)"
