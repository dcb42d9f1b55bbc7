#!/usr/bin/env python3
"""Soak sluice with many short sessions and check that it gives back what it
takes: descriptors and memory.

sluice runs with two workers in front of a loopback echo backend. After a
warm-up (so that buffer pools, allocator arenas and libuv's own descriptors
are in place), `loadgen conn` drives --sessions short sessions (connect, send
a few bytes, read them back, close) with --concurrency of them at a time, for
at most --max-seconds. The script reads sluice's open descriptors
(/proc/PID/fd) and resident memory (VmRSS in /proc/PID/status) at the start,
every second during the load, and at the end once the sessions have drained.

Exit status: 0 when every check passes; 1 when sluice's descriptor count is
not back to its start value, its RSS grew more than --rss-growth percent, more
than --max-error-ratio of the sessions failed, or sluice exited; 2 when the
soak could not be set up (missing binary, sluice did not start).

Everything listens on 127.0.0.1 on ports the kernel picks; only processes
started here are ever signalled, by PID.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from binaries import default_sluice, loadgen_next_to  # noqa: E402
# The benchmark already knows how to start and stop loadgen backends.
from bench import Backends, BenchError, Processes, read_lines, rss_bytes, tail  # noqa: E402

LISTENING_RX = re.compile(r'listener "soak" listening on \S+:(\d+)')
START_TIMEOUT_S = 30.0   # generous: a sanitizer build starts slowly
SAMPLE_EVERY_S = 1.0     # how often the load is interrupted to read /proc
SETTLE_S = 1.0           # descriptors unchanged this long: sessions have drained
MIN_CHUNK_S = 0.2        # shortest loadgen run worth starting
FIRST_RUN_S = 1.0        # the first run of a phase, before its rate is known


class SoakError(Exception):
    """The soak could not be set up; the message says why."""


class SluiceExited(SoakError):
    """sluice ended during the soak: a failure of sluice, not of the set-up."""


# --------------------------------------------------------------------------
# Readings of the sluice process

@dataclass
class Reading:
    fds: int
    rss_kib: int


def read_process(pid):
    return Reading(fds=len(os.listdir(f"/proc/{pid}/fd")), rss_kib=rss_bytes([pid]) // 1024)


@dataclass
class Peak:
    """The highest descriptor count and RSS seen while the load ran."""
    fds: int = 0
    rss_kib: int = 0

    def add(self, r):
        self.fds = max(self.fds, r.fds)
        self.rss_kib = max(self.rss_kib, r.rss_kib)


# --------------------------------------------------------------------------
# sluice

def sluice_config(workdir, backend_ports, workers):
    servers = ", ".join(f'{{ address = "127.0.0.1:{p}" }}' for p in backend_ports)
    return "\n".join([
        "[global]",
        f"workers = {workers}",
        'access_log = "off"',
        # "info" so that the listening line (with the port the kernel chose) is written.
        'log_level = "info"',
        f'error_log = "{workdir}/sluice.log"',
        'shutdown_timeout = "2s"',
        "",
        "[[listener]]",
        'name = "soak"',
        'listen = "127.0.0.1:0"',
        'upstream = "echo"',
        'connect_timeout = "5s"',
        'idle_timeout = "60s"',
        "",
        "[upstream.echo]",
        'balance = "least_conn"',
        f"servers = [{servers}]",
        "",
    ])


class Sluice:
    def __init__(self, procs, binary, workdir, backend_ports, workers):
        self.procs = procs
        self.log = os.path.join(workdir, "sluice.log")
        config = os.path.join(workdir, "sluice.toml")
        with open(config, "w") as f:
            f.write(sluice_config(workdir, backend_ports, workers))
        self.proc = procs.start([binary, "-c", config], log_path=os.path.join(workdir, "sluice.out"))
        self.port = self._wait_listening(workdir)

    def _wait_listening(self, workdir):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.alive():
                break
            m = LISTENING_RX.search(tail(self.log, 50))
            if m:
                return int(m.group(1))
            time.sleep(0.05)
        why = tail(self.log) or tail(os.path.join(workdir, "sluice.out")) or "not listening"
        raise SoakError(f"sluice did not start: {why}")

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def reading(self):
        if not self.alive():
            raise SluiceExited(f"sluice exited (status {self.proc.returncode}): {tail(self.log)}")
        return read_process(self.pid)

    def settled_reading(self, want_fds=None, timeout=10.0):
        """Waits until the open sessions have closed, then reads.

        With `want_fds`, done as soon as the count is back to it; otherwise
        (or when it never gets there) once it has not changed for SETTLE_S.
        """
        deadline = time.monotonic() + timeout
        last = self.reading()
        stable_since = time.monotonic()
        while time.monotonic() < deadline:
            if last.fds == want_fds or time.monotonic() - stable_since >= SETTLE_S:
                break
            time.sleep(0.05)
            now = self.reading()
            if now.fds != last.fds:
                stable_since = time.monotonic()
            last = now
        time.sleep(0.2)  # lets the allocator's last frees land before RSS is read
        return self.reading()


# --------------------------------------------------------------------------
# The load: `loadgen conn` in runs of a few seconds, sampling sluice meanwhile

@dataclass
class Tally:
    sessions: int = 0
    errors: int = 0
    first_error: str = ""
    peak: Peak = field(default_factory=Peak)

    def add_run(self, result):
        self.sessions += result["ops"]
        self.errors += result["errors"]
        if result.get("first_error") and not self.first_error:
            self.first_error = result["first_error"]


class Load:
    def __init__(self, procs, loadgen, sluice, workdir, concurrency, payload):
        self.procs = procs
        self.loadgen = loadgen
        self.sluice = sluice
        self.log = os.path.join(workdir, "loadgen.log")
        self.args = ["conn", "--target", f"127.0.0.1:{sluice.port}",
                     "--concurrency", str(concurrency), "--payload", str(payload)]

    def run(self, seconds, tally):
        """One loadgen run of `seconds`; adds its sessions to `tally` and the
        readings taken meanwhile to `tally.peak`. Returns loadgen's report."""
        proc = self.procs.start([self.loadgen, *self.args, "--duration", f"{seconds:.3f}"],
                                log_path=self.log, stdout=subprocess.PIPE)
        try:
            give_up = time.monotonic() + seconds + 60
            while proc.poll() is None:
                if time.monotonic() > give_up:
                    raise SoakError("loadgen did not finish its run")
                tally.peak.add(self.sluice.reading())
                try:
                    proc.wait(timeout=SAMPLE_EVERY_S)
                except subprocess.TimeoutExpired:
                    pass
            lines = read_lines(proc, 1, 5.0, stop=lambda l: l.startswith("{"))
        finally:
            self.procs.stop(proc)
        if not lines or not lines[-1].startswith("{"):
            raise SoakError(f"loadgen reported nothing (exit {proc.returncode}): {tail(self.log)}")
        result = json.loads(lines[-1])
        tally.add_run(result)
        return result

    def until(self, sessions, deadline, tally, run_seconds, after_run=None):
        """Runs loadgen until `tally` holds `sessions` sessions or `deadline`
        passes, calling `after_run(tally, elapsed)` after each run.

        Runs last at most `run_seconds`. The first one is short, to learn the
        rate; each later one is sized from the rate of the one before, which
        follows a rate that changes (a sanitized build warms up slowly) better
        than the average, so that the last run ends near `sessions`.
        """
        started = time.monotonic()
        rate = 0.0
        while tally.sessions < sessions:
            left = deadline - time.monotonic()
            if left < MIN_CHUNK_S:
                break
            wanted = max(MIN_CHUNK_S, (sessions - tally.sessions) / rate) if rate > 0 else FIRST_RUN_S
            rate = self.run(min(run_seconds, left, wanted), tally)["rate"]
            if after_run:
                after_run(tally, time.monotonic() - started)


def print_progress(sluice):
    """An after_run callback: one line per loadgen run during the soak."""
    def show(tally, elapsed):
        r = sluice.reading()
        print(f"[{elapsed:7.1f}s] {tally.sessions:>9} sessions, {tally.sessions / elapsed:7.0f}/s, "
              f"errors {tally.errors}, fd {r.fds}, RSS {r.rss_kib} KiB", flush=True)
    return show


# --------------------------------------------------------------------------
# Checks and report

@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def line(self):
        return f"{self.name} check: {'PASS' if self.ok else 'FAIL'} ({self.detail})"


def checks(start, end, tally, args):
    growth = 100.0 * (end.rss_kib - start.rss_kib) / start.rss_kib
    ratio = tally.errors / max(tally.sessions + tally.errors, 1)
    return [
        Check("fd", end.fds == start.fds, f"start {start.fds}, end {end.fds}"),
        Check("RSS", growth <= args.rss_growth,
              f"start {start.rss_kib} KiB, end {end.rss_kib} KiB, {growth:+.1f} %, "
              f"limit +{args.rss_growth:g} %"),
        Check("errors", ratio <= args.max_error_ratio,
              f"{tally.errors} failed beside {tally.sessions} done, "
              f"limit {100 * args.max_error_ratio:g} %"),
    ]


def print_report(tally, seconds, start, end, results):
    print(f"sessions done: {tally.sessions} in {seconds:.1f} s")
    print(f"errors: {tally.errors}" + (f" (first: {tally.first_error})" if tally.first_error else ""))
    print(f"sessions/s: {tally.sessions / seconds:.0f}")
    print("sluice              fd   RSS KiB")
    for label, r in (("start", start), ("during (peak)", tally.peak), ("end", end)):
        print(f"  {label:<15} {r.fds:>5} {r.rss_kib:>9}")
    for c in results:
        print(c.line())
    print("soak: " + ("PASS" if all(c.ok for c in results) else "FAIL"), flush=True)


# --------------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sluice", default=default_sluice(),
                    help="sluice binary (default: build-rel/sluice, else build/sluice)")
    ap.add_argument("--loadgen", help="loadgen binary (default: tools/loadgen next to --sluice)")
    ap.add_argument("--sessions", type=int, default=1_000_000, help="sessions after the warm-up")
    ap.add_argument("--max-seconds", type=float, default=1800,
                    help="the warm-up and the load stop after this long, sessions done or not")
    ap.add_argument("--warmup", type=int, default=5000, help="sessions before the start reading")
    ap.add_argument("--concurrency", type=int, default=32, help="sessions open at a time")
    ap.add_argument("--payload", type=int, default=16, help="bytes sent and echoed per session")
    ap.add_argument("--workers", type=int, default=2, help="sluice worker threads")
    ap.add_argument("--report-every", type=float, default=10.0, help="seconds between progress lines")
    ap.add_argument("--rss-growth", type=float, default=5.0, help="largest RSS growth allowed, percent")
    ap.add_argument("--max-error-ratio", type=float, default=0.001,
                    help="largest share of failed sessions allowed")
    args = ap.parse_args()
    args.loadgen = args.loadgen or loadgen_next_to(args.sluice)
    if args.sessions < 1 or args.warmup < 1 or args.max_seconds <= 0 or args.concurrency < 1:
        ap.error("--sessions, --warmup, --concurrency and --max-seconds must be positive")
    return args


def soak(args, procs, workdir):
    ports = Backends(procs, args.loadgen, workdir, want_tls=False).echo
    sluice = Sluice(procs, args.sluice, workdir, ports, args.workers)
    load = Load(procs, args.loadgen, sluice, workdir, args.concurrency, args.payload)
    deadline = time.monotonic() + args.max_seconds
    print(f"soak: sluice pid {sluice.pid} ({args.workers} workers) on port {sluice.port}, "
          f"{args.sessions} sessions of {args.payload} B, {args.concurrency} at a time, "
          f"at most {args.max_seconds:g} s", flush=True)

    load.until(args.warmup, deadline, Tally(), args.report_every)
    start = sluice.settled_reading()
    print(f"start (after {args.warmup} warm-up sessions): fd {start.fds}, RSS {start.rss_kib} KiB",
          flush=True)

    tally = Tally()
    t0 = time.monotonic()
    load.until(args.sessions, deadline, tally, args.report_every, print_progress(sluice))
    seconds = time.monotonic() - t0
    end = sluice.settled_reading(want_fds=start.fds)
    results = checks(start, end, tally, args)
    print_report(tally, max(seconds, 1e-9), start, end, results)
    return 0 if all(c.ok for c in results) else 1


def bound_asan_quarantine():
    """AddressSanitizer keeps freed blocks out of use in a quarantine of up
    to 256 MB, so the RSS of a sanitized build grows for minutes by design.
    A small quarantine fills during the warm-up and still catches a use of a
    block freed shortly before. Options set by the caller win."""
    options = os.environ.get("ASAN_OPTIONS", "")
    if "quarantine_size_mb" not in options:
        os.environ["ASAN_OPTIONS"] = ":".join(filter(None, [options, "quarantine_size_mb=4"]))


def main():
    args = parse_args()
    bound_asan_quarantine()
    for name, path in (("sluice", args.sluice), ("loadgen", args.loadgen)):
        if not os.access(path, os.X_OK):
            print(f"soak: {name} not found at {path} (build it first)", file=sys.stderr)
            return 2
    procs = Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-soak-")
    try:
        return soak(args, procs, workdir)
    except (SoakError, BenchError, OSError) as exc:
        print(f"soak: {exc}", file=sys.stderr)
        print("soak: FAIL", flush=True)
        return 1 if isinstance(exc, SluiceExited) else 2
    finally:
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
