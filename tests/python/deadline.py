"""Per-test deadlines for the suites that run one pytest per rank (tests/python/gpu under torchrun).

A test that runs past its deadline has every thread's stack dumped to stderr and its process ended
(exit code 1) by faulthandler's watchdog, a C thread: it fires while the test is blocked in C with
the GIL held (a CUDA wait, an NCCL collective, a store wait), where a Python timer (pytest-timeout's
thread method) would wait for the GIL. torchrun then stops the other ranks (their stacks are dumped
on SIGTERM too, with ``dump_on_sigterm``), so a rank that hangs ends the job within its deadline
instead of holding every rank until the job's own timeout. The deadline covers the whole test
(setup, call, teardown) and is re-armed at each phase, because pytest's faulthandler plugin cancels
any pending dump when a phase fails.

    @pytest.mark.deadline(seconds)   this test's bound (default: DEFAULT_SECONDS)

Environment: SYMMEM_TEST_DEADLINE_S replaces the default; SYMMEM_TEST_DEADLINE_SCALE multiplies
every bound (a slower machine). A conftest registers it:
``config.pluginmanager.register(deadline.Deadlines(), "symmem-deadlines")`` in its pytest_configure.
"""
import faulthandler
import os
import signal
import time

import pytest

DEFAULT_SECONDS = 240.0


class Deadlines:
    def __init__(self, default_seconds=None, dump_on_sigterm=False):
        self.default = float(os.environ.get("SYMMEM_TEST_DEADLINE_S", default_seconds or DEFAULT_SECONDS))
        self.scale = float(os.environ.get("SYMMEM_TEST_DEADLINE_SCALE", "1"))
        self.dump_on_sigterm = dump_on_sigterm
        self.ends = None
        self.stderr = None

    def pytest_configure(self, config):
        config.addinivalue_line("markers", "deadline(seconds): end the process (stacks dumped) when this test "
                                           "runs longer (tests/python/deadline.py)")
        self.stderr = os.dup(2)  # the terminal's stderr: pytest captures fd 2 while tests run
        if self.dump_on_sigterm:
            faulthandler.register(signal.SIGTERM, file=self.stderr, all_threads=True, chain=True)

    def pytest_unconfigure(self, config):
        faulthandler.cancel_dump_traceback_later()
        if self.dump_on_sigterm:
            faulthandler.unregister(signal.SIGTERM)

    def seconds(self, item):
        mark = item.get_closest_marker("deadline")
        return (float(mark.args[0]) if mark is not None else self.default) * self.scale

    def _arm(self):
        left = max(1.0, self.ends - time.monotonic())
        faulthandler.dump_traceback_later(left, exit=True, file=self.stderr)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.ends = time.monotonic() + self.seconds(item)
        os.write(self.stderr, b"")  # (the descriptor is open: fail here, not in the watchdog)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        self._arm()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        self._arm()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        self._arm()
        yield
