#!/usr/bin/env bash
# hold_markers.sh: Redis memory of the hold-return markers over a long run of
# ended holds: the memory of a long sale must stay bounded.
#
#   loadtest/hold_markers.sh [--holds 1000000] [--max-secs 300] [--keep-ms 5000]
#                            [--flashsale bin/flashsale] [--flashload bin/flashload]
#                            [--conns 64]
#
# Run it from the project root after `make`. It starts its own redis-server
# and one service (on free 127.0.0.1 ports, a SQLite file in a temporary
# directory, --synchronous NORMAL), loads one hold product with flashload
# (holds of 2 s, every buyer cancels: --cancel 1 --pay 0) for --holds orders
# or --max-secs seconds, whichever comes first, and prints Redis's
# used_memory and the markers it holds: before the load, right after every
# hold ended and was given back, and once the forgetting has run (bucket
# 10 s + --returned-keep-ms + the 5 s period, waited for up to 60 s).
# --keep-ms 0: the service is not given --returned-keep-ms (a build from
# before the forgetting, whose markers are kept until a rebuild).
# Everything it started is stopped by PID, also on an interrupt.
set -u
HOLDS=1000000 MAXS=300 KEEP=5000 FS=bin/flashsale FL=bin/flashload CONNS=64
while [ $# -gt 0 ]; do
  case $1 in
    --holds) HOLDS=$2; shift 2 ;;
    --max-secs) MAXS=$2; shift 2 ;;
    --keep-ms) KEEP=$2; shift 2 ;;
    --flashsale) FS=$2; shift 2 ;;
    --flashload) FL=$2; shift 2 ;;
    --conns) CONNS=$2; shift 2 ;;
    *) echo "usage: $0 [--holds N] [--max-secs S] [--keep-ms MS] [--flashsale BIN]" \
            "[--flashload BIN] [--conns N]" >&2; exit 64 ;;
  esac
done

TMP=$(mktemp -d /tmp/hold-markers.XXXXXX)
RPID= SPID=
cleanup() {
  [ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
  [ -n "$RPID" ] && kill "$RPID" 2>/dev/null && wait "$RPID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$TMP" >"$TMP/redis.log" 2>&1 &
RPID=$!
for _ in $(seq 50); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
rcli() { redis-cli -p "$RPORT" "$@"; }

KEEPARG=()
[ "$KEEP" != 0 ] && KEEPARG=(--returned-keep-ms "$KEEP")
"$FS" --listen 127.0.0.1:0 --redis "redis://127.0.0.1:$RPORT/0" --db "$TMP/orders.db" \
  --admin-token t0ken --synchronous NORMAL "${KEEPARG[@]}" >"$TMP/service.log" 2>&1 &
SPID=$!
PORT=
for _ in $(seq 100); do
  PORT=$(sed -n 's/.*listening on .* (port \([0-9]*\)).*/\1/p' "$TMP/service.log")
  [ -n "$PORT" ] && break
  kill -0 "$SPID" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$PORT" ]; then echo "the service did not start:" >&2; cat "$TMP/service.log" >&2; exit 2; fi
URL=http://127.0.0.1:$PORT
SKU=hm-$$

used() { rcli INFO memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p' | tr -d '\r'; }
# "<bucket keys> keys, <fields> markers" (time buckets and the legacy hash).
markers() {
  local keys=0 fields=0 k
  while read -r k; do
    [ -z "$k" ] && continue
    case $k in *:before) continue ;; esac
    keys=$((keys + 1)); fields=$((fields + $(rcli HLEN "$k")))
  done < <(rcli --scan --pattern "fs:{$SKU}:returned*")
  echo "$keys keys, $fields markers"
}
report() { printf '%-34s used_memory %10s B (%6.1f MB); %s\n' "$1" "$(used)" \
             "$(echo "$(used) / 1048576" | bc -l)" "$(markers)"; }

report "before the load"
START=$(date +%s)
timeout $((MAXS + 120)) "$FL" --target "$URL" --sku "$SKU" --stock $((HOLDS * 2)) \
  --hold-seconds 2 --pay 0 --cancel 1 --users 100000 --connections "$CONNS" \
  --requests "$HOLDS" --duration "$MAXS" --admin-token t0ken --no-verify --quiet \
  --json "$TMP/run.json" >"$TMP/flashload.out" 2>&1
echo "flashload exit $? after $(( $(date +%s) - START )) s: $(grep -E '^(requests|holds|cancel) ' "$TMP/flashload.out" | tr -s ' ' | paste -sd';')"

# Every hold ended and its debt cleared (bounded: two minutes).
q() { sqlite3 -cmd '.timeout 5000' "$TMP/orders.db" "$1"; }
for _ in $(seq 240); do
  [ "$(q "SELECT count(*) FROM holds WHERE state='reserved' OR return_gen IS NOT NULL")" = 0 ] && break
  sleep 0.5
done
ENDED=$(q "SELECT count(*) FROM holds WHERE state IN ('cancelled','expired')")
echo "ended holds: $ENDED; books: $(curl -s "$URL/v1/products/$SKU" | jq -c '{stock_initial,stock_available,held,sold}'); redis stock $(rcli GET "fs:{$SKU}:stock:0")"
report "right after"
if [ "$KEEP" != 0 ]; then
  LAST=$(q "SELECT max(decided_ms) FROM holds")
  for _ in $(seq 120); do
    W=$(rcli GET "fs:{$SKU}:returned:before"); W=${W:-0}
    [ "$W" -gt "$LAST" ] && [ "$(markers)" = "0 keys, 0 markers" ] && break
    sleep 0.5
  done
  echo "watermark $W ms, last decision $LAST ms"
  report "after the forgetting"
else
  sleep 25
  report "25 s later (markers kept)"
fi
