#!/usr/bin/env python3
"""Prints bench/gateway.sh's table from its raw results (results.tsv in the scratch folder).

    table.py RESULTS.tsv [KEY=VALUE ...]

Keys (all optional): conns reps duration c1_duration threads tls_procs, and the gateway's
VmRSS in KiB: gw_rss_start gw_rss_end gw_hwm squid_rss tiny_rss.
Each results line: name <TAB> rep <TAB> cpu-gate % <TAB> `rps=.. bps=.. p50_us=.. p99_us=.. ...`
(a run that produced no result has errors=-1 and is left out of the medians).
"""
import math
import statistics
import sys

meta = dict(a.split("=", 1) for a in sys.argv[2:])
C = meta.get("conns", "50")
rows = {}
for line in open(sys.argv[1]):
    name, rep, gate, kv = line.rstrip("\n").split("\t")
    d = dict(x.split("=") for x in kv.split())
    d["gate"] = gate
    rows.setdefault(name, []).append(d)


def ok_runs(name):
    return [r for r in rows.get(name, []) if int(r.get("errors", 0)) >= 0]


def med(name, key):
    v = [float(r[key]) for r in ok_runs(name)]
    return statistics.median(v) if v else math.nan


def runs(name, key, scale=1.0):
    return " / ".join(f"{float(r[key]) * scale:.0f}" for r in rows.get(name, []))


def errs(name):
    return sum(max(0, int(r.get("errors", 0))) for r in rows.get(name, []))


def mib(key):
    return float(meta.get(key, "nan")) / 1024


def ratio(a, b):
    return a / b if b else math.nan


paths = ["direct", "capgate", "squid", "tinyproxy", "haproxy"]
gates = [int(r["gate"]) for rs in rows.values() for r in rs]
print()
print(f"capgate gateway benchmark: loopback, medians of {meta.get('reps', '?')} interleaved runs; "
      f"wrk -t{meta.get('threads', '?')} -c{C} {meta.get('duration', '?')} s "
      f"(c1: -t1 -c1 {meta.get('c1_duration', '?')} s); CPU busy before runs: max {max(gates, default=0)} %")
print()
print(f"| path | 1 KB c{C} req/s | p50 ms | p99 ms | 1 MB c{C} MB/s | p50 / p99 ms "
      f"| 1 KB c1 req/s | c1 p50 / p99 ms | socket errors* |")
print("|---|---|---|---|---|---|---|---|---|")
for p in paths:
    k, m, c1 = f"c{C}_1k_{p}", f"c{C}_1m_{p}", f"c1_1k_{p}"
    print(f"| {p} | {med(k, 'rps'):,.0f} | {med(k, 'p50_us') / 1e3:.2f} | {med(k, 'p99_us') / 1e3:.2f} "
          f"| {med(m, 'bps') / 1e6:,.0f} | {med(m, 'p50_us') / 1e3:.1f} / {med(m, 'p99_us') / 1e3:.1f} "
          f"| {med(c1, 'rps'):,.0f} | {med(c1, 'p50_us') / 1e3:.3f} / {med(c1, 'p99_us') / 1e3:.3f} "
          f"| {errs(k) + errs(m) + errs(c1)} |")
print()
print(f"per-run req/s (1 KB c{C}): " + "; ".join(f"{p} {runs(f'c{C}_1k_{p}', 'rps')}" for p in paths))
print(f"per-run MB/s (1 MB c{C}): " + "; ".join(f"{p} {runs(f'c{C}_1m_{p}', 'bps', 1e-6)}" for p in paths))
print("per-run c1 p99 µs: " + "; ".join(f"{p} {runs(f'c1_1k_{p}', 'p99_us')}" for p in paths))
print("* tinyproxy closes the client connection after every response; wrk counts those as read errors.")
print("haproxy is a reference, not a goal: a reverse proxy to a fixed backend (no names, policy or audit), "
      "splicing bodies as capgate does.")
ratios = [ratio(float(c["bps"]), float(d["bps"])) for c, d in zip(ok_runs(f"c{C}_1m_capgate"), ok_runs(f"c{C}_1m_direct"))]
print("per-rep 1 MB capgate / direct: " + " / ".join(f"{100 * r:.0f} %" for r in ratios))


def cpu_per_request(name):
    """The proxy's own CPU (user + system, all threads) per completed request, in µs."""
    v = [1e3 * float(r["proxy_cpu_ms"]) / float(r["requests"]) for r in ok_runs(name)
         if "proxy_cpu_ms" in r and float(r.get("requests", 0)) > 0]
    return statistics.median(v) if v else math.nan


print("proxy CPU per request, µs (1 KB c{0} / 1 MB c{0}): ".format(C) + "; ".join(
    f"{p} {cpu_per_request(f'c{C}_1k_{p}'):.0f} / {cpu_per_request(f'c{C}_1m_{p}'):.0f}"
    for p in paths if p != "direct"))
print()

cg, sq, ti, di = (med(f"c{C}_1k_{p}", "rps") for p in ("capgate", "squid", "tinyproxy", "direct"))
add99_c1 = (med("c1_1k_capgate", "p99_us") - med("c1_1k_direct", "p99_us")) / 1e3
add50_c1 = (med("c1_1k_capgate", "p50_us") - med("c1_1k_direct", "p50_us")) / 1e3
add99_cn = (med(f"c{C}_1k_capgate", "p99_us") - med(f"c{C}_1k_direct", "p99_us")) / 1e3
mb = {p: med(f"c{C}_1m_{p}", "bps") for p in paths}
tput = ratio(mb["capgate"], mb["direct"])


def verdict(b):
    return "MET" if b else "MISSED"


print("| goal | measured | |")
print("|---|---|---|")
print(f"| capgate ≥ 2× squid req/s (1 KB c{C}) | {ratio(cg, sq):.2f}× squid "
      f"(capgate {ratio(cg, di):.3f}× direct, squid {ratio(sq, di):.3f}×) | {verdict(cg >= 2 * sq)} |")
print(f"| capgate ahead of tinyproxy req/s | {ratio(cg, ti):.2f}× tinyproxy | {verdict(cg > ti)} |")
print(f"| p99 added latency < 1 ms (c1: capgate p99 − direct p99) | {add99_c1:+.3f} ms "
      f"(c1 p50 {add50_c1:+.3f} ms; at c{C}, where direct's own p99 is queueing noise: {add99_cn:+.2f} ms) "
      f"| {verdict(add99_c1 < 1.0)} |")
print(f"| 1 MB throughput ≥ 70 % of direct | {100 * tput:.0f} % "
      f"(squid {100 * ratio(mb['squid'], mb['direct']):.0f} %, "
      f"tinyproxy {100 * ratio(mb['tinyproxy'], mb['direct']):.0f} %; haproxy, the splicing reverse-proxy "
      f"reference, {100 * ratio(mb['haproxy'], mb['direct']):.0f} %) | {verdict(tput >= 0.70)} |")
print()
tc, td = med("tls_1k_capgate", "rps"), med("tls_1k_direct", "rps")
print(f"TLS-intercepted (tls.local, bounded GET rule; {meta.get('tls_procs', '?')} Python clients, "
      f"one CONNECT tunnel each, keep-alive GET /1k): capgate {tc:,.0f} req/s, "
      f"p50 {med('tls_1k_capgate', 'p50_us') / 1e3:.2f} / p99 {med('tls_1k_capgate', 'p99_us') / 1e3:.2f} ms; "
      f"the same client direct to nginx HTTPS {td:,.0f} req/s, "
      f"p50 {med('tls_1k_direct', 'p50_us') / 1e3:.2f} / p99 {med('tls_1k_direct', 'p99_us') / 1e3:.2f} ms "
      f"→ {ratio(tc, td):.2f}× direct; errors {errs('tls_1k_capgate')}")
print(f"  per-run req/s: capgate {runs('tls_1k_capgate', 'rps')}; direct {runs('tls_1k_direct', 'rps')}")
print()
print(f"Gateway memory (VmRSS): idle after start {mib('gw_rss_start'):.1f} MiB, idle after the runs "
      f"{mib('gw_rss_end'):.1f} MiB, peak (VmHWM) {mib('gw_hwm'):.1f} MiB. After the runs, for comparison: "
      f"squid (master + kid) {mib('squid_rss'):.1f} MiB, tinyproxy {mib('tiny_rss'):.1f} MiB.")
