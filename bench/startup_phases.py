#!/usr/bin/env python3
"""Where the start-up time of `capgate run -- /bin/true` goes, from `strace -f -ttt` traces.

Usage: startup_phases.py [--untraced MS] TRACE...
       startup_phases.py --perf-script FILE RUNS HZ   (each TRACE one run, made by bench/startup-phases.sh with
`strace -f -ttt --seccomp-bpf -e trace=execve,clone,clone3,openat,pivot_root,sendmsg,
exit_group`). Prints, per phase, the median over the traces in ms. The phases are cut
at syscalls that mark where capgate's code moves on (see MARKS); the strace overhead (one
ptrace stop per traced call, ~200 per run) inflates every phase a little.
"""

import re
import statistics
import sys

LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(.*)$")


def parse(path):
    events = []  # (pid, t, name, text)
    for raw in open(path, errors="replace"):
        m = LINE.match(raw.rstrip("\n"))
        if not m:
            continue
        pid, t, rest = int(m.group(1)), float(m.group(2)), m.group(3)
        if rest.startswith("+++ exited") or rest.startswith("+++ killed"):
            events.append((pid, t, "+++", rest))
            continue
        n = re.match(r"^(\w+)\(", rest)
        if n:  # an entry (complete or unfinished); resumed halves are skipped
            events.append((pid, t, n.group(1), rest))
    return events


def marks(events):
    """The time of each mark of one run, or None where it is missing."""
    main = events[0][0]
    helper = next((p for p, _, n, s in events if n == "execve" and '"__sandbox"' in s), None)
    init = next((p for p, _, n, s in events if n == "pivot_root"), None)
    cmd = None
    for p, _, n, s in events:
        if n == "execve" and p not in (main, helper, init):
            cmd = p
    m = {}

    def first(key, pid, name, pred=lambda s: True, after=None):
        if key in m:
            return
        for p, t, n, s in events:
            if p == pid and n == name and pred(s) and (after is None or t >= after):
                m[key] = t
                return

    first("start", main, "execve")
    first("spawn", main, "clone", lambda s: "CLONE_THREAD" not in s)
    first("kits", main, "openat", lambda s: "kit.yaml" in s)
    first("provision", main, "openat", lambda s: ".composition.json.tmp" in s)
    first("config", main, "openat", lambda s: "composition.json" in s and "O_RDONLY" in s)
    first("ca", main, "openat", lambda s: "ca-key.pem" in s)
    first("spec_sent", main, "sendmsg", lambda s: '{\\"Start\\"' in s)
    first("helper_exec", helper, "execve")
    # The helper reads the host before it waits for the spec (its first recvmsg).
    first("helper_waits", helper, "recvmsg")
    first("clone_ns", helper, "clone", lambda s: "CLONE_NEWUSER" in s)
    # Joining the cgroup: on v1 the init writes 0 to `tasks` itself; on v2 the helper
    # writes the init's pid to `cgroup.procs`.
    first("attach", init, "openat", lambda s: s.split(",")[1].strip().endswith('/tasks"')
          and "O_WRONLY" in s)
    first("attach", helper, "openat", lambda s: "cgroup.procs" in s and "O_WRONLY" in s,
          after=m.get("clone_ns"))
    first("init_start", init, "openat", lambda s: not s.split(",")[1].strip().endswith('/tasks"'),
          after=m.get("attach"))
    first("pivot", init, "pivot_root")
    first("ready", init, "sendmsg", lambda s: "Ready" in s)
    first("run_sent", main, "sendmsg", lambda s: '{\\"Run\\"' in s)
    first("cmd_exec", cmd, "execve")
    first("cmd_exit", cmd, "exit_group")
    first("helper_exit", helper, "exit_group")
    # After the helper: the refusal summary and the removal from SQLite on the run's one
    # connection, then the state directory, removed beneath its opened parent.
    first("dir_remove", main, "openat", lambda s: "/sandboxes\"" in s and "O_DIRECTORY" in s,
          after=m.get("helper_exit"))
    first("end", main, "exit_group")
    first("gone", main, "+++")
    return m


PHASES = [
    ("start", "spawn", "process start: exec, dynamic loader, clap; the helper spawned"),
    ("spawn", "provision", "read/validate/resolve kits + lock gate"),
    ("provision", "config", "provision: composition.json (fsync) + rules"),
    ("config", "ca", "gateway config: composition re-read, secrets, SQLite opens, rules, audit thread"),
    ("ca", "spec_sent", "CA load (x2), workload env (composition re-read), spec sent"),
    ("spec_sent", "clone_ns", "helper: decode the spec, state dirs, cgroup create + limits"),
    ("clone_ns", "attach", "clone(NEWUSER|NS|PID|NET|IPC|UTS) + setgroups, uid/gid maps, release"),
    ("attach", "init_start", "cgroup join (v1: the init, 0 to tasks; v2: cgroup.procs) + root tmpfs, binds"),
    ("init_start", "pivot", "init: /etc (files; alternatives bound), /dev, /proc, pivot_root"),
    ("pivot", "ready", "init: loopback, listeners, caps, Landlock (+probe fork), seccomp"),
    ("ready", "run_sent", "caller: tokio runtime + listeners, Run request"),
    ("run_sent", "cmd_exec", "command: fork, ids, caps, seccomp, execve"),
    ("cmd_exec", "cmd_exit", "the command (/bin/true)"),
    ("cmd_exit", "helper_exit", "teardown: Stop, pid/mount/net ns exit, cgroup removal"),
    ("helper_exit", "dir_remove", "audit flush, refusal summary, removal from SQLite"),
    ("dir_remove", "end", "remove its state directory (rm -r)"),
    ("end", "gone", "process exit (threads, mappings)"),
]

# Off the critical path: runs while the caller works out the spec (not in the total).
PARALLEL = [
    ("spawn", "helper_waits", "in parallel: helper fork + exec, loader, host reading (ids, cgroups, /etc walk)"),
    ("helper_waits", "spec_sent", "in parallel: the helper then waits for the spec"),
]

# CPU by component, from `perf script` of `perf record --call-graph dwarf -F HZ` over N runs:
# a sample counts for every component whose frame is on its stack (so rows overlap).
CPU = [
    ("dynamic loader (3 execs: capgate, helper, /bin/true)", "_dl_start"),
    ("kits: read, resolve, lock gate", ("read_kits", "plan_kits", "capgate::lock::gate")),
    ("SQLite, all (5 opens: schema, pragmas, WAL close)", "sqlite3"),
    ("  Store::open", "capgate_policy::store::Store::open"),
    ("gateway::config (secrets, rules, audit writer, CA)", "capgate::gateway::config"),
    ("spec to JSON (caller; CA bundle as a number array)", "SandboxSpec>::serialize"),
    ("spec from JSON (helper)", "proto::Request>::deserialize"),
    ("HostView::read (helper: /etc walk)", "HostView::read"),
    ("kernel effects (Linux::apply: cgroup, mounts, /etc copy)", "Kernel>::apply"),
    ("  symlink(2) (/etc copy)", "__x64_sys_symlink"),
    ("  mount(2)", "__x64_sys_mount"),
    ("seccomp (compile + install)", "seccomp"),
    ("fork/clone (kernel copy_process)", "copy_process"),
    ("execve (kernel)", "do_execveat_common"),
    ("page faults", "asm_exc_page_fault"),
    ("fsync (CPU only)", "__x64_sys_fsync"),
    ("tokio runtime build", "runtime::builder::Builder::build"),
]


def perf_cpu(path, runs, hz):
    samples, cur = [], None
    for line in open(path, errors="replace"):
        if not line.strip():
            if cur is not None:
                samples.append("\n".join(cur))
            cur = None
        elif not line[0].isspace():
            cur = []
        elif cur is not None:
            cur.append(line.strip())
    if cur is not None:
        samples.append("\n".join(cur))
    ms = lambda n: n / hz * 1e3 / runs
    print(f"| component (perf, inclusive) | CPU ms per run | share of CPU |")
    print("|---|---|---|")
    for label, pats in CPU:
        pats = (pats,) if isinstance(pats, str) else pats
        n = sum(1 for s in samples if any(p in s for p in pats))
        print(f"| {label} | {ms(n):.2f} | {100 * n / max(len(samples), 1):.0f} % |")
    print(f"| **all CPU of the runs** | **{ms(len(samples)):.1f}** | 100 % |")


def stops(events, a, b):
    """Traced calls between two times (each one ptrace stop of overhead)."""
    return sum(1 for _, t, n, _ in events if a <= t < b and n != "+++")


def main():
    args = sys.argv[1:]
    if len(args) == 4 and args[0] == "--perf-script":
        perf_cpu(args[1], int(args[2]), float(args[3]))
        return
    untraced = None
    if len(args) >= 2 and args[0] == "--untraced":
        untraced, args = float(args[1]), args[2:]
    if not args:
        sys.exit(__doc__)
    traces = [parse(p) for p in args]
    runs = [marks(e) for e in traces]
    total = [(r["gone"] - r["start"]) * 1e3 for r in runs if "gone" in r and "start" in r]
    t = statistics.median(total) if total else float("nan")
    rows = []
    for a, b, label in PHASES:
        d = [(r[b] - r[a]) * 1e3 for r in runs if a in r and b in r]
        k = [stops(e, r[a], r[b]) for e, r in zip(traces, runs) if a in r and b in r]
        rows.append((label, statistics.median(d) if d else float("nan"),
                     statistics.median(k) if k else 0, len(d)))
    # With the untraced median, spread the difference over the phases by their number of
    # traced calls: an estimate of each phase without strace.
    all_stops = sum(k for _, _, k, _ in rows)
    per_stop = (t - untraced) / all_stops if untraced is not None and all_stops else 0.0
    est = "est. untraced ms" if untraced is not None else ""
    print(f"| phase | traced median ms | traced calls | {est} | (of {len(runs)} runs) |")
    print("|---|---|---|---|---|")
    for label, v, k, n in rows:
        miss = "" if n == len(runs) else f" (found in {n} runs)"
        e = f"{max(v - k * per_stop, 0.0):.1f}" if untraced is not None else ""
        print(f"| {label} | {v:.2f} | {k:.0f} | {e} |{miss} |")
    e = f"**{untraced:.1f}** (measured)" if untraced is not None else ""
    print(f"| **total** | **{t:.2f}** | {all_stops:.0f} | {e} | |")
    for a, b, label in PARALLEL:
        d = [(r[b] - r[a]) * 1e3 for r in runs if a in r and b in r]
        k = [stops(e, r[a], r[b]) for e, r in zip(traces, runs) if a in r and b in r]
        v = statistics.median(d) if d else float("nan")
        kk = statistics.median(k) if k else 0
        est_v = f"{max(v - kk * per_stop, 0.0):.1f}" if untraced is not None else ""
        print(f"| *{label}* | {v:.2f} | {kk:.0f} | {est_v} | |")
    if untraced is not None:
        print(f"\n(strace cost: {per_stop * 1e3:.0f} µs per traced call, fitted so that the phases add up to the untraced median)")


if __name__ == "__main__":
    main()
