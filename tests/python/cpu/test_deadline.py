"""tests/python/deadline.py, the per-test bound of the GPU suite (one pytest per rank under torchrun):
a test past its deadline ends its process with every stack dumped, also when it blocks in C with the
GIL held and when a failed test's teardown hangs; tests within their bounds run as usual."""
import os
import pathlib
import subprocess
import sys
import textwrap
import time

HERE = pathlib.Path(__file__).resolve().parents[1]  # tests/python, where deadline.py lives

CONFTEST = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {str(HERE)!r})
    import deadline

    def pytest_configure(config):
        config.pluginmanager.register(deadline.Deadlines(default_seconds=30), "symmem-deadlines")
""")

TESTS = textwrap.dedent("""
    import ctypes
    import time

    import pytest


    @pytest.fixture
    def hangs_in_teardown():
        yield
        time.sleep(60)


    def test_quick():
        pass


    @pytest.mark.deadline(1)
    def test_a_passing_test_within_its_bound():
        time.sleep(0.1)


    @pytest.mark.deadline(2)
    def test_blocked_in_c_holding_the_gil():
        ctypes.PyDLL(None).sleep(60)  # libc sleep, called with the GIL held


    @pytest.mark.deadline(2)
    def test_failed_then_hangs_in_teardown(hangs_in_teardown):
        assert False, "fails at once"


    def test_hangs_under_the_default_bound():
        time.sleep(60)
""")


def _run(tmp_path, selection, env=None):
    # (pytest's -k also matches the names of the folders above a test, and tmp_path's is named
    # after the calling test: no calling test's name may hold its selection.)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_cases.py").write_text(TESTS)
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path), "-k", selection],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, **(env or {})))
    return out, time.monotonic() - start


def test_tests_within_their_bounds_pass(tmp_path):
    out, _ = _run(tmp_path, "quick or passing")
    assert out.returncode == 0 and "2 passed" in out.stdout, out.stdout + out.stderr


def test_a_test_blocked_in_c_is_ended_with_its_stack(tmp_path):
    out, seconds = _run(tmp_path, "blocked_in_c or quick")
    assert out.returncode == 1, out.stdout + out.stderr
    assert seconds < 30, seconds
    assert "Timeout" in out.stderr and "test_blocked_in_c_holding_the_gil" in out.stderr, out.stderr


def test_a_failure_then_a_hung_fixture_finalizer_is_ended(tmp_path):
    out, seconds = _run(tmp_path, "teardown")
    assert out.returncode == 1 and seconds < 30, (seconds, out.stdout + out.stderr)
    assert "hangs_in_teardown" in out.stderr, out.stderr


def test_the_environment_sets_the_bound_of_unmarked_tests(tmp_path):
    out, seconds = _run(tmp_path, "default_bound", env={"SYMMEM_TEST_DEADLINE_S": "2"})
    assert out.returncode == 1 and seconds < 30, (seconds, out.stdout + out.stderr)
    assert "test_hangs_under_the_default_bound" in out.stderr, out.stderr
