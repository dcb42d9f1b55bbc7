"""[global] control_cpu: the control thread on one CPU, the workers on the
others (read from /proc, as the kernel applies it); a CPU the process may
not use is refused with a warning and pins nothing."""

from __future__ import annotations

import os
import re

import pytest

import harness
from harness import listener, upstream


def allowed(pid: int, tid: int) -> set[int]:
    text = open(f"/proc/{pid}/task/{tid}/status").read()
    spec = re.search(r"^Cpus_allowed_list:\s*(\S+)", text, re.M).group(1)
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def threads(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to separate the threads")
def test_the_control_thread_and_the_workers_on_separate_cpus(sluice, backends):
    mine = sorted(os.sched_getaffinity(0))
    control = mine[-1]
    others = set(mine) - {control}
    a = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(a)}, global_={"workers": 2, "control_cpu": control})
    s.log.wait_for(rf"\[info\] control_cpu: control thread on CPU {control}, workers on CPU\(s\) "
                   + ",".join(str(c) for c in sorted(others)))
    pid = s.proc.pid
    assert allowed(pid, pid) == {control}  # the main thread runs the control loop
    pinned_away = [t for t in threads(pid) if t != pid and allowed(pid, t) == others]
    assert len(pinned_away) >= 2, [(t, allowed(pid, t)) for t in threads(pid)]
    assert harness.banner_of(s) == b"A"  # and it serves


def test_a_cpu_the_process_may_not_use_pins_nothing(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(a)}, global_={"control_cpu": 1023})
    s.log.wait_for(r"\[warning\] control_cpu = 1023 is not among the CPUs this process may use \([0-9,]+\): "
                   r"no thread is pinned")
    pid = s.proc.pid
    assert allowed(pid, pid) == set(os.sched_getaffinity(0))
    assert harness.banner_of(s) == b"A"


def test_a_reload_that_changes_it_says_a_restart_is_needed(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(a)})
    text = s.config_path.read_text()
    assert text.startswith("[global]\n")
    m = s.reload(text.replace("[global]\n", "[global]\ncontrol_cpu = 0\n", 1))
    assert m.group(1) == "succeeded"
    s.log.wait_for(r"take effect only after a restart: global\.control_cpu")
