#!/bin/sh
# fuzz.sh: runs each libFuzzer harness for a bounded number of executions
# and time, replays the saved regression inputs, and checks the total.
# Usage: tools/fuzz.sh BUILD_DIR RUNS_PER_TARGET SECONDS_PER_TARGET MIN_TOTAL TARGET...
set -eu
dir=$1 runs=$2 secs=$3 min_total=$4
shift 4
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
    log="$dir/fuzz-$t.log"
    dict=""
    [ -f "tests/fuzz/$t.dict" ] && dict="-dict=tests/fuzz/$t.dict"
    # Per-target libFuzzer flags (fuzz_request: no per-input leak scans; the
    # service keeps caches between inputs, and leaks are checked at exit).
    [ -f "tests/fuzz/$t.options" ] && dict="$dict $(cat "tests/fuzz/$t.options")"
    echo "fuzz: $t: up to $runs runs or ${secs}s"
    # shellcheck disable=SC2086
    if ! "$bin" $dict -runs="$runs" \
            -max_total_time="$secs" -print_final_stats=1 \
            -artifact_prefix="$dir/crash-$t-" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
        tail -40 "$log"
        echo "fuzz: $t found a crash; the input is in $dir/crash-$t-*"
        echo "      copy it to tests/fuzz/regress/$t/ once fixed, so it stays fixed"
        exit 1
    fi
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
    echo "fuzz: $t: $n executions ($cov), no crash, no sanitizer report"
    total=$((total + n))
done
echo "fuzz: $total executions in total"
[ "$total" -ge "$min_total" ] || { echo "fuzz: fewer than $min_total executions"; exit 1; }
