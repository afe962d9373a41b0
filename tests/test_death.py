"""The one wording of a process's end (fray.core._death.describe_exit), shared by every backend (issue 35)."""

from __future__ import annotations

import signal

from fray.core._death import LAST_LINE_CHARS, LAST_LINES, describe_exit, last_lines, out_of_memory
from fray.core._lifecycle import Failure, FailureKind


def test_exit_codes_and_signals_by_name():
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL (the kernel's OOM killer or another process)"
    assert describe_exit(-signal.SIGKILL, peak_rss=812 << 20).endswith("; peak RSS 812 MiB")
    assert describe_exit(137) == "exit code 137 (as a shell reports a command killed by SIGKILL)"
    assert describe_exit(200) == "exit code 200"


def test_out_of_memory_names_the_limit_the_use_and_the_peak():
    words = describe_exit(-signal.SIGKILL, oom_limit=200 << 20, used=251 << 20, peak_rss=251 << 20)
    assert words == "out of memory: used 251 MiB, its limit is ram=200m (200 MiB); peak RSS 251 MiB"
    assert describe_exit(-9, oom_limit=3 << 30, used=(3 << 30) + (400 << 20)).startswith(
        "out of memory: used 3472 MiB, its limit is ram=3g (3072 MiB)"
    )
    assert out_of_memory("Ray's memory monitor killed its worker") == (
        "out of memory: Ray's memory monitor killed its worker"
    )


def test_the_last_lines_are_twenty_each_cut_short():
    lines = [f"line {i}" for i in range(30)] + ["x" * (LAST_LINE_CHARS + 5)]
    kept = last_lines(lines)
    assert len(kept) == LAST_LINES == 20 and kept[0] == "line 11"
    assert kept[-1] == "x" * LAST_LINE_CHARS + " [fray: 5 more characters]"
    words = describe_exit(1, stderr_tail=["boom"])
    assert words == "exit code 1; last output:\nboom"


def test_a_failure_carries_its_last_lines_and_peak_through_its_encoding():
    failure = Failure.from_exit("train", -signal.SIGKILL, ["a", "b"], peak_rss=64 << 20)
    assert failure.message == (
        "'train' killed by SIGKILL (the kernel's OOM killer or another process); peak RSS 64 MiB; last output:\na\nb"
    )
    again = Failure.decode(failure.encode())
    assert again == failure and again.last_lines == ("a", "b") and again.peak_rss == 64 << 20
    error = again.error("train-1")
    assert error.last_output == ("a", "b") and error.exit_code == -signal.SIGKILL
    raised = Failure.from_exception(ValueError("no")).with_last_lines(["printed"])
    assert raised.message == "ValueError: no" and raised.kind == FailureKind.FAILURE
    assert raised.error("j").last_output == ("printed",)
