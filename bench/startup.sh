#!/usr/bin/env bash
# capgate start-up benchmark: `capgate run -- /bin/true` vs bare bubblewrap vs srt
# (npm `@anthropic-ai/sandbox-runtime`) vs `/bin/true` itself, with hyperfine.
#
#   bash bench/startup.sh            (as root when something must be apt-get installed)
#
# Environment (defaults in brackets): RUNS [100] hyperfine runs per command and rep,
# SRT_RUNS [20] for srt (~0.3 s a run), WARMUP [10] (srt: SRT_WARMUP [3]), REPS [3]
# interleaved hyperfine passes (the table shows the median of their medians),
# SRT_VERSION [0.0.78, the version of perf-baselines.md] npm version of the sandbox runtime,
# GATE_MAX [60] seconds to wait before each pass for a quiet machine (< 8 % CPU over 1 s),
# BENCH_KEEP [0] =1 keeps the scratch folder (hyperfine JSON, srt install, CAPGATE_HOME),
# PACE [0.2] seconds of pause before each run of the paced pass (below), WARM_READY [2].
#
# Besides the cold `capgate run`, each pass times runs that take a sandbox `capgate warm`
# prepared (its own data directory, the same workspace and options): once back to back
# (the pool refills while the runs go on, so many runs wait for a preparation), and once
# paced, with PACE seconds between runs (hyperfine --prepare, not timed), as an agent's
# tool calls come, next to bwrap paced the same way.
#
# Only the package installs (apt-get, npm) touch the network. Everything else happens in
# a scratch folder under /tmp that is removed on exit; no process outlives the script.
# Goal (the issue): capgate within 2x of bare bwrap (which does far less) and far below srt.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
RUNS=${RUNS:-100}
SRT_RUNS=${SRT_RUNS:-20}
WARMUP=${WARMUP:-10}
SRT_WARMUP=${SRT_WARMUP:-3}
REPS=${REPS:-3}
SRT_VERSION=${SRT_VERSION:-0.0.78}
GATE_MAX=${GATE_MAX:-60}
BENCH_KEEP=${BENCH_KEEP:-0}
PACE=${PACE:-0.2}
WARM_READY=${WARM_READY:-2}

log() { printf '[startup %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---- tools -------------------------------------------------------------------------
missing=()
for pair in hyperfine:hyperfine bwrap:bubblewrap socat:socat rg:ripgrep; do
    cmd=${pair%%:*} pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing ${missing[*]}: run as root (apt-get) or install them"
    log "installing ${missing[*]} from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
for cmd in node npm; do
    command -v "$cmd" >/dev/null 2>&1 || die "$cmd is needed for srt (apt-get install nodejs npm)"
done
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3) || die "python3 is needed (to read hyperfine's JSON)"
BWRAP=$(command -v bwrap)
TRUE=/bin/true

log "building capgate (release)"
(cd "$ROOT" && cargo build --release -q -p capgate)
CAPGATE="$ROOT/target/release/capgate"
[ -x "$CAPGATE" ] || die "no $CAPGATE after the build"

# ---- scratch folder and clean-up ------------------------------------------------------
WORK=$(mktemp -d /tmp/capgate-startup.XXXXXX)
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # Every process started here is a hyperfine child waited for in the foreground, but
    # `capgate warm`, stopped here (its prepared sandboxes remove their own state); the
    # ephemeral capgate sandboxes remove their own records, state and cgroups.
    if [ -n "${WARM_PID:-}" ] && kill -0 "$WARM_PID" 2>/dev/null; then
        kill -INT "$WARM_PID" 2>/dev/null || true
        wait "$WARM_PID" 2>/dev/null || true
    fi
    if [ "$BENCH_KEEP" = 1 ]; then
        log "kept $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# srt into a scratch npm prefix (the only network use besides apt-get).
log "installing @anthropic-ai/sandbox-runtime@$SRT_VERSION into $WORK/srt"
mkdir -p "$WORK/srt"
(cd "$WORK/srt" && npm init -y >/dev/null &&
    npm install --no-audit --no-fund --loglevel=error \
        "@anthropic-ai/sandbox-runtime@$SRT_VERSION" >"$WORK/srt/npm.log" 2>&1) ||
    die "npm install failed: $(tail -5 "$WORK/srt/npm.log")"
SRT="$WORK/srt/node_modules/.bin/srt"
[ -x "$SRT" ] || die "no srt binary in $WORK/srt/node_modules/.bin"
# No network and no extra writable path: the same grants as capgate's built-in kit.
cat >"$WORK/srt/settings.json" <<'EOF'
{
  "network": { "allowedDomains": [], "deniedDomains": [] },
  "filesystem": { "denyRead": [], "allowWrite": [], "denyWrite": [] }
}
EOF

# capgate: a private data directory and a small empty workspace (copied, as by default).
export CAPGATE_HOME="$WORK/capgate-home"
WS="$WORK/workspace"
mkdir -p "$CAPGATE_HOME" "$WS"
cd "$WS"

CMD_TRUE="$TRUE"
CMD_BWRAP="$BWRAP --unshare-all --die-with-parent --ro-bind / / $TRUE"
CMD_BWRAP_FULL="$BWRAP --unshare-all --die-with-parent --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp $TRUE"
CMD_CAPGATE="$CAPGATE run -- $TRUE"
CMD_SRT="$SRT --settings $WORK/srt/settings.json true"

# ---- smoke checks: every command works, and the warm-up run creates the lock and CA -------
log "warm-up: one capgate run (writes the built-in kit, its lock and the CA)"
"$CAPGATE" run -- "$TRUE" >"$WORK/warmup.log" 2>&1 ||
    die "capgate run -- /bin/true failed: $(cat "$WORK/warmup.log")"
[ -s "$CAPGATE_HOME/builtin/shell/capgate.lock" ] || die "the warm-up wrote no lock"
[ -d "$CAPGATE_HOME/ca" ] || die "the warm-up created no CA"
[ ! -s "$WORK/warmup.log" ] || log "capgate said: $(cat "$WORK/warmup.log")"
for c in "$CMD_BWRAP" "$CMD_BWRAP_FULL" "$CMD_SRT"; do
    # shellcheck disable=SC2086 # the command lines are word lists on purpose
    $c >"$WORK/smoke.log" 2>&1 || die "\`$c\` failed: $(cat "$WORK/smoke.log")"
done

# `capgate warm` for the same workspace and options, in a data directory of its own (so
# that the cold runs above stay cold).
WARM_HOME="$WORK/capgate-warm-home"
mkdir -p "$WARM_HOME"
CAPGATE_HOME="$WARM_HOME" "$CAPGATE" run -- "$TRUE" >"$WORK/warmup-warm.log" 2>&1 ||
    die "the warm data directory's first run failed: $(cat "$WORK/warmup-warm.log")"
log "starting capgate warm --ready $WARM_READY"
CAPGATE_HOME="$WARM_HOME" "$CAPGATE" warm --ready "$WARM_READY" 2>"$WORK/warm.log" &
WARM_PID=$!
for _ in $(seq 600); do
    grep -q ' ready; ' "$WORK/warm.log" && break
    kill -0 "$WARM_PID" 2>/dev/null || die "capgate warm ended: $(cat "$WORK/warm.log")"
    sleep 0.1
done
grep -q ' ready; ' "$WORK/warm.log" || die "capgate warm was not ready in 60 s"

cpu_gate() {     # wait (at most GATE_MAX s) until the machine was < 8 % busy over 1 s; prints %
    local i a b busy=100
    for i in $(seq "$GATE_MAX"); do
        a=$(awk '/^cpu / {print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat)
        sleep 1
        b=$(awk '/^cpu / {print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat)
        busy=$(echo "$a $b" | awk '{d=$4-$2; print (d>0) ? int(100*($3-$1)/d) : 100}')
        [ "$busy" -lt 8 ] && break
    done
    echo "$busy"
}

# ---- the runs: REPS passes, each = one hyperfine over the fast commands, one over srt ---
GATES=()
for rep in $(seq "$REPS"); do
    gate=$(cpu_gate)
    GATES+=("$gate")
    [ "$gate" -lt 8 ] || log "WARNING: the machine is busy (${gate}% CPU) for pass $rep; figures are noisy"
    log "pass $rep of $REPS (cpu gate ${gate}%): /bin/true, bwrap, bwrap+dev/proc/tmp, capgate ($RUNS runs each)"
    hyperfine -N --style basic --warmup "$WARMUP" --runs "$RUNS" \
        --export-json "$WORK/fast-$rep.json" \
        -n true "$CMD_TRUE" \
        -n bwrap "$CMD_BWRAP" \
        -n bwrap-full "$CMD_BWRAP_FULL" \
        -n capgate "$CMD_CAPGATE" >"$WORK/fast-$rep.txt" 2>&1 ||
        die "hyperfine failed: $(tail -20 "$WORK/fast-$rep.txt")"
    log "pass $rep of $REPS: prepared sandboxes, back to back and paced (${PACE}s), bwrap paced"
    CAPGATE_HOME="$WARM_HOME" hyperfine -N --style basic --warmup "$WARMUP" --runs "$RUNS" \
        --export-json "$WORK/warm-$rep.json" \
        -n capgate-warm "$CMD_CAPGATE" >"$WORK/warm-$rep.txt" 2>&1 ||
        die "hyperfine (warm) failed: $(tail -20 "$WORK/warm-$rep.txt")"
    CAPGATE_HOME="$WARM_HOME" hyperfine -N --style basic --warmup 3 --runs "$RUNS" \
        --prepare "sleep $PACE" --export-json "$WORK/paced-$rep.json" \
        -n bwrap-paced "$CMD_BWRAP" \
        -n capgate-warm-paced "$CMD_CAPGATE" >"$WORK/paced-$rep.txt" 2>&1 ||
        die "hyperfine (paced) failed: $(tail -20 "$WORK/paced-$rep.txt")"
    log "pass $rep of $REPS: srt ($SRT_RUNS runs)"
    hyperfine -N --style basic --warmup "$SRT_WARMUP" --runs "$SRT_RUNS" \
        --export-json "$WORK/srt-$rep.json" \
        -n srt "$CMD_SRT" >"$WORK/srt-$rep.txt" 2>&1 ||
        die "hyperfine (srt) failed: $(tail -20 "$WORK/srt-$rep.txt")"
done
# Nothing of the runs is left behind: no sandbox record, no state, no cgroup.
handed=$(grep -c 'a run took the prepared sandbox' "$WORK/warm.log" || true)
log "capgate warm handed $handed prepared sandboxes to runs"
kill -INT "$WARM_PID" 2>/dev/null || true
wait "$WARM_PID" 2>/dev/null || true
WARM_PID=
left=$(find "$CAPGATE_HOME/sandboxes" "$WARM_HOME/sandboxes" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
[ "$left" = 0 ] || log "WARNING: $left sandbox directories were left in $CAPGATE_HOME/sandboxes"
stale=$(find /sys/fs/cgroup -maxdepth 6 -type d -path '*/capgate/run-*' 2>/dev/null | wc -l)
[ "$stale" = 0 ] || log "WARNING: $stale capgate run-* cgroups were left under /sys/fs/cgroup"

# ---- the table ---------------------------------------------------------------------------
"$PY" - "$WORK" "$REPS" "$RUNS" "$SRT_RUNS" "${GATES[*]}" "$SRT_VERSION" "$PACE" "$handed" <<'EOF'
import json, statistics, sys
work, reps, runs, srt_runs, gates, srt_version, pace, handed = sys.argv[1:9]
reps = int(reps)
per = {}   # name -> [per-pass median seconds]
cmd = {}
for rep in range(1, reps + 1):
    for f in (f"{work}/fast-{rep}.json", f"{work}/warm-{rep}.json",
              f"{work}/paced-{rep}.json", f"{work}/srt-{rep}.json"):
        for r in json.load(open(f))["results"]:
            per.setdefault(r["command"], []).append(r["median"])
            cmd[r["command"]] = r
med = {k: statistics.median(v) * 1e3 for k, v in per.items()}
rows = [
    ("true", "`/bin/true`"),
    ("bwrap", "`bwrap --unshare-all --die-with-parent --ro-bind / / /bin/true`"),
    ("bwrap-full", "same + `--dev /dev --proc /proc --tmpfs /tmp` (reference)"),
    ("capgate", "`capgate run -- /bin/true`"),
    ("capgate-warm", "same, `capgate warm` running (back to back)"),
    ("bwrap-paced", f"bwrap, paced ({pace} s between runs)"),
    ("capgate-warm-paced", f"`capgate run -- /bin/true`, `capgate warm` running, paced ({pace} s)"),
    ("srt", f"`srt --settings <no network> true` (sandbox-runtime {srt_version})"),
]
print()
print(f"capgate start-up: hyperfine -N, median of {reps} interleaved passes "
      f"({runs} runs each; srt {srt_runs}); cpu gate per pass: {gates} %; "
      f"runs that took a prepared sandbox: {handed}")
print()
print("| command | median | vs /bin/true | added over /bin/true | per-pass medians (ms) |")
print("|---|---|---|---|---|")
t = med["true"]
for name, label in rows:
    m = med[name]
    passes = " / ".join(f"{x * 1e3:.2f}" for x in per[name])
    print(f"| {label} | **{m:.2f} ms** | {m / t:.1f}× | +{m - t:.2f} ms | {passes} |")
cg, bw, sr, bf = med["capgate"], med["bwrap"], med["srt"], med["bwrap-full"]
cw, bp = med["capgate-warm-paced"], med["bwrap-paced"]
print()
print("| ratio | value | goal | |")
print("|---|---|---|---|")
print(f"| capgate / bwrap | **{cg / bw:.2f}×** (vs bwrap+dev/proc/tmp {cg / bf:.2f}×) | ≤ 2× | "
      f"{'MET' if cg <= 2 * bw else 'MISSED'} |")
print(f"| srt / capgate | **{sr / cg:.1f}×** | far below srt (perf-baselines §7 reads ≥ 40×) | "
      f"{'MET' if sr >= 40 * cg else 'MISSED'} |")
print(f"| capgate warm, paced / bwrap, paced | **{cw / bp:.2f}×** | ≤ 2× | "
      f"{'MET' if cw <= 2 * bp else 'MISSED'} |")
print(f"| srt / capgate warm, paced | **{sr / cw:.1f}×** | ≥ 40× | "
      f"{'MET' if sr >= 40 * cw else 'MISSED'} |")
print()
EOF
