#!/usr/bin/env bash
# overload.sh: the overload run (docs/performance.md, "Past capacity"), for the service and,
# when ../shared/peers is there, the same run against the OpenResty-style
# peer.
#
#   loadtest/overload.sh [--conns 2000] [--dur 10] [--cap-conns 256] [--cap-dur 6]
#                        [--factors "2"] [--reps 1] [--flashsale bin/flashsale]
#                        [--no-peer] [--cpu-quota Q] [--capacity N] [-- ARGS]
#
# Run it from the project root after `make`. For each target (the service,
# then the peer with 2 nginx workers) and each repetition:
#   1. capacity: flashload closed loop, --cap-conns connections, --cap-dur
#      seconds, 201s per second (the service with its admission limit off,
#      --max-inflight 1000000, so that nothing is shed while measuring);
#   2. overload: flashload --rate at twice that capacity (or each of
#      --factors times it: "0.5 1 1.5 2 3" draws goodput against offered
#      load) over --conns
#      connections for --dur seconds, verified against Redis and SQLite
#      for the service (the peer stores no orders: not verified). A fresh
#      service (ARGS after --, e.g. --max-inflight 256) and a fresh SKU of
#      10^9 units for each.
# --capacity N skips step 1 for the service and takes N orders/s as its
# capacity: two builds or settings then meet the same offered rates (an A/B
# whose capacities came out apart compares different loads).
# Then one line per run with goodput (201s within 250 ms) as a share of
# the capacity, answers later than 1 s, the shed, p99, and the backlog.
# Everything listens on free 127.0.0.1 ports and is stopped by PID.
#
# --cpu-quota Q (root): the service (and the peer's nginx) runs alone in a
# cgroup of its own with a CPU quota of Q CPUs (v1 cpu.cfs_quota_us over a
# 100 ms period, or v2 cpu.max), pinned to the last CPU; Redis and the load
# generator are pinned to the others, so the generator can offer more than
# the service may use. Capacity is measured under the same quota. The
# group is removed at the end.
set -u
CONNS=2000 DUR=10 CAPC=256 CAPD=6 REPS=1 BIN=bin/flashsale PEER=1 SARGS=() FACTORS=2 QUOTA= FIXCAP=
while [ $# -gt 0 ]; do
  case $1 in
    --conns) CONNS=$2; shift 2 ;;
    --dur) DUR=$2; shift 2 ;;
    --cap-conns) CAPC=$2; shift 2 ;;
    --cap-dur) CAPD=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --factors) FACTORS=$2; shift 2 ;;
    --flashsale) BIN=$2; shift 2 ;;
    --no-peer) PEER=0; shift ;;
    --cpu-quota) QUOTA=$2; shift 2 ;;
    --capacity) FIXCAP=$2; shift 2 ;;
    --) shift; SARGS=("$@"); break ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
PEERS=$(cd "$(dirname "$0")/../.." && pwd)/shared/peers      # ../shared/peers of the root
[ -d "$PEERS" ] || PEER=0
LOAD=$(dirname "$BIN")/flashload
for t in redis-server redis-cli curl python3 "$BIN" "$LOAD"; do
  command -v "$t" >/dev/null || { echo "missing $t" >&2; exit 2; }
done
# The quota's cgroup, and the CPUs of each side (SVC_ON / LOAD_ON run a
# command on the service's or the load's side).
CG= SVC_ON=() LOAD_ON=()
if [ -n "$QUOTA" ]; then
  [ "$(id -u)" = 0 ] || { echo "--cpu-quota needs root (a cgroup of its own)" >&2; exit 2; }
  command -v taskset >/dev/null || { echo "missing taskset (util-linux)" >&2; exit 2; }
  US=$(python3 -c "q=float('$QUOTA'); assert 0 < q <= 64; print(int(q * 100000))") ||
    { echo "--cpu-quota: a number of CPUs, such as 0.5" >&2; exit 2; }
  N=$(nproc); LAST=$((N - 1))
  if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    CG=/sys/fs/cgroup/cpu/flashsale-overload.$$
    mkdir "$CG" && echo 100000 >"$CG/cpu.cfs_period_us" && echo "$US" >"$CG/cpu.cfs_quota_us" ||
      { echo "cannot make $CG" >&2; exit 2; }
  elif grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    CG=/sys/fs/cgroup/flashsale-overload.$$
    mkdir "$CG" && echo "$US 100000" >"$CG/cpu.max" || { echo "cannot make $CG" >&2; exit 2; }
  else
    echo "--cpu-quota: no cgroup cpu controller mounted" >&2; exit 2
  fi
  SVC_ON=(bash -c 'echo $$ >"$0/cgroup.procs" && exec taskset -c "$1" "${@:2}"' "$CG" "$LAST")
  [ "$N" -gt 1 ] && LOAD_ON=(taskset -c "0-$((N - 2))")
  echo "overload: the service in $CG: a quota of $QUOTA CPUs, on CPU $LAST; Redis and the" \
       "load on CPUs ${LOAD_ON[2]:-$LAST}" >&2
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/overload.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done
  sleep 0.3
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  rm -rf "$TMP"
  if [ -n "$CG" ]; then
    for _ in $(seq 50); do rmdir "$CG" 2>/dev/null && break; sleep 0.1; done
  fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

RP=$(free_port)
"${LOAD_ON[@]}" redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" \
  --daemonize no >"$TMP/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done

SVC_PID= SP=
# start_service ARGS...: a fresh flashsale on a fresh database
start_service() {
  [ -n "$SVC_PID" ] && { kill "$SVC_PID"; wait "$SVC_PID" 2>/dev/null; }
  rm -f "$TMP"/orders.db*
  SP=$(free_port)
  "${SVC_ON[@]}" "$BIN" --listen "127.0.0.1:$SP" --redis "redis://127.0.0.1:$RP/0" --db "$TMP/orders.db" "$@" \
    >>"$TMP/svc.log" 2>&1 &
  SVC_PID=$!
  PIDS+=($SVC_PID)
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$SP/healthz" && break; sleep 0.1; done
}

# load NAME URL CONNS SECS [RATE] [flashload args...] -> the JSON in $TMP/NAME.json
load() {
  local name=$1 url=$2 conns=$3 secs=$4 rate=$5; shift 5
  local r=(); [ "$rate" != 0 ] && r=(--rate "$rate")
  "${LOAD_ON[@]}" "$LOAD" --target "$url" --connections "$conns" --duration "$secs" "${r[@]}" \
    --users 100000 --quiet --json "$TMP/$name.json" "$@" >"$TMP/$name.out" 2>&1
}

# created/s of a run's JSON
rate_of() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(int(j["created"]/j["seconds"]))' "$1"; }

# line NAME CAPACITY OFFERED: the summary of an overload run
line() {
  python3 - "$TMP/$1.json" "$2" "$1" "$3" <<'PY'
import json, sys
j, cap, name, offered = json.load(open(sys.argv[1])), float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
g = j["goodput"]["per_second"]
v = j.get("verdict")
print("%-16s capacity %6.0f/s  offered %6.0f/s (x%.1f)  goodput %6.0f/s = %.2f of capacity  "
      "201 %d  shed %d  late>1s %d  p99 %.0f ms  backlog %d  transport errors %d  %s"
      % (name, cap, offered, offered / cap, g, g / cap, j["created"], j.get("shed", 0), j["late"]["answers"],
         j["latency_us"]["p99"] / 1000, j["backlog"], j["transport_errors"],
         "verifier " + ("PASS" if v["pass"] else "FAIL") if v else "(not verified)"))
PY
}

for rep in $(seq "$REPS"); do
  if [ -n "${FIXCAP:-}" ]; then
    CAP=$FIXCAP
  else
    start_service --max-inflight 1000000
    load cap-svc-$rep "http://127.0.0.1:$SP" "$CAPC" "$CAPD" 0 --stock 1000000000 --no-verify
    CAP=$(rate_of "$TMP/cap-svc-$rep.json")
  fi
  for f in $FACTORS; do
    R=$(python3 -c "print(int($f * $CAP))")
    start_service "${SARGS[@]}"
    load ovl-svc-$rep-$f "http://127.0.0.1:$SP" "$CONNS" "$DUR" "$R" --stock 1000000000 \
      --redis "redis://127.0.0.1:$RP/0" --db "$TMP/orders.db"
    line ovl-svc-$rep-$f "$CAP" "$R"
  done
  if [ "$PEER" = 1 ]; then
    export PEERS_RUN=$TMP/peers
    if [ -z "${PEER_PORT:-}" ]; then
      PEER_PORT=$(free_port)
      "${SVC_ON[@]}" "$PEERS/nginx-lua/start.sh" "$RP" "$PEER_PORT" 2 >/dev/null || { echo "peer did not start" >&2; exit 1; }
      PIDS+=($(cat "$PEERS_RUN/nginx-lua-$PEER_PORT/nginx.pid"))
    fi
    redis-cli -p "$RP" SET "peer:stock:ovl-cap-$rep" 1000000000 >/dev/null
    load cap-peer-$rep "http://127.0.0.1:$PEER_PORT" "$CAPC" "$CAPD" 0 --no-create \
      --sku "ovl-cap-$rep" --no-verify
    PCAP=$(rate_of "$TMP/cap-peer-$rep.json")
    for f in $FACTORS; do
      R=$(python3 -c "print(int($f * $PCAP))")
      redis-cli -p "$RP" SET "peer:stock:ovl-$rep-$f" 1000000000 >/dev/null
      load ovl-peer-$rep-$f "http://127.0.0.1:$PEER_PORT" "$CONNS" "$DUR" "$R" --no-create \
        --sku "ovl-$rep-$f" --no-verify
      line ovl-peer-$rep-$f "$PCAP" "$R"
    done
  fi
done
