#!/bin/sh
# fuzz.sh: runs each libFuzzer harness for a bounded number of executions
# and time, replays the saved regression inputs, and checks the total.
# Usage: tools/fuzz.sh BUILD_DIR RUNS_PER_TARGET SECONDS_PER_TARGET MIN_TOTAL TARGET...
# FUZZ_JOBS=N (default 1) runs N processes per target side by side, each
# with RUNS_PER_TARGET/N executions, sharing the target's corpus: the
# request harness leaves most of a core idle waiting on its service's
# answers, so N of them go faster until the cores are full. Each process
# starts its own service and redis-server on free ports.
set -eu
dir=$1 runs=$2 secs=$3 min_total=$4
shift 4
jobs=${FUZZ_JOBS:-1}
# fuzz_request runs bin/flashsale audit to check the stock books.
FLASHSALE_BIN=${FLASHSALE_BIN:-$(pwd)/bin}
export FLASHSALE_BIN
total=0
for t in "$@"; do
    bin="$dir/fuzz_$t"
    work="$dir/corpus-$t"
    mkdir -p "$work"
    # Crashes found earlier are replayed first: each must pass now.
    if [ -d "tests/fuzz/regress/$t" ] && [ -n "$(ls "tests/fuzz/regress/$t")" ]; then
        "$bin" "tests/fuzz/regress/$t"/* >/dev/null 2>&1 || {
            echo "fuzz: a regression input of $t fails again"; exit 1; }
    fi
    opts=""
    [ -f "tests/fuzz/$t.dict" ] && opts="-dict=tests/fuzz/$t.dict"
    # Per-target libFuzzer flags (fuzz_request: no per-input leak scans; the
    # service keeps caches between inputs, and leaks are checked at exit).
    [ -f "tests/fuzz/$t.options" ] && opts="$opts $(cat "tests/fuzz/$t.options")"
    echo "fuzz: $t: up to $runs runs or ${secs}s, $jobs process(es)"
    pids="" logs="" j=1
    while [ "$j" -le "$jobs" ]; do
        log="$dir/fuzz-$t.log"
        [ "$jobs" -gt 1 ] && log="$dir/fuzz-$t.$j.log"
        # shellcheck disable=SC2086
        "$bin" $opts -runs="$((runs / jobs))" -max_total_time="$secs" \
            -print_final_stats=1 -artifact_prefix="$dir/crash-$t-" \
            "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1 &
        pids="$pids $!" logs="$logs $log" j=$((j + 1))
    done
    # Progress every 30 s; a crash in one process stops the others.
    started=$(date +%s)
    while :; do
        alive=0
        for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 1 ] || break
        sleep 5
        if ls "$dir/crash-$t-"* >/dev/null 2>&1 &&
           [ -n "$(find "$dir" -maxdepth 1 -name "crash-$t-*" -newermt "@$started")" ]; then
            for p in $pids; do kill "$p" 2>/dev/null || true; done
        fi
        if [ $(( ($(date +%s) - started) % 30 )) -lt 5 ]; then
            sofar=0
            for log in $logs; do
                k=$(grep -ao '^#[0-9][0-9]*' "$log" | tail -1 | tr -d '#')
                sofar=$((sofar + ${k:-0}))
            done
            echo "fuzz: $t: $sofar executions after $(( $(date +%s) - started )) s"
        fi
    done
    failed=0
    for p in $pids; do wait "$p" || failed=1; done
    n=0
    for log in $logs; do
        if [ "$failed" = 1 ] && ! grep -q '^stat::number_of_executed_units' "$log"; then
            tail -40 "$log"
        fi
        k=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
        cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
        echo "fuzz: $t: $log: ${k:-0} executions ($cov)"
        n=$((n + ${k:-0}))
    done
    if [ "$failed" = 1 ]; then
        echo "fuzz: $t found a crash; the input is in $dir/crash-$t-*"
        echo "      copy it to tests/fuzz/regress/$t/ once fixed, so it stays fixed"
        exit 1
    fi
    echo "fuzz: $t: $n executions, no crash, no sanitizer report"
    total=$((total + n))
done
echo "fuzz: $total executions in total"
[ "$total" -ge "$min_total" ] || { echo "fuzz: fewer than $min_total executions"; exit 1; }
