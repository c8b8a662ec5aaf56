#!/usr/bin/env bash
# capgate gateway benchmark: direct nginx vs capgate vs squid vs tinyproxy (and haproxy as a
# reference for the 1 MB row), on loopback.
#
#   bash bench/gateway.sh            (as root: it apt-get installs what is missing)
#
# Environment (defaults in brackets): DURATION [10] seconds per wrk run, REPS [3],
# CONNS [50], THREADS [2], C1_DURATION [5] for the one-connection latency runs,
# TLS_PROCS [4] client processes (one tunnel each) for the TLS-intercepted run,
# BENCH_KEEP [0] =1 keeps the scratch folder (configs, logs, raw results),
# ONLY [all] an extended regex: only the runs whose name matches it (e.g. ONLY='1m_(direct|capgate)';
# names are c<CONNS>_1k_<path>, c<CONNS>_1m_<path>, c1_1k_<path>, tls_1k_<path>).
#
# Everything runs on 127.0.0.1 and stops by itself; every process it starts is stopped by
# its PID on exit. See bench/README.md for what is measured and how to read the table.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
DURATION=${DURATION:-10}
REPS=${REPS:-3}
CONNS=${CONNS:-50}
THREADS=${THREADS:-2}
C1_DURATION=${C1_DURATION:-5}
TLS_PROCS=${TLS_PROCS:-4}
BENCH_KEEP=${BENCH_KEEP:-0}
ONLY=${ONLY:-}

NGINX_HTTP=18080
NGINX_TLS=18443
SQUID_PORT=13128
TINY_PORT=13129
HAPROXY_PORT=13132
CAPGATE_PORT=13131

log() { printf '[bench %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (apt-get, and squid/tinyproxy drop to their own users)"

# ---- tools -------------------------------------------------------------------------
missing=()
for pair in nginx:nginx squid:squid tinyproxy:tinyproxy haproxy:haproxy wrk:wrk openssl:openssl; do
    cmd=${pair%%:*} pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} from Debian"
    apt-get update -qq
    # Debian's policy-rc.d keeps the packaged services from starting; nothing auto-starts.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export PATH="$PATH:/usr/sbin:/sbin"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3) || die "python3 is needed"

log "building capgate (release)"
(cd "$ROOT" && cargo build --release -q -p capgate)
CAPGATE="$ROOT/target/release/capgate"
[ -x "$CAPGATE" ] || die "no $CAPGATE after the build"

for port in $NGINX_HTTP $NGINX_TLS $SQUID_PORT $TINY_PORT $HAPROXY_PORT $CAPGATE_PORT; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "127.0.0.1:$port is already in use"
    fi
done

# ---- scratch folder and clean-up ------------------------------------------------------
WORK=$(mktemp -d /tmp/capgate-bench.XXXXXX)
chmod 755 "$WORK"
PIDS=()          # processes started here, stopped by PID on exit
SQUID_MASTER=""

stop_pid() {     # stop_pid PID: TERM, wait up to 5 s, then KILL
    local pid=$1 i
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$? pid kids
    trap - EXIT INT TERM
    if [ -n "$SQUID_MASTER" ]; then
        kids=$(ps -o pid= --ppid "$SQUID_MASTER" 2>/dev/null || true)
        stop_pid "$SQUID_MASTER"
        for pid in $kids; do stop_pid "$pid"; done
    fi
    for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
    wait 2>/dev/null || true
    if [ "$BENCH_KEEP" = 1 ]; then
        log "kept $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_port() {    # wait_port PORT PID NAME: up to 15 s for a listener, failing if PID died
    local i
    for i in $(seq 150); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        [ -z "$2" ] || kill -0 "$2" 2>/dev/null || die "$3 exited (see $WORK)"
        sleep 0.1
    done
    die "$3 did not listen on 127.0.0.1:$1"
}

fill() { sed "s#@DIR@#$WORK#g" "$HERE/conf/$1"; }

proc_sum() {     # proc_sum FILE AWK PID...: the sum over the PIDs of what AWK prints of /proc/PID/FILE
    local file=$1 prog=$2 total=0 pid v
    shift 2
    for pid in "$@"; do
        v=$(awk "$prog" "/proc/$pid/$file" 2>/dev/null || echo 0)
        total=$((total + ${v:-0}))
    done
    echo "$total"
}
rss_kb() { proc_sum status '/^VmRSS:/ {print $2}' "$@"; }   # rss_kb PID...: summed VmRSS in KiB

# ---- content and certificates -----------------------------------------------------------
mkdir -p "$WORK"/{www,pki,nginx/tmp,squid,tinyproxy,haproxy,capgate,kit}
head -c 1024 /dev/urandom | base64 -w0 | head -c 1024 >"$WORK/www/1k"
head -c 1048576 /dev/urandom >"$WORK/www/1m"

(
    cd "$WORK/pki"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout ca.key -out ca.pem -days 2 -subj "/CN=capgate bench CA" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout tls.local.key -out tls.local.csr -subj "/CN=tls.local" 2>/dev/null
    printf '%s\n' "subjectAltName=DNS:tls.local" "basicConstraints=CA:FALSE" \
        "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" >leaf.ext
    openssl x509 -req -in tls.local.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days 2 \
        -extfile leaf.ext -out tls.local.pem 2>/dev/null
)

# ---- servers ------------------------------------------------------------------------
fill nginx.conf >"$WORK/nginx/nginx.conf"
nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" -g 'daemon off;' \
    >"$WORK/nginx/out.log" 2>&1 &
NGINX_PID=$!
PIDS+=("$NGINX_PID")
wait_port $NGINX_HTTP "$NGINX_PID" nginx
wait_port $NGINX_TLS "$NGINX_PID" nginx

fill squid.conf >"$WORK/squid/squid.conf"
chown -R proxy:proxy "$WORK/squid"
squid -f "$WORK/squid/squid.conf" </dev/null >"$WORK/squid/out.log" 2>&1 \
    || die "squid did not start (see $WORK/squid)"
for _ in $(seq 100); do [ -s "$WORK/squid/squid.pid" ] && break; sleep 0.1; done
SQUID_MASTER=$(tr -dc 0-9 <"$WORK/squid/squid.pid" 2>/dev/null || true)
[ -n "$SQUID_MASTER" ] || die "squid wrote no pid file (see $WORK/squid)"
wait_port $SQUID_PORT "$SQUID_MASTER" squid

fill tinyproxy.conf >"$WORK/tinyproxy/tinyproxy.conf"
chown -R tinyproxy:tinyproxy "$WORK/tinyproxy"
tinyproxy -d -c "$WORK/tinyproxy/tinyproxy.conf" >"$WORK/tinyproxy/out.log" 2>&1 &
TINY_PID=$!
PIDS+=("$TINY_PID")
wait_port $TINY_PORT "$TINY_PID" tinyproxy

fill haproxy.cfg >"$WORK/haproxy/haproxy.cfg"
haproxy -db -f "$WORK/haproxy/haproxy.cfg" >"$WORK/haproxy/out.log" 2>&1 &
HAPROXY_PID=$!
PIDS+=("$HAPROXY_PID")
wait_port $HAPROXY_PORT "$HAPROXY_PID" haproxy

export CAPGATE_HOME="$WORK/capgate/home"
cp "$HERE/kit.yaml" "$WORK/kit/kit.yaml"
"$CAPGATE" create bench --kit "$WORK/kit" >"$WORK/capgate/create.log" 2>&1 \
    || die "capgate create failed: $(cat "$WORK/capgate/create.log")"
CAPGATE_CA=$("$CAPGATE" ca path)
"$CAPGATE" gateway --sandbox bench --listen "127.0.0.1:$CAPGATE_PORT" \
    --dangerously-resolve bench.local=127.0.0.1 \
    --dangerously-resolve tls.local=127.0.0.1 \
    --upstream-ca "$WORK/pki/ca.pem" >"$WORK/capgate/gateway.log" 2>&1 &
GW_PID=$!
PIDS+=("$GW_PID")
wait_port $CAPGATE_PORT "$GW_PID" "capgate gateway"
sleep 1
GW_RSS_START=$(rss_kb "$GW_PID")

# ---- measurement helpers ----------------------------------------------------------------
RESULTS="$WORK/results.tsv"
: >"$RESULTS"

cpu_gate() {     # wait (at most 30 s) until the machine was < 8 % busy over 1 s; prints %
    local i a b busy=100
    for i in $(seq 30); do
        a=$(awk '/^cpu / {print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat)
        sleep 1
        b=$(awk '/^cpu / {print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat)
        busy=$(echo "$a $b" | awk '{d=$4-$2; print (d>0) ? int(100*($3-$1)/d) : 100}')
        [ "$busy" -lt 8 ] && break
    done
    echo "$busy"
}

proxy_pids() {   # proxy_pids PATH_NAME: the processes whose CPU a run through it is charged
    case $1 in direct) echo "" ;; capgate) echo "$GW_PID" ;;
        squid) echo "$SQUID_MASTER" $(ps -o pid= --ppid "$SQUID_MASTER" 2>/dev/null || true) ;;
        tinyproxy) echo "$TINY_PID" $(ps -o pid= --ppid "$TINY_PID" 2>/dev/null || true) ;;
        haproxy) echo "$HAPROXY_PID" ;; esac
}
# cpu_ticks PID...: summed user + system clock ticks (all threads)
cpu_ticks() { proc_sum stat '{sub(/.*\) /, ""); print $12 + $13}' "$@"; }
TICK_HZ=$(getconf CLK_TCK)

# target PATH_NAME SIZE: URL and Host for absolute-form through a proxy ("" for direct)
proxy_port() {
    case $1 in direct) echo "" ;; capgate) echo $CAPGATE_PORT ;;
        squid) echo $SQUID_PORT ;; tinyproxy) echo $TINY_PORT ;;
        haproxy) echo $HAPROXY_PORT ;; esac
}
origin_host() {  # capgate needs the name its kit grants; the peers get the address, as in perf-baselines
    if [ "$1" = capgate ]; then echo "bench.local:$NGINX_HTTP"; else echo "127.0.0.1:$NGINX_HTTP"; fi
}

selected() {     # selected NAME: does ONLY (if set) pick this run?
    [ -z "$ONLY" ] || printf '%s\n' "$1" | grep -Eq -- "$ONLY"
}

run_wrk() {      # run_wrk NAME PATH SIZE CONNS THREADS SECS REP
    local name=$1 path=$2 size=$3 c=$4 t=$5 d=$6 rep=$7 port host gate out line pids t0 t1 cpu
    selected "$name" || return 0
    port=$(proxy_port "$path")
    gate=$(cpu_gate)
    pids=$(proxy_pids "$path")
    t0=$(cpu_ticks $pids)
    if [ -z "$port" ]; then
        out=$(TARGET_URL="" wrk -t"$t" -c"$c" -d"${d}s" --latency -s "$HERE/wrk.lua" \
            "http://127.0.0.1:$NGINX_HTTP/$size" 2>&1) || true
    else
        host=$(origin_host "$path")
        out=$(TARGET_URL="http://$host/$size" TARGET_HOST="$host" \
            wrk -t"$t" -c"$c" -d"${d}s" --latency -s "$HERE/wrk.lua" \
            "http://127.0.0.1:$port" 2>&1) || true
    fi
    t1=$(cpu_ticks $pids)
    printf '%s\n' "$out" >>"$WORK/wrk-$name.log"
    line=$(printf '%s\n' "$out" | grep '^RESULT' || true)
    [ -n "$line" ] || { log "$name rep $rep: no result (see $WORK/wrk-$name.log)"; line="RESULT rps=0 bps=0 p50_us=0 p99_us=0 requests=0 errors=-1"; }
    # The proxy's own CPU over the run, in ms (0 for direct: nothing between wrk and nginx).
    cpu=$(( (t1 - t0) * 1000 / TICK_HZ ))
    line="$line proxy_cpu_ms=$cpu"
    log "$name rep $rep (cpu gate ${gate}%): ${line#RESULT }"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rep" "$gate" "${line#RESULT }" >>"$RESULTS"
}

run_tls() {      # run_tls NAME direct|capgate SECS REP
    local name=$1 path=$2 d=$3 rep=$4 gate out line
    selected "$name" || return 0
    gate=$(cpu_gate)
    if [ "$path" = direct ]; then
        out=$("$PY" "$HERE/tls_client.py" --connect "127.0.0.1:$NGINX_TLS" \
            --target "tls.local:$NGINX_TLS" --cafile "$WORK/pki/ca.pem" \
            --procs "$TLS_PROCS" --duration "$d" 2>&1) || true
    else
        out=$("$PY" "$HERE/tls_client.py" --proxy "127.0.0.1:$CAPGATE_PORT" \
            --target "tls.local:$NGINX_TLS" --cafile "$CAPGATE_CA" \
            --procs "$TLS_PROCS" --duration "$d" 2>&1) || true
    fi
    printf '%s\n' "$out" >>"$WORK/tls-$name.log"
    line=$(printf '%s\n' "$out" | grep '^RESULT' || true)
    [ -n "$line" ] || { log "$name rep $rep: no result (see $WORK/tls-$name.log)"; line="RESULT rps=0 bps=0 p50_us=0 p99_us=0 requests=0 errors=-1"; }
    log "$name rep $rep (cpu gate ${gate}%): ${line#RESULT }"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rep" "$gate" "${line#RESULT }" >>"$RESULTS"
}

# ---- smoke check: every path answers 200 before anything is measured ---------------------
for p in direct capgate squid tinyproxy haproxy; do
    port=$(proxy_port $p)
    if [ -z "$port" ]; then
        out=$(wrk -t1 -c1 -d1s -s "$HERE/wrk.lua" "http://127.0.0.1:$NGINX_HTTP/1k" 2>&1)
    else
        host=$(origin_host $p)
        out=$(TARGET_URL="http://$host/1k" TARGET_HOST="$host" \
            wrk -t1 -c1 -d1s -s "$HERE/wrk.lua" "http://127.0.0.1:$port" 2>&1)
    fi
    line=$(printf '%s\n' "$out" | grep '^RESULT')
    # tinyproxy closes after every response (wrk counts `read` errors); only status errors count here
    case $line in *" status=0 "*) ;; *) die "smoke check via $p failed: $out" ;; esac
    case $line in *" requests=0 "*) die "smoke check via $p: no request completed: $out" ;; esac
done
for p in direct capgate; do
    if [ $p = direct ]; then
        out=$("$PY" "$HERE/tls_client.py" --connect "127.0.0.1:$NGINX_TLS" --target "tls.local:$NGINX_TLS" \
            --cafile "$WORK/pki/ca.pem" --procs 1 --duration 1 2>&1) || true
    else
        out=$("$PY" "$HERE/tls_client.py" --proxy "127.0.0.1:$CAPGATE_PORT" --target "tls.local:$NGINX_TLS" \
            --cafile "$CAPGATE_CA" --procs 1 --duration 1 2>&1) || true
    fi
    case $out in *"errors=0"*) ;; *) die "TLS smoke check via $p failed: $out" ;; esac
done
log "smoke checks passed; ${REPS} reps, interleaved (rep 1 of everything, then rep 2, ...)"

# ---- the runs --------------------------------------------------------------------------
PATHS=(direct capgate squid tinyproxy haproxy)
for rep in $(seq "$REPS"); do
    for p in "${PATHS[@]}"; do run_wrk "c${CONNS}_1k_$p" "$p" 1k "$CONNS" "$THREADS" "$DURATION" "$rep"; done
    for p in "${PATHS[@]}"; do run_wrk "c${CONNS}_1m_$p" "$p" 1m "$CONNS" "$THREADS" "$DURATION" "$rep"; done
    for p in "${PATHS[@]}"; do run_wrk "c1_1k_$p" "$p" 1k 1 1 "$C1_DURATION" "$rep"; done
    for p in direct capgate; do run_tls "tls_1k_$p" "$p" "$DURATION" "$rep"; done
done

sleep 2
GW_RSS_END=$(rss_kb "$GW_PID")
GW_HWM=$(awk '/^VmHWM:/ {print $2}' "/proc/$GW_PID/status" 2>/dev/null || echo 0)
SQUID_RSS=$(rss_kb "$SQUID_MASTER" $(ps -o pid= --ppid "$SQUID_MASTER" 2>/dev/null || true))
TINY_RSS=$(rss_kb "$TINY_PID" $(ps -o pid= --ppid "$TINY_PID" 2>/dev/null || true))
kill -0 "$GW_PID" 2>/dev/null || die "the gateway died during the runs (see $WORK/capgate/gateway.log)"

# ---- the table ---------------------------------------------------------------------------
"$PY" "$HERE/table.py" "$RESULTS" conns="$CONNS" reps="$REPS" duration="$DURATION" \
    c1_duration="$C1_DURATION" threads="$THREADS" tls_procs="$TLS_PROCS" \
    gw_rss_start="$GW_RSS_START" gw_rss_end="$GW_RSS_END" gw_hwm="$GW_HWM" \
    squid_rss="$SQUID_RSS" tiny_rss="$TINY_RSS"
du -sh "$CAPGATE_HOME/policy.db" 2>/dev/null | awk '{print "capgate audit database after the runs: " $1}'
