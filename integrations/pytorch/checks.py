"""What the integration's tests share: a skip that CTest reports as one,
checks that print both outcomes, and the exit status at the end."""

import sys

failures = []


def skip(why):
    """Ends the test as skipped (CTest's SKIP_REGULAR_EXPRESSION)."""
    print(f"SKIP: {why}")
    sys.exit(0)


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)


def finish():
    """The exit status: 1 when a check failed."""
    if failures:
        print(f"{len(failures)} check(s) FAILED")
        return 1
    print("all checks passed")
    return 0
