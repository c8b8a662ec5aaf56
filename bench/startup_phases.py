#!/usr/bin/env python3
"""Where the start-up time of `capgate run -- /bin/true` goes, from `strace -f -ttt` traces.

Usage: startup_phases.py TRACE...   (each TRACE one run, made by bench/startup-phases.sh with
`strace -f -ttt --seccomp-bpf -e trace=execve,clone,clone3,openat,fsync,mount,pivot_root,
sendmsg,exit_group`). Prints, per phase, the median over the traces in ms. The phases are cut
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
    init = next((p for p, _, n, s in events if n == "mount" and p not in (main, helper)), None)
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
    first("kits", main, "openat", lambda s: "kit.yaml" in s)
    first("provision", main, "openat", lambda s: "composition.tmp" in s)
    first("config", main, "openat", lambda s: "composition.json" in s and "O_RDONLY" in s)
    first("ca", main, "openat", lambda s: "ca-key.pem" in s)
    first("spawn", main, "clone", lambda s: "CLONE_THREAD" not in s)
    first("helper_exec", helper, "execve")
    first("spec_decoded", helper, "openat",
          lambda s: any(x in s for x in ('"/etc/nsswitch.conf"', '"/etc/passwd"', '"/etc/subuid"')))
    first("cgroup_done", helper, "openat", lambda s: '"/etc/' in s and "subuid" not in s
          and "subgid" not in s and "passwd" not in s and "nsswitch" not in s and "group" not in s,
          after=m.get("spec_decoded"))
    first("clone_ns", helper, "clone", lambda s: "CLONE_NEWUSER" in s)
    first("init_mounts", init, "mount")
    first("pivot", init, "pivot_root")
    first("ready", init, "sendmsg", lambda s: "Ready" in s)
    first("run_sent", main, "sendmsg", lambda s: '{\\"Run\\"' in s)
    first("cmd_exec", cmd, "execve")
    first("cmd_exit", cmd, "exit_group")
    first("helper_exit", helper, "exit_group")
    h = m.get("helper_exit")
    # Each Store::open starts with an O_CREAT|O_EXCL attempt on policy.db.
    opens = [t for p, t, n, s in events if p == main and n == "openat" and 'policy.db"' in s
             and "O_EXCL" in s and h is not None and t >= h]
    if len(opens) >= 2:
        m["store_summary"], m["store_remove"] = opens[0], opens[1]
    first("dir_remove", main, "openat", lambda s: "sandboxes/run-" in s and "O_DIRECTORY" in s,
          after=h)
    first("end", main, "exit_group")
    first("gone", main, "+++")
    return m


PHASES = [
    ("start", "kits", "process start: exec, dynamic loader, clap, built-in kit file"),
    ("kits", "provision", "read/validate/resolve kits + lock gate"),
    ("provision", "config", "provision: composition.json (fsync) + SQLite open + rules (fsyncs)"),
    ("config", "ca", "gateway config: composition re-read, secrets, 2x SQLite open, rules, audit thread"),
    ("ca", "spawn", "CA load (x2), CA bundle, workload env (composition re-read), spec"),
    ("spawn", "helper_exec", "fork + exec of the helper"),
    ("helper_exec", "spec_decoded", "helper: loader + receive and decode the JSON spec"),
    ("spec_decoded", "cgroup_done", "helper: id maps, state dirs, cgroup v1 create + pids.max"),
    ("cgroup_done", "clone_ns", "helper: HostView::read (/etc walk, /dev, /proc)"),
    ("clone_ns", "init_mounts", "clone(NEWUSER|NS|PID|NET|IPC|UTS) + uid/gid maps + cgroup attach"),
    ("init_mounts", "pivot", "init: mounts, /etc copy (files, ~400 symlinks), /dev, /proc, pivot"),
    ("pivot", "ready", "init: loopback, listeners, caps, Landlock (+probe fork), seccomp"),
    ("ready", "run_sent", "caller: tokio runtime + listeners, Run request"),
    ("run_sent", "cmd_exec", "command: fork, ids, caps, seccomp, execve"),
    ("cmd_exec", "cmd_exit", "the command (/bin/true)"),
    ("cmd_exit", "helper_exit", "teardown: Stop, pid/mount/net ns exit, cgroup removal"),
    ("helper_exit", "store_remove", "audit flush + summary (SQLite open, events query)"),
    ("store_remove", "dir_remove", "remove the ephemeral sandbox from SQLite (delete, fsyncs)"),
    ("dir_remove", "end", "remove its state directory (rm -r)"),
    ("end", "gone", "process exit (threads, mappings)"),
]


def main():
    runs = [marks(parse(p)) for p in sys.argv[1:]]
    if not runs:
        sys.exit(__doc__)
    total = []
    print(f"| phase | median ms | share | (of {len(runs)} traced runs) |")
    print("|---|---|---|---|")
    rows = []
    for a, b, label in PHASES:
        d = [(r[b] - r[a]) * 1e3 for r in runs if a in r and b in r]
        rows.append((label, statistics.median(d) if d else float("nan"), len(d)))
    total = [(r["gone"] - r["start"]) * 1e3 for r in runs if "gone" in r and "start" in r]
    t = statistics.median(total) if total else float("nan")
    for label, v, n in rows:
        miss = "" if n == len(runs) else f" (found in {n} runs)"
        print(f"| {label} | {v:.2f} | {100 * v / t:.0f} % |{miss} |")
    print(f"| **total (traced)** | **{t:.2f}** | 100 % | |")


if __name__ == "__main__":
    main()
