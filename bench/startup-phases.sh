#!/usr/bin/env bash
# Where the start-up time of `capgate run -- /bin/true` goes (companion of startup.sh).
#
#   bash bench/startup-phases.sh     (needs strace; the release build of startup.sh)
#
# Runs TRACES [20] `capgate run -- /bin/true` under `strace -f -ttt --seccomp-bpf` with a
# few marker syscalls only (so the overhead stays small), and prints the median time of each
# phase (bench/startup_phases.py), next to the untraced median of the same runs' setting.
# PERF=1 also records `perf record --call-graph dwarf` over PERF_RUNS [20] untraced runs and
# prints CPU per run by component (release builds keep debug symbols here).
# BENCH_KEEP=1 keeps the scratch folder.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
TRACES=${TRACES:-20}
PERF=${PERF:-0}
PERF_RUNS=${PERF_RUNS:-20}
BENCH_KEEP=${BENCH_KEEP:-0}

log() { printf '[phases %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v strace >/dev/null || die "strace is needed (apt-get install strace)"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3) || die "python3 is needed"
(cd "$ROOT" && cargo build --release -q -p capgate)
CAPGATE="$ROOT/target/release/capgate"

WORK=$(mktemp -d /tmp/capgate-phases.XXXXXX)
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ "$BENCH_KEEP" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export CAPGATE_HOME="$WORK/capgate-home"
mkdir -p "$CAPGATE_HOME" "$WORK/workspace" "$WORK/traces"
cd "$WORK/workspace"
"$CAPGATE" run -- /bin/true >/dev/null 2>&1 || die "the warm-up run failed"
for _ in 1 2 3 4 5; do "$CAPGATE" run -- /bin/true; done   # warm caches

# Untraced wall time of the same setting, for scale (ms, median of TRACES runs).
untraced=()
for _ in $(seq "$TRACES"); do
    a=$(date +%s%N); "$CAPGATE" run -- /bin/true; b=$(date +%s%N)
    untraced+=("$(( (b - a) / 1000 ))")
done

for i in $(seq "$TRACES"); do
    strace -f -ttt --seccomp-bpf \
        -e trace=execve,clone,clone3,openat,pivot_root,sendmsg,recvmsg,exit_group \
        -o "$WORK/traces/run-$i.txt" "$CAPGATE" run -- /bin/true
done

echo
echo "capgate run -- /bin/true: untraced median $(printf '%s\n' "${untraced[@]}" |
    sort -n | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]/1000}') ms over $TRACES runs;" \
    "phases from $TRACES strace runs:"
echo
UNTRACED_MS=$(printf '%s\n' "${untraced[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.2f", a[int((NR+1)/2)]/1000}')
"$PY" "$HERE/startup_phases.py" --untraced "$UNTRACED_MS" "$WORK"/traces/run-*.txt

if [ "$PERF" = 1 ]; then
    command -v perf >/dev/null || die "perf is needed for PERF=1"
    log "perf record --call-graph dwarf over $PERF_RUNS runs"
    perf record -q --call-graph dwarf,16384 -F 2000 -o "$WORK/perf.data" -- bash -c \
        "for i in \$(seq $PERF_RUNS); do '$CAPGATE' run -- /bin/true; done" >/dev/null 2>&1
    perf script -i "$WORK/perf.data" >"$WORK/perf.txt" 2>/dev/null
    echo
    echo "CPU by component (perf, $PERF_RUNS runs; the rows overlap):"
    echo
    "$PY" "$HERE/startup_phases.py" --perf-script "$WORK/perf.txt" "$PERF_RUNS" 2000
fi
