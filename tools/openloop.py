"""Open-loop latency and changes under load, for tools/bench.py.

--latency: each proxy's highest rate is measured first in a closed loop
(keep-alive requests and short connections); the slowest proxy's sets the
scale. Then every system -- sluice, HAProxy, nginx and the backend reached
directly -- gets the same fixed offered rates, 25, 50, 75 and 90 % of that,
from `loadgen open`, which times each request from when it was due (no
coordinated omission). p50, p99 and p99.9 per system and rate, and the
listen-queue overflows (SYNs dropped) during each system's segments.

--capacity: for each system, the highest offered rate whose p99 stays under
1 ms and under 10 ms, short connections and keep-alive: one grid of rates
for every system, climbing until each has missed 10 ms twice.

--storm: a steady half load (keep-alive requests at 25 % of the slowest
proxy's highest rate and short connections at 25 % of its highest
connection rate, together), measured steady and while the configuration
changes every second: reloads with an unchanged file and with one server
added and one removed each time (sluice: SIGHUP; HAProxy: master-worker
reload; nginx: reload of its master), and for sluice also PUT /config, a DNS
answer that changes every second, and an admin scraper reading /metrics ten
times a second. Errors, cut keep-alive sessions, p99, p99.9 and the proxy's
memory before and after.

With two or more CPUs the load generator runs on CPU 1, with this script
(which reloads, PUTs and scrapes, as a deploy tool or a scraper elsewhere
would), and every proxy, with the backends, on CPU 0 (the generator's core then never limits
the rate: an open loop costs more per request than a closed one; the
backends' share is the same for every system), all at the same raised priority (nice -10 when
allowed), so that the rest of a shared machine disturbs them less. With
--realtime they all run under SCHED_RR instead (priority 1; the kernel
still leaves 5 % of each second to everything else): on a machine busy with
other work a woken proxy then runs at once, and the figures measure the
proxies rather than the scheduler's queue. Every system gets the same.

With --repeat N every rate (--latency) runs N rounds, each system once per
round back to back, and every change (--storm) runs N pairs of a steady and
a changing segment; the figures are medians, and the tables show the range
of the per-round ratios: on a shared machine one segment can land on a
stall that has nothing to do with the system it measured.

On a virtual machine most of those stalls are the host running something
else: the guest sees them as steal time (/proc/stat). Every segment
records the steal of the whole machine while it ran; a round (--latency:
every system's segment; --storm: the steady and the changing segment of a
pair) with more than STEAL_LIMIT in any of its segments is left out of the
medians and ranges, and the tables say how many rounds were kept. A round
is kept or left out whole, so every system loses the same rounds. When no
round is clean, all are used and the table says so.
"""

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

FRACTIONS = (0.25, 0.5, 0.75, 0.9)
KINDS = ("rr", "conn")  # keep-alive requests, short connections
KIND_NAMES = {"rr": "keep-alive requests", "conn": "short connections"}
SYSTEMS = ("sluice", "sluice-base", "haproxy", "nginx", "direct")
PEERS = ("haproxy", "nginx")
RR_CONNECTIONS = 32   # the same as the closed loop's concurrency
CONN_MAX_INFLIGHT = 1000
SIZE = 64
NICE = -10
REALTIME = {"on": False}  # --realtime: SCHED_RR priority 1 instead of nice
# Steal (CPU time the host gave to others while this machine wanted it), in
# seconds per second of a segment, both CPUs summed, above which a round is
# left out. A quiet host steals 0-3 ms/s here under the benchmark's load
# (/proc/stat counts in 10 ms ticks), a busy one 5-500; 10 ms of stall in a
# second is already the p99 of a segment.
STEAL_LIMIT = 0.005


class StealMeter:
    """Steal per second of wall time between start and stop()."""

    def __init__(self, b):
        self.steal = b.steal_seconds
        self.t0, self.s0 = time.monotonic(), self.steal()

    def stop(self):
        return (self.steal() - self.s0) / max(time.monotonic() - self.t0, 1e-3)


def clean_rounds(rounds):
    """Indices of the rounds whose every segment had steal within the limit;
    `rounds` is a list of lists of segments."""
    return [k for k, segs in enumerate(rounds)
            if all(seg.get("steal", 0.0) <= STEAL_LIMIT for seg in segs)]


def kept_rounds(clean, n):
    """The rounds the figures use: the clean ones, or all n when none is."""
    return clean or list(range(n))


def kept_text(clean, n):
    return f"{len(clean)} of {n}" if clean else f"0 of {n}: all used"


STORM_SERVERS = 4     # backend listeners; a configuration holds 3 of them
DNS_NAME = "storm.bench.test"

PROFILES = {
    "full": {"max_s": 5, "step_s": 10, "storm_s": 30},
    "quick": {"max_s": 2, "step_s": 3, "storm_s": 8},
}


# --------------------------------------------------------------------------
# Placement: proxies on CPU 0, generator and backends on CPU 1.

def placement():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return cpus[0], cpus[1]


def place(pid, cpu):
    """Pins every thread of `pid` (and so what it starts later) to `cpu` and
    raises its priority; silently does what it may."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return
    for tid in tids:
        try:
            if cpu is not None:
                os.sched_setaffinity(tid, {cpu})
            if REALTIME["on"]:
                os.sched_setscheduler(tid, os.SCHED_RR, os.sched_param(1))
            else:
                os.setpriority(os.PRIO_PROCESS, tid, NICE)
        except OSError:
            pass


# Variants that pin their own threads ([global] control_cpu): started on
# the proxy's and the generator's CPUs, and never re-pinned whole (that
# would undo their own placement); the proxy's CPU comes first.
SELF_PLACED = {"sluice-control-cpu"}


def proxy_cpus(ctx, system):
    """The CPU (or CPU list) `system` starts on."""
    if system in SELF_PLACED and ctx.proxy_cpu is not None and ctx.gen_cpu is not None:
        return f"{ctx.proxy_cpu},{ctx.gen_cpu}"
    return ctx.proxy_cpu


def place_proxy(ctx, system, pid):
    """place() for a proxy: priority only for one that places itself."""
    place(pid, None if system in SELF_PLACED else ctx.proxy_cpu)


def prefix(cpu):
    """argv prefix that starts a command on `cpu` at the raised priority."""
    out = []
    if cpu is not None:
        out += ["taskset", "-c", str(cpu)]
    if REALTIME["on"]:
        out += ["chrt", "--rr", "1"]
    elif os.geteuid() == 0:
        out += ["nice", "-n", str(NICE)]
    return out


def process_tree(pid):
    """pid and its descendants (a master's workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


# --------------------------------------------------------------------------
# The generator

def _prefixed(b, ctx, args, timeout):
    res = subprocess.run(ctx.gen_prefix + [ctx.loadgen, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, timeout=timeout)
    lines = [l for l in res.stdout.decode().splitlines() if l.startswith("{")]
    if not lines:
        raise b.BenchError(f"loadgen {args[0]} failed (exit {res.returncode}): "
                           + res.stderr.decode().strip()[-300:])
    return json.loads(lines[-1])


def open_args(kind, port, rate, seconds):
    args = ["open", "--mode", kind, "--target", f"127.0.0.1:{port}", "--rate", f"{rate:.1f}",
            "--duration", str(seconds), "--size", str(SIZE), "--warmup", "0.5"]
    args += ["--connections", str(RR_CONNECTIONS)] if kind == "rr" else \
        ["--max-inflight", str(CONN_MAX_INFLIGHT)]
    return args


def start_open(ctx, kind, port, rate, seconds):
    """An open-loop generator running in the background; finish() reads its line."""
    return subprocess.Popen(ctx.gen_prefix + [ctx.loadgen, *open_args(kind, port, rate, seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish_open(b, proc, timeout):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    lines = [l for l in out.decode().splitlines() if l.startswith("{")]
    if not lines:
        raise b.BenchError(f"loadgen open failed (exit {proc.returncode}): "
                           + err.decode().strip()[-300:])
    return json.loads(lines[-1])


# --------------------------------------------------------------------------
# --latency

def start_proxies(b, ctx, ports):
    """sluice, HAProxy and nginx in front of `ports`, placed on the proxy CPU."""
    proxies = {}
    for system in ctx.systems:
        if system == "direct":
            continue
        proxy = b.Proxy(ctx.procs, system, ctx.binaries[system], ctx.workdir, "latency",
                        plain=ports)
        place_proxy(ctx, system, proxy.proc.pid)
        proxies[system] = proxy
    return proxies


def timed_segment(b, ctx, kind, port, rate, seconds):
    """One open-loop segment at `rate`, with the host's steal and the
    machine's listen-queue drops over it. Systems run one at a time, so the
    drops are the one under test's (its backends' are the same for all)."""
    meter = StealMeter(b)
    queue0 = b.listen_queue_counters()
    proc = start_open(ctx, kind, port, rate, seconds)
    r = finish_open(b, proc, seconds + 60)
    queue1 = b.listen_queue_counters()
    r["steal"] = meter.stop()
    r["overflows"] = queue1["overflows"] - queue0["overflows"]
    r["listen_drops"] = queue1["drops"] - queue0["drops"]
    return r


def run_latency(b, ctx):
    prof = ctx.oprofile
    ports = ctx.backends.echo
    proxies = start_proxies(b, ctx, ports)
    targets = {s: (proxies[s].port if s != "direct" else ports[0]) for s in ctx.systems}
    result = {"max": {}, "steps": {}, "scale": {}}
    try:
        for kind in KINDS:
            result["max"][kind] = {}
            for system in ctx.systems:
                r = _prefixed(b, ctx, [kind, "--target", f"127.0.0.1:{targets[system]}",
                                       "--duration", str(prof["max_s"]), "--concurrency", "32",
                                       "--size" if kind == "rr" else "--payload", str(SIZE)],
                              prof["max_s"] + 60)
                result["max"][kind][system] = r["rate"]
                ctx.log(f"{system:8} {kind:4} closed-loop max {r['rate']:.0f}/s, "
                        f"errors {r['errors']}")
            proxies_only = [s for s in ctx.systems if s != "direct"] or list(ctx.systems)
            slowest = min(result["max"][kind][s] for s in proxies_only)
            result["scale"][kind] = slowest
            result["steps"][kind] = []
            for i, frac in enumerate(FRACTIONS):
                rate = slowest * frac
                runs = {system: [] for system in ctx.systems}
                # Each round runs every system once, back to back. Rotate the
                # order so that no system always runs first; the offset
                # differs between runs and rounds, so that repeated runs do
                # not put a system in the same place at the same rate.
                for rnd in range(ctx.repeat):
                    n = (i + rnd + ctx.order_offset) % len(ctx.systems)
                    order = list(ctx.systems[n:]) + list(ctx.systems[:n])
                    for system in order:
                        r = timed_segment(b, ctx, kind, targets[system], rate, prof["step_s"])
                        runs[system].append(r)
                        ctx.log(f"{system:8} {kind:4} {frac:4.0%} {rate:8.0f}/s round {rnd + 1}: "
                                f"p50 {r['p50_us']:.0f} p99 {r['p99_us']:.0f} p99.9 "
                                f"{r['p999_us']:.0f} µs, errors {r['errors']}, "
                                f"unfinished {r['unfinished']}, SYNs dropped {r['overflows']}, "
                                f"steal {r['steal'] * 1e3:.0f} ms/s")
                        if system != "direct" and not proxies[system].alive():
                            raise b.BenchError(f"{system} exited: " + b.tail(proxies[system].log))
                clean = clean_rounds([[runs[s][k] for s in ctx.systems]
                                      for k in range(ctx.repeat)])
                result["steps"][kind].append({
                    "fraction": frac, "rate": rate, "runs": runs, "clean": clean,
                    "systems": {s: median_run(rs, kept_rounds(clean, ctx.repeat))
                                for s, rs in runs.items()}})
    finally:
        for proxy in proxies.values():
            proxy.stop()
    return result


PERCENTILES = ("p50_us", "p90_us", "p99_us", "p999_us", "max_us")


def median_run(runs, keep=None):
    """One figure set from a system's rounds at one rate: the median of each
    percentile over the rounds kept (all by default); errors and unfinished
    requests summed over every round, kept or not."""
    kept = [runs[k] for k in keep] if keep else runs
    out = {k: statistics.median(r[k] for r in kept) for k in PERCENTILES if k in kept[0]}
    out["errors"] = sum(r["errors"] for r in runs)
    out["unfinished"] = sum(r["unfinished"] for r in runs)
    out["overflows"] = sum(r.get("overflows", 0) for r in runs)
    out["rounds"] = len(runs)
    out["kept"] = len(kept)
    return out


def round_ratios(step, key):
    """sluice ÷ the best peer in each round of a step, lowest and highest."""
    runs = step.get("runs", {})
    if "sluice" not in runs or not any(p in runs for p in PEERS):
        return None
    ratios = []
    for k in kept_rounds(step.get("clean"), len(runs["sluice"])):
        mine = runs["sluice"][k]
        peers = [runs[p][k][key] for p in PEERS if p in runs and runs[p][k][key] > 0]
        if peers:
            ratios.append(mine[key] / min(peers))
    return (min(ratios), max(ratios)) if ratios else None


def print_latency(result, systems):
    print("\n## Latency at fixed offered rates (open loop, coordinated omission corrected)\n")
    rounds = max((st["systems"][s].get("rounds", 1) for steps in result["steps"].values()
                  for st in steps for s in st["systems"]), default=1)
    print("Each rate is a fraction of the highest rate the slowest proxy sustained in a closed "
          "loop of 32 (measured first in the same run). µs; ratio = sluice ÷ the best peer "
          "(below 1: sluice is faster).")
    if rounds > 1:
        print(f"Each rate ran {rounds} rounds, every system once per round, back to back; the "
              "figures are the medians of the rounds, the ratios are of those medians, and the "
              "range in brackets is the lowest and highest ratio within one round. A round in "
              f"which the host stole more than {STEAL_LIMIT * 1e3:.0f} ms a second from this "
              "machine during any system's segment is left out of the medians and ranges "
              "(\"rounds kept\"); errors count in every round.")
    print()
    for kind in KINDS:
        if kind not in result["steps"]:
            continue
        maxes = ", ".join(f"{s} {result['max'][kind][s]:.0f}/s" for s in systems)
        print(f"### {KIND_NAMES[kind]} ({SIZE} B echo)\n")
        print(f"Closed-loop highest rate: {maxes}. SYNs dropped: the machine's ListenOverflows "
              "during each system's segments (a full accept queue), summed over every round.\n")
        head = ["load", "rate/s"] + (["rounds kept"] if rounds > 1 else [])
        for s in systems:
            head += [f"{s} p50", f"{s} p99", f"{s} p99.9"]
        head += ["p99 ratio", "p99.9 ratio", "errors", "SYNs dropped"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for step in result["steps"][kind]:
            row = [f"{step['fraction']:.0%}", f"{step['rate']:.0f}"]
            if rounds > 1:
                row.append(kept_text(step["clean"], rounds) if "clean" in step else "–")
            sy = step["systems"]
            for s in systems:
                r = sy.get(s)
                row += [f"{r['p50_us']:.0f}", f"{r['p99_us']:.0f}", f"{r['p999_us']:.0f}"] if r \
                    else ["–"] * 3
            for key in ("p99_us", "p999_us"):
                spread = round_ratios(step, key) if rounds > 1 else None
                row.append(ratio_to_best(sy, key)
                           + (f" ({spread[0]:.2f}–{spread[1]:.2f})" if spread else ""))
            row.append(", ".join(f"{s} {sy[s]['errors'] + sy[s]['unfinished']}" for s in systems
                                 if s in sy and sy[s]["errors"] + sy[s]["unfinished"]) or "0")
            row.append(dropped_text(sy, systems))
            print("| " + " | ".join(row) + " |")
        print()


def dropped_text(sy, systems):
    """Listen-queue overflows (SYNs or handshakes dropped) per system, summed
    over every round."""
    return ", ".join(f"{s} {sy[s].get('overflows', 0)}" for s in systems if s in sy)


def ratio_to_best(sy, key):
    peers = [sy[p][key] for p in PEERS if p in sy and sy[p][key] > 0]
    if "sluice" not in sy or not peers:
        return "–"
    return f"{sy['sluice'][key] / min(peers):.2f}"


COLORS = {"sluice-backlog511": "tab:cyan", "sluice": "tab:blue", "sluice-base": "tab:purple", "haproxy": "tab:orange", "nginx": "tab:green", "direct": "tab:gray"}


def draw_latency(result, path, title):
    """One panel per load: p99 (solid) and p99.9 (dashed) against the offered
    rate, per system, on a log scale."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib not installed (Debian python3-matplotlib); no chart", file=sys.stderr)
        return
    kinds = [k for k in KINDS if result["steps"].get(k)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        steps = result["steps"][kind]
        xs = [100 * s["fraction"] for s in steps]
        for system in SYSTEMS:
            if not all(system in s["systems"] for s in steps):
                continue
            color = COLORS[system]
            ax.plot(xs, [s["systems"][system]["p99_us"] / 1000 for s in steps], "-o", color=color,
                    label=f"{system} p99", markersize=4)
            ax.plot(xs, [s["systems"][system]["p999_us"] / 1000 for s in steps], "--", color=color,
                    label=f"{system} p99.9", alpha=0.7)
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:.0f} %\n{s['rate']:.0f}/s" for x, s in zip(xs, steps)], fontsize=7)
        ax.set_xlabel("offered load (of the slowest proxy's highest rate)", fontsize=8)
        ax.set_ylabel("latency, ms (log)", fontsize=8)
        ax.set_title(KIND_NAMES[kind] + f", {SIZE} B", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=6, ncol=2)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    print(f"bench: chart written to {path}", file=sys.stderr)


# --------------------------------------------------------------------------
# --capacity

CAPACITY_BOUNDS_US = (1000, 10000)   # p99 under 1 ms, under 10 ms
CAPACITY_GRID = tuple(round(0.2 + 0.05 * i, 2) for i in range(21))  # 20 % .. 120 %
CAPACITY_PAST = 2   # grid rates tried after a system's last pass of the loosest bound


def run_capacity(b, ctx):
    """For each kind, every system's closed-loop highest rate, then one grid
    of offered rates (fractions of the fastest system's), every system at each
    rate back to back (--repeat rounds; medians), climbing until every system
    has missed the loosest bound CAPACITY_PAST times in a row. A system's
    capacity under a bound is the highest grid rate below which its p99 never
    went over that bound: what a fleet can be sized by, since a rate that
    passes only above a failing one is luck."""
    prof = ctx.oprofile
    ports = ctx.backends.echo
    systems = [s for s in ctx.systems if s != "direct"]
    proxies = start_proxies(b, ctx, ports)
    result = {"max": {}, "grid": {}, "capacity": {}}
    try:
        for kind in KINDS:
            result["max"][kind] = {}
            for system in systems:
                r = _prefixed(b, ctx, [kind, "--target", f"127.0.0.1:{proxies[system].port}",
                                       "--duration", str(prof["max_s"]), "--concurrency", "32",
                                       "--size" if kind == "rr" else "--payload", str(SIZE)],
                              prof["max_s"] + 60)
                result["max"][kind][system] = r["rate"]
                ctx.log(f"{system:8} {kind:4} closed-loop max {r['rate']:.0f}/s")
            top = max(result["max"][kind].values())
            passing = {s: {bound: True for bound in CAPACITY_BOUNDS_US} for s in systems}
            capacity = {s: {bound: 0.0 for bound in CAPACITY_BOUNDS_US} for s in systems}
            misses = {s: 0 for s in systems}
            grid = []
            for i, frac in enumerate(CAPACITY_GRID):
                active = [s for s in systems if misses[s] < CAPACITY_PAST]
                if not active:
                    break
                rate = top * frac
                runs = {s: [] for s in active}
                for rnd in range(ctx.repeat):
                    n = (i + rnd + ctx.order_offset) % len(active)
                    for system in active[n:] + active[:n]:
                        r = timed_segment(b, ctx, kind, proxies[system].port, rate, prof["step_s"])
                        runs[system].append(r)
                        if not proxies[system].alive():
                            raise b.BenchError(f"{system} exited: " + b.tail(proxies[system].log))
                clean = clean_rounds([[runs[s][k] for s in active] for k in range(ctx.repeat)])
                point = {"fraction": frac, "rate": rate, "systems": {}}
                for system in active:
                    m = median_run(runs[system], kept_rounds(clean, ctx.repeat))
                    point["systems"][system] = m
                    p99 = m["p99_us"] if not (m["errors"] or m["unfinished"]) else float("inf")
                    for bound in CAPACITY_BOUNDS_US:
                        if passing[system][bound] and p99 < bound:
                            capacity[system][bound] = rate
                        else:
                            passing[system][bound] = False
                    misses[system] = 0 if p99 < CAPACITY_BOUNDS_US[-1] else misses[system] + 1
                    ctx.log(f"{system:8} {kind:4} {frac:4.0%} {rate:8.0f}/s: p99 {m['p99_us']:.0f} µs, "
                            f"errors {m['errors'] + m['unfinished']}, SYNs dropped {m['overflows']}")
                grid.append(point)
            result["grid"][kind] = grid
            result["capacity"][kind] = capacity
    finally:
        for proxy in proxies.values():
            proxy.stop()
    return result


# --------------------------------------------------------------------------
# --phases

PHASE_FRACTIONS = (0.5, 0.75, 0.9)
# The access record's phase fields ([global] log_phases), in the order a
# session reaches them; turn_us is the loop turn's work before the accept.
PHASE_FIELDS = ("turn_us", "pick_us", "connect_us", "connected_us", "first_in_us", "first_out_us",
                "close_us")
PHASE_COLUMNS = PHASE_FIELDS + ("turn_events",)  # every number a record's phases give
SLOWEST = 0.001


def phase_records(path, offset):
    """The complete access records written after `offset`: dicts of the
    phase fields (int), and the new offset."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    records = []
    for line in data[:end].decode(errors="replace").splitlines():
        fields = dict(kv.split("=", 1) for kv in line.split(" ")[1:] if "=" in kv)
        if all(k in fields for k in PHASE_FIELDS):
            records.append({k: int(fields[k]) for k in PHASE_COLUMNS})
    return records, offset + end


def phase_summary(records):
    """Median of each field over all sessions that got an answer, and over
    the slowest 0.1 % of them by the time to the server's first byte."""
    answered = [r for r in records if r["first_out_us"] >= 0]
    answered.sort(key=lambda r: r["first_out_us"])
    n_slow = max(1, int(len(answered) * SLOWEST))
    slow = answered[-n_slow:]
    keys = PHASE_COLUMNS

    def med(rs, k):
        vals = [r[k] for r in rs if r[k] >= 0]
        return statistics.median(vals) if vals else -1

    return {"sessions": len(records), "answered": len(answered), "slowest": n_slow,
            "median": {k: med(answered, k) for k in keys},
            "slow": {k: med(slow, k) for k in keys},
            "slow_max": {k: max((r[k] for r in slow), default=-1) for k in keys}}


def run_phases(b, ctx):
    """sluice alone, with log_phases and its access log in a file, short
    connections at PHASE_FRACTIONS of its own closed-loop highest rate (with
    the log on); per rate, each phase's median over all sessions against its
    median over the slowest 0.1 %."""
    prof = ctx.oprofile
    log_path = os.path.join(ctx.workdir, "phases.access.log")
    proxy = b.Proxy(ctx.procs, "sluice", ctx.binaries["sluice"], ctx.workdir, "phases",
                    plain=ctx.backends.echo,
                    sluice_settings=["log_phases = true", f'access_log = "{log_path}"'])
    place_proxy(ctx, "sluice", proxy.proc.pid)
    result = {"steps": []}
    try:
        r = _prefixed(b, ctx, ["conn", "--target", f"127.0.0.1:{proxy.port}", "--duration",
                               str(prof["max_s"]), "--concurrency", "32", "--payload", str(SIZE)],
                      prof["max_s"] + 60)
        result["max"] = r["rate"]
        ctx.log(f"sluice (log_phases) conn closed-loop max {r['rate']:.0f}/s")
        time.sleep(0.5)
        _, offset = phase_records(log_path, 0)
        for frac in PHASE_FRACTIONS:
            rate = result["max"] * frac
            for rnd in range(ctx.repeat):
                seg = timed_segment(b, ctx, "conn", proxy.port, rate, prof["step_s"])
                time.sleep(0.5)  # the last sessions' records reach the file
                records, offset = phase_records(log_path, offset)
                summary = phase_summary(records)
                step = {"fraction": frac, "rate": rate, "round": rnd + 1, "client": seg,
                        "phases": summary}
                result["steps"].append(step)
                ctx.log(f"sluice conn {frac:4.0%} {rate:8.0f}/s round {rnd + 1}: client p50 "
                        f"{seg['p50_us']:.0f} p99 {seg['p99_us']:.0f} p99.9 {seg['p999_us']:.0f} µs, "
                        f"{summary['answered']} sessions answered, SYNs dropped {seg['overflows']}, "
                        f"steal {seg['steal'] * 1e3:.0f} ms/s")
                if not proxy.alive():
                    raise b.BenchError("sluice exited: " + b.tail(proxy.log))
    finally:
        proxy.stop()
    return result


def print_phases(result):
    print(f"\n## Where the slowest sessions' time goes (short connections, sluice with log_phases; "
          f"closed-loop highest rate {result['max']:.0f}/s)\n")
    print("Microseconds after accept4() returned the connection (turn_us: how long the loop turn had "
          "run before it). Median over all answered sessions / median over the slowest 0.1 % by "
          "first_out_us (worst of them).\n")
    cols = PHASE_COLUMNS
    print("| load | round | client p99 / p99.9 µs | sessions (slowest) | "
          + " | ".join(c.replace("_us", "") for c in cols) + " |")
    print("|---|---|---|---|" + "---|" * len(cols))
    for st in result["steps"]:
        p, c = st["phases"], st["client"]
        cells = [f"{p['median'][k]:.0f} / {p['slow'][k]:.0f} ({p['slow_max'][k]:.0f})" for k in cols]
        print(f"| {st['fraction']:.0%} ({st['rate']:.0f}/s) | {st['round']} | {c['p99_us']:.0f} / "
              f"{c['p999_us']:.0f} | {p['answered']} ({p['slowest']}) | " + " | ".join(cells) + " |")


def print_capacity(result, systems):
    systems = [s for s in systems if s != "direct"]
    print("\n## Capacity: the highest offered rate within a p99 bound\n")
    print("Open loop, the same grid of offered rates for every system (5 % steps of the fastest "
          "system's closed-loop highest rate), each system once per rate and round, back to back. "
          "A system's capacity under a bound is the highest rate below which its p99 never went "
          "over the bound (a rate with errors counts as over). Ratio = sluice ÷ the best peer "
          "(1 or more: sluice serves at least as much). SYNs dropped: ListenOverflows at the "
          "system's capacity within 10 ms and at the next rate up.\n")
    for kind in KINDS:
        if kind not in result["capacity"]:
            continue
        cap = result["capacity"][kind]
        print(f"### {KIND_NAMES[kind]} ({SIZE} B echo)\n")
        head = ["system", "closed-loop max/s"] + [f"p99 < {bound // 1000} ms, /s"
                                                   for bound in CAPACITY_BOUNDS_US] + ["SYNs dropped"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for s in systems:
            if s not in cap:
                continue
            row = [s, f"{result['max'][kind][s]:.0f}"]
            lowest = result["grid"][kind][0]["rate"] if result["grid"][kind] else 0
            row += [f"{cap[s][bound]:.0f}" if cap[s][bound] > 0 else f"< {lowest:.0f}"
                    for bound in CAPACITY_BOUNDS_US]
            row.append(capacity_drops(result["grid"][kind], s, cap[s][CAPACITY_BOUNDS_US[-1]]))
            print("| " + " | ".join(row) + " |")
        peers = [p for p in PEERS if p in cap]
        if "sluice" in cap and peers:
            ratios = []
            for bound in CAPACITY_BOUNDS_US:
                best = max(cap[p][bound] for p in peers)
                ratios.append(f"p99 < {bound // 1000} ms: "
                              + (f"{cap['sluice'][bound] / best:.2f}" if best > 0 else "–"))
            print("\nsluice ÷ the best peer: " + ", ".join(ratios))
        print()


def capacity_drops(grid, system, rate):
    """ListenOverflows of `system` at `rate` and at the grid rate above it."""
    out = []
    for k, point in enumerate(grid):
        if system in point["systems"] and abs(point["rate"] - rate) < 1e-6:
            out.append(f"{point['systems'][system]['overflows']}")
            if k + 1 < len(grid) and system in grid[k + 1]["systems"]:
                out.append(f"{grid[k + 1]['systems'][system]['overflows']} above")
    return ", ".join(out) or "–"


# --------------------------------------------------------------------------
# --storm

class StormProxy:
    """A proxy that can be told to reload: sluice (SIGHUP, admin API),
    HAProxy in master-worker mode (SIGUSR2 to the master re-executes it with
    -sf for the old worker, passing the listening sockets on) and nginx with
    its master process (SIGHUP: new workers, the old finish their sessions)."""

    def __init__(self, b, ctx, system, tag, servers, dns=None):
        self.b, self.ctx, self.system = b, ctx, system
        self.port = b.free_port()
        self.admin = b.free_port() if b.is_sluice(system) else None
        self.dir = os.path.join(ctx.workdir, f"storm-{system}-{tag}")
        os.makedirs(self.dir, exist_ok=True)
        self.log = os.path.join(self.dir, "log")
        self.dns = dns
        binary = ctx.binaries[system]
        if b.is_sluice(system):
            self.path = os.path.join(self.dir, "sluice.toml")
            argv = [binary, "-c", self.path]
        elif system == "haproxy":
            self.path = os.path.join(self.dir, "haproxy.cfg")
            argv = [binary, "-W", "-db", "-f", self.path]
        else:
            self.path = os.path.join(self.dir, "nginx.conf")
            argv = [binary, "-p", self.dir, "-e", os.path.join(self.dir, "nginx-error.log"),
                    "-c", self.path]
        self.write(servers)
        self.proc = ctx.procs.start(prefix(proxy_cpus(ctx, system)) + argv, log_path=self.log)
        if not b.wait_listening(self.port, self.proc, timeout=10):
            why = b.tail(self.log) or "not listening"
            self.stop()
            raise b.BenchError(f"{system} did not start: {why}")

    def text(self, servers):
        b = self.b
        if b.is_sluice(self.system):
            tail = ["", "[admin]", f'listen = "127.0.0.1:{self.admin}"']
            if self.dns:
                tail += ["", "[resolver]", f'nameservers = ["{self.dns}"]', 'valid = "1s"',
                         'timeout = "1s"']
            return b.sluice_config(self.port, plain=servers, settings=b.VARIANT_SYSTEMS.get(self.system, ()),
                                   tail=tail)
        if self.system == "haproxy":
            return b.haproxy_config(self.port, plain=servers)
        text = b.nginx_config(self.port, self.dir, plain=servers)
        return text.replace("master_process off;", "master_process on;")

    def write(self, servers):
        tmp = self.path + ".new"
        with open(tmp, "w") as f:
            f.write(self.text(servers))
        os.replace(tmp, self.path)

    def reload(self, servers):
        """Writes the configuration and reloads the way each system is meant to be."""
        self.write(servers)
        sig = signal.SIGUSR2 if self.system == "haproxy" else signal.SIGHUP
        self.proc.send_signal(sig)

    def put_config(self, servers):
        body = self.text(servers).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin}/config", data=body,
                                     method="PUT")
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()

    def scrape(self):
        """GET /metrics on a plain socket, the body read and dropped. urllib
        spent about 4x the CPU of this per scrape (~270 vs ~60 µs here), on
        the generator's CPU, where it delayed the generator itself."""
        with socket.create_connection(("127.0.0.1", self.admin), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            head = b""
            while len(head) < 12:
                chunk = s.recv(65536)
                if not chunk:
                    break
                head += chunk
            if not head.startswith(b"HTTP/1.1 200"):
                raise OSError("GET /metrics: " + head[:40].decode(errors="replace"))
            while s.recv(65536):
                pass

    def pids(self):
        return process_tree(self.proc.pid)

    def rss(self):
        total = 0
        for pid in self.pids():
            try:
                total += self.b.rss_bytes([pid])
            except OSError:
                pass
        return total

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.ctx.procs.stop(self.proc, grace=10)


def storm_scenarios(b, systems):
    out = []
    for system in systems:
        if system == "direct":
            continue
        out += [(system, "reload"), (system, "reload_servers")]
        if b.is_sluice(system):
            out += [(system, "put_config"), (system, "dns"), (system, "metrics")]
    return out


SCENARIO_NAMES = {
    "reload": "reload every second, unchanged file",
    "reload_servers": "reload every second, one server added and one removed",
    "put_config": "PUT /config every second, one server added and one removed",
    "dns": "DNS answer changes every second (one address added, one removed)",
    "metrics": "GET /metrics ten times a second",
}


def window(ports, k):
    """The k-th configuration's servers: 3 of the 4, rotating, so that each
    step removes one server and adds another."""
    n = len(ports)
    return [ports[(k + i) % n] for i in range(n - 1)]


def run_storm(b, ctx, scale):
    prof = ctx.oprofile
    seconds = prof["storm_s"]
    ports = ctx.storm_ports
    results = {}
    dns = None
    hosts = None
    if any(b.is_sluice(s) for s in ctx.systems) and b.dnsmasq_binary():
        ddir = os.path.join(ctx.workdir, "storm-dns")
        os.makedirs(ddir, exist_ok=True)
        dns = b.Dnsmasq(ctx.procs, b.dnsmasq_binary(), ddir,
                        [f"127.0.0.{i + 1}:{ctx.wild_port}" for i in range(STORM_SERVERS - 1)])
        place(dns.proc.pid, ctx.proxy_cpu)
        hosts = os.path.join(ddir, "dns-hosts")
    for system, scenario in storm_scenarios(b, ctx.systems):
        if scenario == "dns" and dns is None:
            results[(system, scenario)] = "dnsmasq (Debian dnsmasq-base) is not installed"
            continue
        try:
            results[(system, scenario)] = storm_one(b, ctx, system, scenario, scale, seconds, ports,
                                                    dns, hosts)
            r = results[(system, scenario)]
            for name in ("steady", "during"):
                x = r[name]
                ctx.log(f"{system:8} {scenario:15} {name:6} rr p99 {x['rr']['p99_us']:.0f} p99.9 "
                        f"{x['rr']['p999_us']:.0f}, conn p99 {x['conn']['p99_us']:.0f} p99.9 "
                        f"{x['conn']['p999_us']:.0f} µs, errors {x['errors']}, cuts {x['cuts']}, "
                        f"changes {x['changes']}")
            ctx.log(f"{system:8} {scenario:15} RSS {r['rss_before'] / 1e6:.1f} -> "
                    f"{r['rss_peak'] / 1e6:.1f} -> {r['rss_after'] / 1e6:.1f} MB, "
                    f"{r['processes']} process(es) at the end")
        except (b.BenchError, OSError, subprocess.TimeoutExpired, ValueError) as exc:
            results[(system, scenario)] = str(exc).replace("\n", " ")
            ctx.log(f"{system:8} {scenario:15} FAILED: {results[(system, scenario)]}")
    if dns is not None:
        ctx.procs.stop(dns.proc)
    return results


def storm_one(b, ctx, system, scenario, scale, seconds, ports, dns, hosts):
    """One proxy: a steady segment, then the same load while the change
    repeats. Each change is compared with the steady segment just before it
    on the same proxy, so that what the rest of a shared machine does moves
    both alike."""
    if scenario == "dns":
        servers = [(f"{DNS_NAME}:{ctx.wild_port}", "resolve")]
        write_hosts(hosts, 0)
        dns.proc.send_signal(signal.SIGHUP)
    else:
        servers = window(ports, 0)
    proxy = StormProxy(b, ctx, system, scenario, servers,
                       dns=dns.nameserver if scenario == "dns" else None)

    def change(k):
        if scenario == "reload":
            proxy.reload(window(ports, 0))
        elif scenario == "reload_servers":
            proxy.reload(window(ports, k))
        elif scenario == "put_config":
            proxy.put_config(window(ports, k))
        elif scenario == "dns":
            write_hosts(hosts, k)
            dns.proc.send_signal(signal.SIGHUP)
        elif scenario == "metrics":
            proxy.scrape()
        if system == "haproxy":
            place(proxy.proc.pid, ctx.proxy_cpu)  # the re-executed master and its new worker

    try:
        time.sleep(1.0)  # sluice asks DNS before it listens; let everything settle
        rss_before = proxy.rss()
        # Steady and changing segments alternate on the same proxy, one pair
        # per round, so that a stall of the machine lands on either kind.
        steadies, durings = [], []
        for rnd in range(ctx.repeat):
            steady = segment(b, ctx, proxy, scale, seconds, None, 1.0)
            during = segment(b, ctx, proxy, scale, seconds, change,
                             0.1 if scenario == "metrics" else 1.0)
            steadies.append(steady)
            durings.append(during)
            if ctx.repeat > 1:
                ctx.log(f"{system:8} {scenario:15} round {rnd + 1}: p99 rr {steady['rr']['p99_us']:.0f}"
                        f" -> {during['rr']['p99_us']:.0f}, conn {steady['conn']['p99_us']:.0f} -> "
                        f"{during['conn']['p99_us']:.0f} µs, steal {steady['steal'] * 1e3:.0f} -> "
                        f"{during['steal'] * 1e3:.0f} ms/s")
        clean = clean_rounds(list(zip(steadies, durings)))
        keep = kept_rounds(clean, len(steadies))
        steady, during = median_segment(steadies, keep), median_segment(durings, keep)
        # The generators closed their keep-alive connections: old configurations
        # held only by them can go now.
        time.sleep(2.0)
        if not proxy.alive():
            raise b.BenchError(f"{system} exited during the storm: " + b.tail(proxy.log))
        rss_after = proxy.rss()
        pids = len(proxy.pids())
    finally:
        proxy.stop()
    ratios = {kind: [durings[k][kind]["p99_us"] / steadies[k][kind]["p99_us"] for k in keep
                     if steadies[k][kind]["p99_us"] > 0] for kind in KINDS}
    return {"steady": steady, "during": during, "rss_before": rss_before,
            "rss_peak": max(steady["rss_peak"], during["rss_peak"]), "rss_after": rss_after,
            "processes": pids, "changes": during["changes"], "rounds": ctx.repeat, "clean": clean,
            "pair_ratios": ratios, "runs": {"steady": steadies, "during": durings}}


def median_segment(segments, keep=None):
    """The rounds of one kind of segment as one: medians of the percentiles
    over the rounds kept (all by default), counts summed over all of them,
    the highest memory."""
    if len(segments) == 1:
        return segments[0]
    out = {kind: median_run([s[kind] for s in segments], keep) for kind in KINDS}
    for key in ("errors", "cuts", "changes", "change_failures"):
        out[key] = sum(s[key] for s in segments)
    for key in ("first_error", "first_change_failure"):
        out[key] = next((s[key] for s in segments if s[key]), "")
    out["rss_peak"] = max(s["rss_peak"] for s in segments)
    return out


def segment(b, ctx, proxy, scale, seconds, change, period):
    """The half load for `seconds`; `change(k)` every `period` s when given."""
    warm = 0.5
    meter = StealMeter(b)
    gens = {kind: start_open(ctx, kind, proxy.port, scale[kind] * 0.25, seconds + warm)
            for kind in KINDS}
    time.sleep(warm)
    changes, failures = 0, []
    peak = proxy.rss()
    t0 = time.monotonic()
    k = 0
    next_rss = t0 + 1.0
    while time.monotonic() - t0 < seconds - 0.05:
        k += 1
        time.sleep(max(0.0, t0 + k * period - time.monotonic()))
        if change is not None:
            try:
                change(k)
                changes += 1
            except OSError as exc:
                failures.append(str(exc))
        # Once a second whatever the period: the harness does the same work
        # on the generator's CPU in a steady segment and in a changing one.
        if time.monotonic() >= next_rss:
            next_rss += 1.0
            peak = max(peak, proxy.rss())
    runs = {kind: finish_open(b, proc, seconds + 90) for kind, proc in gens.items()}
    errors = sum(r["errors"] + r["unfinished"] for r in runs.values())
    first = next((r.get("first_error") for r in runs.values() if r.get("first_error")), "")
    return {"rr": runs["rr"], "conn": runs["conn"], "errors": errors, "first_error": first,
            "cuts": runs["rr"]["cuts"], "changes": changes, "change_failures": len(failures),
            "first_change_failure": failures[0] if failures else "", "rss_peak": peak,
            "steal": meter.stop()}


def write_hosts(path, k):
    """The k-th DNS answer: 3 of 127.0.0.1..4, rotating like window()."""
    addrs = window([f"127.0.0.{i + 1}" for i in range(STORM_SERVERS)], k)
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.writelines(f"{a} {DNS_NAME}\n" for a in addrs)
    os.replace(tmp, path)


def print_storm(results, scale):
    print("\n## Changes under load\n")
    print(f"A half load: keep-alive requests at {scale['rr'] * 0.25:.0f}/s on "
          f"{RR_CONNECTIONS} connections and short connections at {scale['conn'] * 0.25:.0f}/s "
          "together (each 25 % of the slowest proxy's highest rate), open loop. On each proxy a "
          "steady segment, then the same while the change repeats once a second (the scraper ten "
          "times a second); ÷ = during ÷ the steady segment just before. µs.")
    rounds = max((r.get("rounds", 1) for r in results.values() if isinstance(r, dict)), default=1)
    if rounds > 1:
        print(f"Each proxy ran {rounds} rounds of a steady segment and a changing one, "
              "alternating; the figures are the medians of the rounds (errors, cut sessions "
              "and changes summed), ÷ is of the medians, and the range in brackets is the "
              "lowest and highest ÷ of one round's pair. A pair in which the host stole more "
              f"than {STEAL_LIMIT * 1e3:.0f} ms a second from this machine is left out of the "
              "medians and ranges (\"pairs kept\"); errors, cut sessions and changes count in "
              "every pair.")
    print()
    head = ["system", "change", "changes"] + (["pairs kept"] if rounds > 1 else []) + [
            "keep-alive p99 steady → during", "÷",
            "p99.9 steady → during", "short p99 steady → during", "÷", "p99.9 steady → during",
            "errors", "cut sessions", "RSS MB before → peak → after", "processes after"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for (system, scenario), r in results.items():
        if isinstance(r, str):
            print(f"| {system} | {SCENARIO_NAMES[scenario]} | FAILED: {r} |" + " |" * (len(head) - 3))
            continue
        st, du = r["steady"], r["during"]

        def pair(kind, key):
            return f"{st[kind][key]:.0f} → {du[kind][key]:.0f}"

        def rel(kind):
            if st[kind]["p99_us"] <= 0:
                return "–"
            text = f"{du[kind]['p99_us'] / st[kind]['p99_us']:.2f}"
            pairs = r.get("pair_ratios", {}).get(kind, [])
            if len(pairs) > 1:
                text += f" ({min(pairs):.2f}–{max(pairs):.2f})"
            return text
        changes = str(du["changes"]) + (f" ({du['change_failures']} refused)" if du["change_failures"] else "")
        row = [system, SCENARIO_NAMES[scenario], changes] + (
            [kept_text(r["clean"], r["rounds"]) if "clean" in r else "–"] if rounds > 1 else []) + [
               pair("rr", "p99_us"), rel("rr"), pair("rr", "p999_us"),
               pair("conn", "p99_us"), rel("conn"), pair("conn", "p999_us"),
               f"{st['errors']} / {du['errors']}", f"{st['cuts']} / {du['cuts']}",
               f"{r['rss_before'] / 1e6:.1f} → {r['rss_peak'] / 1e6:.1f} → {r['rss_after'] / 1e6:.1f}",
               str(r["processes"])]
        print("| " + " | ".join(row) + " |")
    for (system, scenario), r in results.items():
        if not isinstance(r, dict):
            continue
        for name in ("steady", "during"):
            if r[name]["first_error"]:
                print(f"\n{system} {scenario} ({name}): first error: {r[name]['first_error']}")
            if r[name]["first_change_failure"]:
                print(f"\n{system} {scenario}: first refused change: {r[name]['first_change_failure']}")
    print()


# --------------------------------------------------------------------------

def main(b, args, binaries):
    """Runs --latency, --capacity and/or --storm; returns the exit code."""
    ctx = b.Context()
    ctx.oprofile = PROFILES["quick" if args.profile == "quick" else "full"]
    if args.step_seconds:
        ctx.oprofile["step_s"] = args.step_seconds
    if args.storm_seconds:
        ctx.oprofile["storm_s"] = args.storm_seconds
    REALTIME["on"] = bool(args.realtime)
    ctx.proxy_cpu, ctx.gen_cpu = placement()
    ctx.gen_prefix = prefix(ctx.gen_cpu)
    if ctx.gen_cpu is not None:
        # This process is the clients' side too: it reloads, PUTs and
        # scrapes. Left unpinned, the scheduler may run it on the proxies'
        # CPU, and its CPU would be counted as the change's cost to the proxy.
        os.sched_setaffinity(0, {ctx.gen_cpu})
    # sluice's listener variants (bench.VARIANT_SYSTEMS) run as systems of
    # their own, beside sluice: a setting's before and after in one run.
    ctx.systems = [s for s in args.systems if s in SYSTEMS or s in b.VARIANT_SYSTEMS]
    if "direct" not in ctx.systems and args.latency:
        ctx.systems.append("direct")
    ctx.binaries = binaries
    ctx.loadgen = args.loadgen
    ctx.order_offset = int(time.time()) % len(ctx.systems)
    ctx.repeat = args.repeat
    started = time.monotonic()
    ctx.log = lambda msg: print(f"[{time.monotonic() - started:6.1f}s] {msg}", file=sys.stderr,
                                flush=True)
    ctx.procs = b.Processes()
    ctx.workdir = tempfile.mkdtemp(prefix="sluice-bench-")
    load_before = b.loadavg()
    out = {"systems": ctx.systems, "profile": ctx.oprofile}
    try:
        ctx.backends = b.Backends(ctx.procs, args.loadgen, ctx.workdir, False)
        for proc in ctx.procs.procs:
            place(proc.pid, ctx.proxy_cpu)
        if args.latency:
            out["latency"] = run_latency(b, ctx)
            out["scale"] = out["latency"]["scale"]
        if args.capacity:
            out["capacity"] = run_capacity(b, ctx)
        if args.phases:
            out["phases"] = run_phases(b, ctx)
        if args.storm:
            if "scale" not in out:
                out["scale"] = measure_scale(b, ctx)
            ctx.storm_ports = ctx.backends._serve(
                ["--mode", "echo", "--listeners", str(STORM_SERVERS)], "storm")
            ctx.wild_port = ctx.backends._serve(["--mode", "echo", "--host", "0.0.0.0"], "storm-dns")[0]
            for proc in ctx.procs.procs:
                place(proc.pid, ctx.proxy_cpu)
            out["storm"] = run_storm(b, ctx, out["scale"])
    except b.BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        ctx.procs.stop_all()
        import shutil
        shutil.rmtree(ctx.workdir, ignore_errors=True)
    print(f"# sluice latency benchmark ({args.profile} profile; {os.cpu_count()} CPUs; "
          f"load average {load_before} before, {b.loadavg()} after; proxies and backends on CPU "
          f"{ctx.proxy_cpu}, generator on CPU {ctx.gen_cpu}"
          + (", all SCHED_RR" if REALTIME["on"] else "") + ")")
    title = (f"sluice, HAProxy, nginx and direct: open-loop latency, {args.profile} profile, "
             f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    if "latency" in out:
        print_latency(out["latency"], ctx.systems)
        if args.chart:
            draw_latency(out["latency"], args.chart, title)
    if "capacity" in out:
        print_capacity(out["capacity"], ctx.systems)
    if "phases" in out:
        print_phases(out["phases"])
    if "storm" in out:
        print_storm(out["storm"], out["scale"])
        out["storm"] = {f"{s}/{c}": r for (s, c), r in out["storm"].items()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**out, "title": title}, f, indent=1)
    return 0


def measure_scale(b, ctx):
    """The slowest proxy's closed-loop highest rate per kind (for --storm alone)."""
    ports = ctx.backends.echo
    proxies = start_proxies(b, ctx, ports)
    scale = {}
    try:
        for kind in KINDS:
            rates = []
            for system, proxy in proxies.items():
                r = _prefixed(b, ctx, [kind, "--target", f"127.0.0.1:{proxy.port}", "--duration",
                                       str(ctx.oprofile["max_s"]), "--concurrency", "32",
                                       "--size" if kind == "rr" else "--payload", str(SIZE)],
                              ctx.oprofile["max_s"] + 60)
                ctx.log(f"{system:8} {kind:4} closed-loop max {r['rate']:.0f}/s")
                rates.append(r["rate"])
            scale[kind] = min(rates)
    finally:
        for proxy in proxies.values():
            proxy.stop()
    return scale


def redraw(path, chart):
    with open(path) as f:
        saved = json.load(f)
    draw_latency(saved["latency"], chart, saved.get("title", "open-loop latency"))
