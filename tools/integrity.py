#!/usr/bin/env python3
"""Move checksummed traffic through sluice while its backends are killed and
restarted, and check that no session ends in a way the client could take for
success unless every byte arrived intact.

sluice runs with two workers and `least_conn` in front of --backends
`loadgen serve --mode integrity` processes on loopback. `loadgen integrity`
opens --concurrency sessions at a time until --gigabytes of payload (both
directions together) have crossed sluice. Each session announces its sizes in
a header, uploads a pseudo-random stream derived from its seed, and receives
another one followed by a trailer in which the backend confirms the upload;
both ends check every byte, and a session counts as complete only with
exactly the announced bytes, the trailer and then EOF (see
tools/loadgen/integrity.hpp). Meanwhile --kills times, spread over the first
three quarters of the bytes, one backend gets SIGKILL and is restarted on the
same port --down-ms later (one backend is down at a time). A killed backend resets its connections (its
sockets have SO_LINGER 0 until the trailer is out), as a crashed server's
kernel does for sockets with unread data.

The figures printed at the end: sessions completed and failed (by what the
client saw: reset, EOF before the announced end, other), bytes verified,
kills, and two counts that must be 0: corrupt (a byte, a length or a trailer
was wrong on either side) and truncations (a session the client took as
complete that the backend did not confirm, or an upload a live backend saw
end early). Failed sessions are matched with sluice's access log by the
client's port, to show sluice's termination cause for each kind.

Exit status: 0 when both counts are 0, no session stalled or was still
running at --max-seconds, at least one completed, every kill happened and
sluice is still running at the end; 1 otherwise; 2 when the run could not be
set up. The last line is `result {json}` with every figure.

Everything listens on 127.0.0.1 on ports the kernel picks; only processes
started here are ever signalled, by PID.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from binaries import default_sluice, loadgen_next_to
START_TIMEOUT_S = 30.0   # a sanitizer build starts slowly
STOP_TIMEOUT_S = 10.0
LISTENING_RX = re.compile(r'listener "integrity" listening on \S+:(\d+)')


class SetupError(Exception):
    """The run could not be set up; the message says why."""


class Proc:
    """A child process whose stdout lines go to `on_line` from a thread."""

    def __init__(self, argv, on_line, log_path, merge_stderr=False):
        self.argv = argv
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT if merge_stderr else self._log)
        self._thread = threading.Thread(target=self._pump, args=(on_line,), daemon=True)
        self._thread.start()

    def _pump(self, on_line):
        for raw in iter(self.proc.stdout.readline, b""):
            on_line(raw.decode("utf-8", "replace").rstrip("\n"))

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        """SIGKILL and reap; the output read so far stays delivered."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._thread.join(STOP_TIMEOUT_S)
        self._log.close()

    def stop(self):
        """SIGTERM, then SIGKILL if it does not exit; returns the exit status."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._thread.join(STOP_TIMEOUT_S)
        self._log.close()
        return self.proc.returncode


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.01)
    raise SetupError(f"timed out after {timeout:.0f} s waiting for {what}")


# --------------------------------------------------------------------------
# Backends: what they report survives their kills

class BackendReports:
    """Lines from every backend incarnation, kept under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.done: set[int] = set()
        self.problems: list[str] = []   # corrupt, short, extra, bad_header lines

    def on_line(self, line):
        word, _, rest = line.partition(" ")
        with self.lock:
            if word == "done":
                self.done.add(int(rest))
            elif word in ("corrupt", "short", "extra", "bad_header"):
                self.problems.append(line)


class Backend:
    def __init__(self, loadgen, workdir, index, reports):
        self.loadgen = loadgen
        self.log = os.path.join(workdir, f"backend{index}.log")
        self.reports = reports
        self.port = 0
        self.proc: Proc | None = None
        self._listening = threading.Event()

    def start(self):
        """Starts on self.port (0 the first time); retried while the port is
        still held by the killed process's sockets."""
        for _ in range(100):
            self._listening.clear()
            got: list[int] = []

            def on_line(line, got=got):
                if line.startswith("listening ") and not self._listening.is_set():
                    got.append(int(line.split()[1]))
                    self._listening.set()
                else:
                    self.reports.on_line(line)

            self.proc = Proc([self.loadgen, "serve", "--mode", "integrity", "--port", str(self.port)],
                             on_line, self.log)
            deadline = time.monotonic() + START_TIMEOUT_S
            while not self._listening.wait(0.01) and self.proc.alive() and time.monotonic() < deadline:
                pass
            if got:
                self.port = got[0]
                return
            self.proc.stop()
            time.sleep(0.05)
        raise SetupError(f"backend could not listen on port {self.port}: see {self.log}")

    def kill(self):
        self.proc.kill()

    def stop(self):
        if self.proc:
            self.proc.stop()


# --------------------------------------------------------------------------
# sluice

def sluice_config(workdir, ports, workers, splice):
    servers = ", ".join(f'{{ address = "127.0.0.1:{p}" }}' for p in ports)
    return "\n".join([
        "[global]",
        f"workers = {workers}",
        f'access_log = "{workdir}/access.log"',
        'log_level = "info"',
        'shutdown_timeout = "2s"',
        "",
        "[[listener]]",
        'name = "integrity"',
        'listen = "127.0.0.1:0"',
        'upstream = "backends"',
        'connect_timeout = "1s"',
        "tries = 3",
        *([f'splice = "{splice}"'] if splice else []),
        "",
        "[upstream.backends]",
        'balance = "least_conn"',
        # Passive health off: a connect refused by the killed backend is
        # retried on another one at once, and no server is left out after it
        # is back, so a kill touches only the sessions it kills. (With
        # max_fails = 1 and kills closer together than fail_timeout, every
        # server ends up left out and sessions fail with no_server, which
        # says nothing about integrity; passive health has tests of its own.)
        "max_fails = 0",
        f"servers = [{servers}]",
        "",
    ])


def start_sluice(binary, workdir, ports, workers, splice):
    config = os.path.join(workdir, "sluice.toml")
    with open(config, "w") as f:
        f.write(sluice_config(workdir, ports, workers, splice))
    found: list[int] = []
    lines: collections.deque[str] = collections.deque(maxlen=50)

    out = open(os.path.join(workdir, "sluice.out"), "w")

    def on_line(line):
        lines.append(line)
        out.write(line + "\n")
        out.flush()
        m = LISTENING_RX.search(line)
        if m and not found:
            found.append(int(m.group(1)))

    log = os.path.join(workdir, "sluice.err")  # empty: its output is in sluice.out
    proc = Proc([binary, "-c", config], on_line, log, merge_stderr=True)
    try:
        wait_for(lambda: found or not proc.alive(), START_TIMEOUT_S, "sluice to listen")
    except SetupError:
        proc.stop()
        raise
    if not found:
        raise SetupError("sluice did not start: " + " | ".join(lines))
    return proc, found[0], lines


def access_records(path):
    """client port -> causes of the access records with that port."""
    by_port = collections.defaultdict(list)
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return by_port
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if "cause" in fields and "client" in fields:
            by_port[int(fields["client"].rpartition(":")[2])].append(fields["cause"])
    return by_port


# --------------------------------------------------------------------------
# The client

class Client:
    def __init__(self, loadgen, workdir, port, args):
        self.lock = threading.Lock()
        self.moved = 0
        self.ok: set[int] = set()
        self.failed: list[dict] = []
        self.summary: dict | None = None
        argv = [loadgen, "integrity", "--target", f"127.0.0.1:{port}",
                "--bytes", str(int(args.gigabytes * 1e9)), "--concurrency", str(args.concurrency),
                "--max-session", str(int(args.max_session_mb * 2**20)), "--seed", str(args.seed),
                "--stall", str(args.stall_seconds), "--timeout", str(args.max_seconds)]
        self._out = open(os.path.join(workdir, "client.out"), "w")
        self.proc = Proc(argv, self.on_line, os.path.join(workdir, "client.log"))

    def on_line(self, line):
        word, _, rest = line.partition(" ")
        with self.lock:
            if word != "progress":
                self._out.write(line + "\n")
            if word == "progress":
                self.moved = int(rest.split()[0])
            elif word == "ok":
                self.ok.add(int(rest))
            elif word == "failed":
                self.failed.append(json.loads(rest))
            elif line.startswith("{"):
                self.summary = json.loads(line)


# --------------------------------------------------------------------------

def gb(n):
    return f"{n / 1e9:.2f} GB"


def run(args, workdir):
    reports = BackendReports()
    backends = [Backend(args.loadgen, workdir, i, reports) for i in range(args.backends)]
    sluice = client = None
    rng = random.Random(args.seed)
    kills = 0
    try:
        for b in backends:
            b.start()
        sluice, sluice_port, _ = start_sluice(args.sluice, workdir, [b.port for b in backends],
                                              args.workers, args.splice)
        budget = args.gigabytes * 1e9
        # Kills spread over 5 % .. 75 % of the bytes: the last sessions run
        # undisturbed, so that failures come from kills and not from the end.
        thresholds = [budget * (0.05 + 0.70 * (i + 0.5) / args.kills) for i in range(args.kills)]
        print(f"integrity: {gb(budget)} through sluice (pid {sluice.proc.pid}, {args.workers} workers, "
              f"least_conn, splice {args.splice or 'off'}) to {args.backends} backends, {args.concurrency} sessions at a time, "
              f"{args.kills} kills, at most {args.max_seconds:g} s", flush=True)
        t0 = time.monotonic()
        client = Client(args.loadgen, workdir, sluice_port, args)
        last_report = t0
        down: dict[Backend, float] = {}  # killed backend -> when to restart it
        while client.proc.alive():
            now = time.monotonic()
            if now - t0 > args.max_seconds + 60:
                raise SetupError("loadgen integrity did not end after --max-seconds")
            for b, due in list(down.items()):
                if now >= due:
                    b.start()
                    del down[b]
            with client.lock:
                moved = client.moved
            # One backend down at a time: the next kill waits until the last
            # victim is back, so that sessions fail because their own server
            # died and not because none was left.
            if kills < len(thresholds) and moved >= thresholds[kills] and not down:
                victim = rng.choice(backends)
                victim.kill()
                down[victim] = time.monotonic() + args.down_ms / 1000.0
                kills += 1
            if time.monotonic() - last_report >= args.report_every:
                last_report = time.monotonic()
                with client.lock:
                    print(f"[{last_report - t0:6.1f}s] {gb(moved)} moved, {len(client.ok)} complete, "
                          f"{len(client.failed)} failed, {kills} kills", flush=True)
            time.sleep(0.002)
        client.proc.stop()
        elapsed = time.monotonic() - t0
        sluice_alive = sluice.alive()
        # Lets the last access records reach the file before it is read.
        time.sleep(0.3)
        causes = access_records(os.path.join(workdir, "access.log"))
    finally:
        if client:
            client.proc.stop()
        if sluice:
            sluice.stop()
        for b in backends:
            b.stop()
    if client.summary is None:
        raise SetupError("loadgen integrity printed no summary: "
                         + Path(workdir, "client.log").read_text(errors="replace")[-2000:])
    return report(args, client, reports, causes, kills, elapsed, sluice_alive)


def report(args, client, reports, causes, kills, elapsed, sluice_alive):
    s = client.summary
    kinds = collections.Counter(f["kind"] for f in client.failed)
    # sluice's cause for each failed session, by what the client saw.
    by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for f in client.failed:
        found = causes.get(f["port"], [])
        by_kind[f["kind"]][found[-1] if len(found) == 1 else ("unmatched" if not found else "ambiguous")] += 1
    unconfirmed = sorted(client.ok - reports.done)
    backend_corrupt = [p for p in reports.problems if not p.startswith("short")]
    backend_short = [p for p in reports.problems if p.startswith("short")]
    corrupt = s["corrupt"] + len(backend_corrupt)
    truncations = len(unconfirmed) + len(backend_short)
    result = {
        "gigabytes": args.gigabytes, "backends": args.backends, "concurrency": args.concurrency,
        "sessions": s["sessions"], "completed": s["completed"], "failed": s["failed"],
        "reset": s["reset"], "short_eof": s["short_eof"], "error": s["error"],
        "stalled": s["stalled"], "unfinished": s["unfinished"],
        "bytes_moved": s["moved"], "bytes_verified_completed": s["completed_bytes"],
        "bytes_up_confirmed": s["completed_up"], "bytes_down_verified": s["down_verified"],
        "kills": kills, "kills_planned": args.kills,
        "corrupt": corrupt, "truncations": truncations,
        "causes": {k: dict(v) for k, v in by_kind.items()},
        "short_eof_after_server_reset": by_kind["short_eof"].get("server_reset", 0),
        "seconds": round(elapsed, 1), "sluice_running": sluice_alive,
    }
    print(f"sessions: {s['sessions']} started, {s['completed']} completed, {s['failed']} failed "
          f"(reset {s['reset']}, EOF before the announced end {s['short_eof']}, other {s['error']}, "
          f"stalled {s['stalled']}, unfinished {s['unfinished']})")
    print(f"bytes: {gb(s['moved'])} moved in {elapsed:.1f} s ({s['moved'] / max(elapsed, 1e-9) / 1e6:.0f} MB/s); "
          f"verified in completed sessions {gb(s['completed_bytes'])} "
          f"(upload confirmed by the backends {gb(s['completed_up'])}), "
          f"download bytes checked in all sessions {gb(s['down_verified'])}")
    print(f"kills: {kills} of {args.kills} (SIGKILL, restarted on the same port after {args.down_ms} ms)")
    for kind in sorted(by_kind):
        text = ", ".join(f"{c} {n}" for c, n in by_kind[kind].most_common())
        print(f"  sluice's causes for '{kind}': {text}")
    if s["short_eof"]:
        print(f"  {s['short_eof']} session(s) got a clean EOF before the announced end: a reset passed on "
              f"as a FIN, which a client without lengths in its protocol would take for a complete answer")
    print(f"corrupt: {corrupt} (must be 0)" + (f": {s.get('first_error', '')} {backend_corrupt[:3]}"
                                                if corrupt else ""))
    print(f"truncations: {truncations} (must be 0)" +
          (f": unconfirmed sessions {unconfirmed[:5]}, short uploads {backend_short[:3]}"
           if truncations else ""))
    checks = {
        "corrupt is 0": corrupt == 0,
        "truncations is 0": truncations == 0,
        # The backends reset whatever a kill interrupts (SO_LINGER 0 until
        # their trailer), so every interrupted session must reach its client
        # as a reset too.
        "no clean EOF before the announced end": s["short_eof"] == 0,
        "nothing stalled or unfinished": s["stalled"] == 0 and s["unfinished"] == 0,
        "sessions completed": s["completed"] > 0,
        "every kill happened": kills == args.kills,
        "sluice still running": sluice_alive,
    }
    failed = [name for name, ok in checks.items() if not ok]
    print("integrity: " + ("PASS" if not failed else "FAIL (" + "; ".join(f"not: {n}" for n in failed) + ")"))
    print("result " + json.dumps(result, sort_keys=True), flush=True)
    return 0 if not failed else 1


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gigabytes", type=float, default=10.0,
                    help="payload to plan, both directions together (10^9 bytes)")
    ap.add_argument("--sluice", default=default_sluice(),
                    help="sluice binary (default: build-rel/sluice, else build/sluice)")
    ap.add_argument("--loadgen", help="loadgen binary (default: tools/loadgen next to --sluice)")
    ap.add_argument("--backends", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2, help="sluice worker threads")
    ap.add_argument("--splice", choices=["off", "pipe", "auto"],
                    help="the listener's splice mode (default: not set, which is off)")
    ap.add_argument("--concurrency", type=int, default=32, help="sessions open at a time")
    ap.add_argument("--max-session-mb", type=float, default=64.0,
                    help="largest session, both directions together (MiB); sizes are log-uniform from 4 KiB")
    ap.add_argument("--kills", type=int, help="backend kills (default: 1 per GB, at least 3)")
    ap.add_argument("--down-ms", type=int, default=200, help="how long a killed backend stays down")
    ap.add_argument("--max-seconds", type=float, default=1800.0,
                    help="the client stops after this long; sessions still open count as unfinished")
    ap.add_argument("--stall-seconds", type=float, default=60.0,
                    help="a session that moves nothing for this long counts as stalled")
    ap.add_argument("--seed", type=int, default=1, help="sizes, streams and the choice of victims")
    ap.add_argument("--report-every", type=float, default=10.0, help="seconds between progress lines")
    ap.add_argument("--workdir", help="keep the configuration, logs and access log here "
                    "(default: a temporary directory, removed at the end)")
    args = ap.parse_args()
    args.loadgen = args.loadgen or loadgen_next_to(args.sluice)
    if args.kills is None:
        args.kills = max(3, round(args.gigabytes))
    if args.gigabytes <= 0 or args.backends < 2 or args.concurrency < 1 or args.kills < 0:
        ap.error("--gigabytes and --concurrency must be positive, --backends at least 2")
    return args


def main():
    args = parse_args()
    for name, path in (("sluice", args.sluice), ("loadgen", args.loadgen)):
        if not os.access(path, os.X_OK):
            print(f"integrity: {name} not found at {path} (build it first)", file=sys.stderr)
            return 2
    workdir = args.workdir or tempfile.mkdtemp(prefix="sluice-integrity-")
    os.makedirs(workdir, exist_ok=True)
    try:
        return run(args, workdir)
    except (SetupError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"integrity: {exc}", file=sys.stderr)
        print("integrity: FAIL", flush=True)
        return 2
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
