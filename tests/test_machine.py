"""What the machine is and how many threads a job takes on it (core.machine): the CPU's ISA, and the
thread governor against real busy processes (no fakes: spinning subprocesses)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from scope_marl.core.machine import ThreadGovernor, cpu_isa, cpu_slug, machine_line


def test_the_machine_is_named_for_every_figure():
    assert cpu_isa() != "" and " " not in cpu_slug()
    assert "isa:" in machine_line(gflops=1.0) and "1.0 GFLOP/s" in machine_line(gflops=1.0)


def test_a_fixed_thread_count_is_kept_whatever_the_machine_does():
    governor = ThreadGovernor(fixed=3)
    assert governor.choose() == 3 and governor.choose() == 3


def test_the_governor_leaves_the_cores_other_processes_keep_busy():
    governor = ThreadGovernor(window_s=0.5)
    usable = governor.usable
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable)]
    try:
        governor.choose()  # the first window
        time.sleep(0.5)
        threads = governor.choose()  # a second window, every core busy throughout
        busy = governor.others_busy
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert threads == 1  # never zero: the job still runs, on one core
    assert busy >= min(usable, os.cpu_count() or usable) - 0.6
