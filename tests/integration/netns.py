"""Network namespaces for fault tests: a namespace joined to the root one by
a veth pair, with a /30 from 10.0.0.0/8 on the pair, and nftables rules
inside it to drop its packets. Everything here is created by the test and
removed by its fixture: traffic stays on this machine.

Sockets are put inside a namespace by creating them in `with ns.entered():`
(setns(2) on the calling thread only; a socket keeps the namespace it was
created in), so the harness's backends and clients work there unchanged.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import subprocess
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_counter = itertools.count(1)
COMMAND_TIMEOUT = 15.0


class NetnsError(Exception):
    pass


def run(*argv: str, input_text: str | None = None) -> None:
    res = subprocess.run(list(argv), input=input_text, capture_output=True, text=True,
                         timeout=COMMAND_TIMEOUT)
    if res.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: exit {res.returncode}: {res.stderr.strip()}")


def unavailable() -> str | None:
    """Why namespace tests cannot run here, or None when they can."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if shutil.which("nft") is None:
        return "nft is not installed (tools/setup.sh installs nftables)"
    probe = f"slprobe{os.getpid()}"
    try:
        run("ip", "netns", "add", probe)
    except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
        return f"cannot create a network namespace (needs root or CAP_SYS_ADMIN): {e}"
    try:
        run("ip", "netns", "exec", probe, "nft", "add", "table", "inet", "probe")
    except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
        return f"nftables does not work inside a namespace: {e}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=COMMAND_TIMEOUT)
    return None


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class Namespace:
    """One namespace; `inside` is its address, `outside` the root end's."""

    def __init__(self):
        n = next(_counter)
        pid = os.getpid()
        self.name = f"sluice-test-{pid}-{n}"
        self.host_if = f"sl{pid % 10**7}h{n}"[:15]
        self.ns_if = f"sl{pid % 10**7}n{n}"[:15]
        # 10.A.B.0/30 with A, B from the PID and the counter, so that
        # concurrent runs on one machine do not meet.
        a = 64 + pid % 128
        b = (pid // 128 * 7 + n) % 256
        self.outside = f"10.{a}.{b}.1"
        self.inside = f"10.{a}.{b}.2"
        self.created = False

    def create(self) -> "Namespace":
        run("ip", "netns", "add", self.name)
        self.created = True
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        run("ip", "link", "set", self.ns_if, "netns", self.name)
        run("ip", "addr", "add", f"{self.outside}/30", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        self.exec("ip", "addr", "add", f"{self.inside}/30", "dev", self.ns_if)
        self.exec("ip", "link", "set", self.ns_if, "up")
        self.exec("ip", "link", "set", "lo", "up")
        return self

    def exec(self, *argv: str, input_text: str | None = None) -> None:
        run("ip", "netns", "exec", self.name, *argv, input_text=input_text)

    def nft(self, ruleset: str) -> None:
        self.exec("nft", "-f", "-", input_text=ruleset)

    def drop_everything(self) -> None:
        """From now on every packet into or out of the namespace is lost,
        without an error to anyone: a host that vanished."""
        self.nft("table inet fault {\n"
                 "  chain in { type filter hook input priority 0; policy drop; }\n"
                 "  chain out { type filter hook output priority 0; policy drop; }\n"
                 "}\n")

    def drop_syns(self) -> None:
        """Connection attempts into the namespace are lost; nothing else."""
        self.nft("table inet fault {\n"
                 "  chain in { type filter hook input priority 0; policy accept;\n"
                 "    tcp flags & (syn | ack) == syn drop\n"
                 "  }\n"
                 "}\n")

    @contextmanager
    def entered(self):
        """The calling thread is in the namespace for the block."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/var/run/netns/{self.name}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield self
            finally:
                _setns(own)
        finally:
            os.close(target)
            os.close(own)

    def destroy(self) -> list[str]:
        """Removes the veth pair and the namespace; returns what failed."""
        problems = []
        if not self.created:
            return problems
        # Deleting one end removes both, even while a socket still holds
        # the namespace alive.
        res = subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, text=True,
                             timeout=COMMAND_TIMEOUT)
        if res.returncode != 0 and "Cannot find device" not in res.stderr:
            problems.append(f"ip link del {self.host_if}: {res.stderr.strip()}")
        res = subprocess.run(["ip", "netns", "del", self.name], capture_output=True, text=True,
                             timeout=COMMAND_TIMEOUT)
        if res.returncode != 0:
            problems.append(f"ip netns del {self.name}: {res.stderr.strip()}")
        self.created = False
        return problems
