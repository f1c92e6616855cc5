#!/usr/bin/env bash
# make soak: the standing reliability suite, in minutes (`make test` runs the
# same kinds of checks in seconds). Prints one summary table, one row per
# check with its key figures and PASS/FAIL (SKIP: not in this tree), and
# exits non-zero if any row FAILs.
#
#   bench/soak.sh               ~8-10 min: a million keys, RL_SOAK=5
#   SOAK_QUICK=1 bench/soak.sh  ~1-2 min: 100,000 keys, RL_SOAK=1 (a try-out)
#
# 1. The million-key soak: Debian's nginx with the module, 2 workers, on a
#    loopback port under a temp prefix (bench/soak/nginx.conf): one zone of
#    64m, one line `rate=100r/m` keyed by X-User. wrk (bench/soak/keys.lua)
#    first sends every key once (the fill: the zone then holds every key),
#    then random keys (1% of them on 10 hot keys, which get 429s) until
#    SOAK_REQUESTS requests in all are done or SOAK_MINUTES have passed.
#    Every SOAK_SAMPLE seconds each worker's RSS (VmRSS, RssAnon, RssShmem of
#    /proc/PID/status; the workers are the master's children) is sampled. Checks: no status but 200 and 429, no
#    socket error; worker RSS flat over the second half of the random phase
#    (growth below SOAK_RSS_GROWTH_KB, once the zone is full: the zone is
#    shared memory, counted in a worker's RSS as it touches its pages, so RSS
#    climbs during the fill and must not after); the same workers at the end
#    (none crashed); the limit still exact afterwards (a fresh key gets
#    exactly its burst of 100); no [alert], [crit] or [emerg] in the error log.
# 2. The integration tests listed in SOAK_TESTS below, with RL_SOAK set (their
#    loops scale with it: tests/reliability.rs runs 30 x RL_SOAK reloads and
#    5 x RL_SOAK kills), each entry a row.
#
# Environment (all optional): SOAK_QUICK, SOAK_MINUTES (bound of the keyed
# load, fill included; default 8, quick 0.5), SOAK_KEYS (1000000; quick
# 100000), SOAK_ZONE (64m; quick 8m), SOAK_REQUESTS (3000000 in all, fill
# included; quick 300000), SOAK_SAMPLE (seconds, 5; quick 0.5),
# SOAK_RSS_GROWTH_KB (2048), SOAK_CONNS (32), SOAK_THREADS (wrk threads, 1),
# RL_SOAK (5; quick 1: the reload storm's time grows faster than its reloads,
# see bench/README.md), SOAK_PARTS ("load tests": either or both),
# SOAK_TEST_TIMEOUT (seconds per test entry, 1200), SOAK_KEEP=1 (keep the temp
# dir with every log; it is kept anyway when something fails), RL_MODULE,
# NGINX, NGINX_BUILD_DIR, CARGO.

set -Euo pipefail
export LC_ALL=C

# The test entries of part 2, one row each: NAME runs `cargo test --test NAME`
# (tests/NAME.rs), NAME:FILTER only its tests whose name contains FILTER.
# An entry whose file is absent, or whose filter matches no test, is a SKIP row.
# Add new reliability tests here.
SOAK_TESTS=(
    reliability:reload_storm_under_load
    reliability:kill_9_workers_under_load
    misbehaving
    redis_late
)

BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
ROOT=$(dirname "$BENCH")
NGINX=${NGINX:-/usr/sbin/nginx}
MODULE=${RL_MODULE:-$ROOT/build/debian/ngx_http_rl_module.so}
CARGO=${CARGO:-cargo}
NGINX_BUILD_DIR=${NGINX_BUILD_DIR:-$ROOT/build/nginx-debian/objs}
case "${SOAK_QUICK:-}" in 0 | no | false) SOAK_QUICK= ;; esac
QUICK=${SOAK_QUICK:-}
if [[ -n $QUICK ]]; then
    MINUTES=${SOAK_MINUTES:-0.5} NKEYS=${SOAK_KEYS:-100000} ZONE=${SOAK_ZONE:-8m}
    TOTAL=${SOAK_REQUESTS:-300000} SAMPLE=${SOAK_SAMPLE:-0.5} FACTOR=${RL_SOAK:-1}
else
    MINUTES=${SOAK_MINUTES:-8} NKEYS=${SOAK_KEYS:-1000000} ZONE=${SOAK_ZONE:-64m}
    TOTAL=${SOAK_REQUESTS:-3000000} SAMPLE=${SOAK_SAMPLE:-5} FACTOR=${RL_SOAK:-5}
fi
LOAD_SECS=$(awk -v m="$MINUTES" 'BEGIN { printf "%d", m * 60 }')
GROWTH_KB=${SOAK_RSS_GROWTH_KB:-2048}
CONNS=${SOAK_CONNS:-32}
THREADS=${SOAK_THREADS:-1}
PARTS=${SOAK_PARTS:-load tests}
TEST_TIMEOUT=${SOAK_TEST_TIMEOUT:-1200}
BURST=100 # the soak line's burst: rate=100r/m, burst defaults to the rate's count

log() { printf '[soak %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
fmt() { sed -E ':a;s/^([0-9]+)([0-9]{3})/\1,\2/;ta' <<<"$1"; }
mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

# ---------------------------------------------------------------- packages
ensure_packages() {
    local need=()
    [[ -x $NGINX ]] || need+=(nginx)
    command -v wrk >/dev/null || need+=(wrk)
    command -v curl >/dev/null || need+=(curl)
    command -v pgrep >/dev/null || need+=(procps)
    ((${#need[@]} == 0)) && return 0
    ((EUID == 0)) || die "missing packages: ${need[*]} (run as root, or apt-get install them)"
    log "installing: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } ||
        die "apt-get install ${need[*]} failed"
}

# ---------------------------------------------------------------- rows
R_CHECK=() R_FIG=() R_RES=()
row() { # check figures PASS|FAIL|SKIP
    R_CHECK+=("$1") R_FIG+=("$2") R_RES+=("$3")
    log "$3  $1: $2"
}

print_table() {
    local i w1=5 w2=7 fails=0
    for i in "${!R_CHECK[@]}"; do
        ((${#R_CHECK[$i]} > w1)) && w1=${#R_CHECK[$i]}
        ((${#R_FIG[$i]} > w2)) && w2=${#R_FIG[$i]}
        [[ ${R_RES[$i]} == FAIL ]] && fails=$((fails + 1))
    done
    echo
    echo "make soak: ${QUICK:+quick mode, }$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), ${SECONDS}s in all"
    printf '| %-*s | %-*s | %-6s |\n' "$w1" check "$w2" figures result
    printf '|-%s-|-%s-|-%s-|\n' "$(printf '%*s' "$w1" '' | tr ' ' -)" "$(printf '%*s' "$w2" '' | tr ' ' -)" "------"
    for i in "${!R_CHECK[@]}"; do
        printf '| %-*s | %-*s | %-6s |\n' "$w1" "${R_CHECK[$i]}" "$w2" "${R_FIG[$i]}" "${R_RES[$i]}"
    done
    echo
    if ((fails)); then
        echo "$fails check(s) FAILED; logs in $TMP"
    elif ((${#R_CHECK[@]} == 0)); then
        echo "no check ran"
        return 1
    else
        echo "all checks passed"
    fi
    ((fails == 0))
}

# ---------------------------------------------------------------- processes
TMP=
MASTER=
WRK_PID=
SAMPLER_PID=
TEST_PID=

cleanup() {
    local rc=$?
    set +e
    trap - ERR
    [[ -n $WRK_PID ]] && kill "$WRK_PID" 2>/dev/null
    [[ -n $SAMPLER_PID ]] && kill "$SAMPLER_PID" 2>/dev/null
    [[ -n $TEST_PID ]] && kill "$TEST_PID" 2>/dev/null
    stop_nginx
    if [[ -n $TMP && -d $TMP ]]; then
        if [[ -n ${SOAK_KEEP:-} || $rc -ne 0 ]]; then
            log "logs kept in $TMP"
        else
            rm -rf "$TMP"
        fi
    fi
    exit "$rc"
}

stop_nginx() {
    [[ -n $MASTER ]] || return 0
    kill -TERM "$MASTER" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$MASTER" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$MASTER" 2>/dev/null
    MASTER=
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# One line per worker: ms-since-T0 phase nginx-requests pid VmRSS RssAnon RssShmem (kB).
# Phases: start (before the load), fill, filled (once the fill is done), random, end.
sample() {
    local t reqs phase pid
    t=$(($(now_ms) - T0))
    phase=$(<"$TMP/phase")
    reqs=$(curl -s -m 5 "http://127.0.0.1:$PORT/status" | awk 'NR == 3 { print $3 }')
    for pid in $(pgrep -P "$MASTER"); do
        awk -v t="$t" -v ph="$phase" -v r="${reqs:--}" -v p="$pid" '
            /^VmRSS:/ { v = $2 } /^RssAnon:/ { a = $2 } /^RssShmem:/ { s = $2 }
            END { if (v != "") printf "%d\t%s\t%s\t%d\t%d\t%d\t%d\n", t, ph, r, p, v, a, s }' \
            "/proc/$pid/status" 2>/dev/null
    done >>"$TMP/rss.tsv"
}

sampler() {
    trap - ERR EXIT
    while :; do
        sample
        [[ -n $QUICK ]] || log "  $(tail -1 "$TMP/rss.tsv" | awk '{ printf "%s: %d requests served, a worker %.1f MB", $2, $3, $5 / 1024 }')"
        sleep "$SAMPLE"
    done
}

# run_wrk MODE SECS LIMIT OUT: keyed load until LIMIT responses (0: none) or
# SECS. wrk runs for its -d whatever its threads do, so each thread that has
# its share of the responses stops and leaves a file, and wrk is then sent
# SIGINT: it stops as at the end of -d and prints its results.
run_wrk() {
    rm -f "$TMP"/wrk-done.*
    wrk -t"$THREADS" -c"$CONNS" -d"$2"s --timeout 10s -s "$BENCH/soak/keys.lua" \
        "http://127.0.0.1:$PORT/soak" -- "$1" "$NKEYS" "$3" "$THREADS" "$TMP/wrk-done" >"$4" 2>&1 &
    WRK_PID=$!
    local rc=0 nd
    while kill -0 "$WRK_PID" 2>/dev/null; do
        nd=$(find "$TMP" -maxdepth 1 -name 'wrk-done.*' | wc -l)
        if ((nd >= THREADS)); then
            kill -INT "$WRK_PID" 2>/dev/null
            break
        fi
        sleep 0.2
    done
    wait "$WRK_PID" || rc=$?
    WRK_PID=
    return "$rc"
}

# RESULT line of a wrk output -> "requests duration_us p50 p99 n200 n429 n5xx nother econn eread ewrite etimeout"
wrk_result() {
    grep '^RESULT ' "$1" | sed 's/[a-z0-9_]*=//g; s/^RESULT //'
}

# ---------------------------------------------------------------- part 1
soak_load() {
    local dir=$TMP/nginx
    mkdir -p "$dir/html" "$dir/tmp"
    echo "hello from the nginx-rl soak" >"$dir/html/soak"
    chmod -R a+rX "$dir"
    local attempt started=
    for attempt in 1 2 3; do
        PORT=$(free_port) || { row "soak: nginx" "no free port" FAIL; return; }
        sed -e "s|@DIR@|$dir|g" -e "s|@PORT@|$PORT|g" -e "s|@MODULE@|$MODULE|g" -e "s|@ZONE@|$ZONE|g" \
            "$BENCH/soak/nginx.conf" >"$dir/nginx.conf"
        if ! "$NGINX" -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log" -t -q >"$dir/test.log" 2>&1; then
            cat "$dir/test.log" >&2
            row "soak: nginx" "nginx -t failed: $(head -1 "$dir/test.log")" FAIL
            return
        fi
        rm -f "$dir/nginx.pid"
        if "$NGINX" -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log" 2>>"$dir/start.log"; then
            started=1
            break
        fi
        log "nginx did not start on port $PORT (attempt $attempt)"
    done
    [[ -n $started ]] || { cat "$dir/start.log" >&2; row "soak: nginx" "nginx does not start (see $dir/start.log)" FAIL; return; }
    local workers0= n=0
    for _ in $(seq 100); do
        [[ -s $dir/nginx.pid ]] && MASTER=$(<"$dir/nginx.pid")
        [[ -n $MASTER ]] && workers0=$(pgrep -P "$MASTER" | sort -n | tr '\n' ' ')
        n=$(wc -w <<<"$workers0")
        ((n >= 2)) && curl -s -o /dev/null "http://127.0.0.1:$PORT/status" && break
        sleep 0.1
    done
    ((n >= 2)) || { row "soak: nginx" "no 2 workers answering on port $PORT" FAIL; return; }
    log "nginx on 127.0.0.1:$PORT, master $MASTER, workers $workers0; zone $ZONE, $(fmt "$NKEYS") keys, up to $(fmt "$TOTAL") requests or ${LOAD_SECS}s"

    : >"$TMP/rss.tsv"
    T0=$(now_ms)
    echo start >"$TMP/phase"
    sample
    sampler &
    SAMPLER_PID=$!
    local deadline=$((SECONDS + LOAD_SECS)) fill_ms0 fill_ms1 rand_ms0 rand_ms1 left
    local -a f=(0 0 0 0 0 0 0 0 0 0 0 0) r=(0 0 0 0 0 0 0 0 0 0 0 0)
    local wrk_fail=
    # Fill: every key once.
    echo fill >"$TMP/phase"
    fill_ms0=$(($(now_ms) - T0))
    log "fill: $(fmt "$NKEYS") keys, one request each"
    run_wrk fill "$LOAD_SECS" 0 "$TMP/wrk-fill.out" || wrk_fail="wrk failed (fill): $(tail -1 "$TMP/wrk-fill.out")"
    fill_ms1=$(($(now_ms) - T0))
    echo filled >"$TMP/phase"
    sample
    local res
    if [[ -z $wrk_fail ]]; then
        res=$(wrk_result "$TMP/wrk-fill.out") && read -r -a f <<<"$res" || wrk_fail="no result from wrk (fill)"
    fi
    # Random keys until TOTAL requests in all, or the deadline.
    local limit=$((TOTAL - f[0]))
    left=$((deadline - SECONDS))
    rand_ms0=$(($(now_ms) - T0))
    if [[ -z $wrk_fail ]] && ((limit > 0 && left > 0)); then
        echo random >"$TMP/phase"
        log "random: $(fmt "$limit") requests over $(fmt "$NKEYS") keys, at most ${left}s"
        run_wrk random "$left" "$limit" "$TMP/wrk-random.out" || wrk_fail="wrk failed (random): $(tail -1 "$TMP/wrk-random.out")"
        if [[ -z $wrk_fail ]]; then
            res=$(wrk_result "$TMP/wrk-random.out") && read -r -a r <<<"$res" || wrk_fail="no result from wrk (random)"
        fi
    fi
    rand_ms1=$(($(now_ms) - T0))
    kill "$SAMPLER_PID" 2>/dev/null
    wait "$SAMPLER_PID" 2>/dev/null
    SAMPLER_PID=
    echo end >"$TMP/phase"
    sample
    local workers1
    workers1=$(pgrep -P "$MASTER" | sort -n | tr '\n' ' ')

    # The limit is still exact: a fresh key gets exactly its burst (sliding
    # windows are aligned to the minute here: W = burst / rate = 60 s; stay
    # clear of a window's edge, where the estimate may admit one more).
    local s
    for _ in $(seq 30); do
        s=$((10#$(date +%S)))
        ((s >= 2 && s <= 50)) && break
        sleep 1
    done
    local check
    check=$(awk -v u="http://127.0.0.1:$PORT/soak" -v n=$((BURST + 10)) 'BEGIN {
        for (i = 1; i <= n; i++) printf "url = \"%s\"\noutput = \"/dev/null\"\n", u }' >"$TMP/check.cfg" &&
        curl -s -H "X-User: soak-check-$$" -K "$TMP/check.cfg" -w '%{http_code}\n' |
        awk '{ c[$1]++; if (NR <= b && $1 != 200) early++ }
             END { printf "%d %d %d %d", c[200], c[429], NR - c[200] - c[429], early }' b=$BURST)
    stop_nginx

    # ---- figures
    local req=$((f[0] + r[0])) n200=$((f[4] + r[4])) n429=$((f[5] + r[5])) nbad=$((f[6] + f[7] + r[6] + r[7]))
    local errs=$((f[8] + f[9] + f[10] + f[11] + r[8] + r[9] + r[10] + r[11]))
    local secs rate p99
    secs=$(awk -v a="${f[1]}" -v b="${r[1]}" 'BEGIN { printf "%.0f", (a + b) / 1e6 }')
    rate=$(awk -v n="$req" -v a="${f[1]}" -v b="${r[1]}" 'BEGIN { printf "%.0f", ((a + b) > 0 ? n / ((a + b) / 1e6) : 0) }')
    p99=$(awk -v a="${f[3]}" -v b="${r[3]}" 'BEGIN { printf "%.1f", (a > b ? a : b) / 1000 }')
    local fig
    fig="$(fmt "$req") requests in ${secs}s ($(fmt "$rate") req/s, p99 ${p99} ms; fill $(fmt "${f[0]}") in $(((fill_ms1 - fill_ms0) / 1000))s, random $(fmt "${r[0]}")); 200: $(fmt "$n200"), 429: $(fmt "$n429"), other: $nbad, socket errors: $errs"
    res=PASS
    if [[ -n $wrk_fail ]]; then
        fig="$wrk_fail; $fig"
        res=FAIL
    elif ((nbad > 0 || errs > 0 || req == 0)); then
        res=FAIL
    elif ((f[0] < NKEYS)); then
        fig="fill incomplete: $(fmt "${f[0]}") of $(fmt "$NKEYS") keys in ${LOAD_SECS}s (raise SOAK_MINUTES); $fig"
        res=FAIL
    fi
    row "soak: $(fmt "$NKEYS") keys, zone $ZONE, load" "$fig" "$res"

    # RSS: per worker, at the start of the load, after the fill, at the end,
    # the max, and the growth over the second half of the random phase (the
    # largest value in it less the first).
    local mid=$(((rand_ms0 + rand_ms1) / 2)) rss
    rss=$(awk -v mid="$mid" -v re="$rand_ms1" -v lim="$GROWTH_KB" '
        { t = $1; p = $4; v = $5; a = $6; s = $7
          if (!(p in first)) { first[p] = v; pids[++np] = p }
          last[p] = v; if (v > mx[p]) mx[p] = v
          if ($2 == "filled") afterfill[p] = v
          if ($2 == "random" && t >= mid) {
              if (!(p in h0)) { h0[p] = v; ha0[p] = a; hs0[p] = s; hn[p] = 0 }
              hn[p]++; if (v - h0[p] > hg[p]) hg[p] = v - h0[p]
              if (a - ha0[p] > hag[p]) hag[p] = a - ha0[p]; if (s - hs0[p] > hsg[p]) hsg[p] = s - hs0[p]
          } }
        END {
            out = ""; worst = 0; worsta = 0; worsts = 0; few = 0
            for (i = 1; i <= np; i++) {
                p = pids[i]
                out = out sprintf("%s%.1f/%.1f/%.1f/%.1f", i > 1 ? ", " : "", first[p] / 1024, afterfill[p] / 1024, last[p] / 1024, mx[p] / 1024)
                if (!(p in hn) || hn[p] < 2) few = 1
                if (hg[p] > worst) worst = hg[p]; if (hag[p] > worsta) worsta = hag[p]; if (hsg[p] > worsts) worsts = hsg[p]
            }
            printf "%d\t%d\t%d\t%d\t%s\n", worst, worsta, worsts, few, out
        }' "$TMP/rss.tsv")
    local worst worsta worsts few per
    IFS=$'\t' read -r worst worsta worsts few per <<<"$rss"
    fig="VmRSS MB per worker start/after fill/end/max: $per; second half +$(mb "$worst") MB (RssAnon +$(mb "$worsta"), RssShmem +$(mb "$worsts")), limit $(mb "$GROWTH_KB") MB"
    res=PASS
    if [[ $workers0 != "$workers1" ]]; then
        fig="workers replaced (crashed?): $workers0-> $workers1; $fig"
        res=FAIL
    elif ((few)); then
        fig="fewer than 2 samples in the second half (run longer or sample more often); $fig"
        res=FAIL
    elif ((worst >= GROWTH_KB)); then
        res=FAIL
    fi
    row "soak: worker RSS flat" "$fig" "$res"

    local c200 c429 cother cearly
    read -r c200 c429 cother cearly <<<"${check:-0 0 0 0}"
    res=PASS
    ((c200 == BURST && c429 == 10 && cother == 0 && cearly == 0)) || res=FAIL
    row "soak: limit exact after" "a fresh key, $((BURST + 10)) requests: $c200 x 200 (burst $BURST), $c429 x 429, $cother other" "$res"

    local nbadlog nsig evict
    nbadlog=$(grep -cE '\[(alert|crit|emerg)\]' "$dir/error.log")
    nsig=$(grep -c 'exited on signal' "$dir/error.log")
    evict=$(grep -o '([0-9]* evicted so far' "$dir/error.log" | tail -1 | tr -dc 0-9)
    res=PASS
    ((nbadlog == 0 && nsig == 0)) || res=FAIL
    row "soak: error log" "[alert]/[crit]/[emerg]: $nbadlog, workers exited on a signal: $nsig, evictions: ${evict:-0} ($(grep -c '\[warn\]' "$dir/error.log") warn lines)" "$res"
    if [[ $res == FAIL ]]; then grep -E '\[(alert|crit|emerg)\]|exited on signal' "$dir/error.log" | head -5 >&2; fi
}

# ---------------------------------------------------------------- part 2
soak_tests() {
    local entry name filter bins=() note
    for entry in "${SOAK_TESTS[@]}"; do
        name=${entry%%:*}
        [[ -f $ROOT/tests/$name.rs && " ${bins[*]:-} " != *" --test $name "* ]] && bins+=(--test "$name")
    done
    # The tests make their nginx prefixes under TMPDIR: a private one, so that
    # nothing else cleaning /tmp (nginx-rl-it-*) pulls them away mid-test, and
    # the prefix a failing test keeps stays with the soak's logs.
    mkdir -p "$TMP/it" && chmod 755 "$TMP/it"
    export NGINX_BUILD_DIR RL_NGINX=$NGINX RL_MODULE=$MODULE RL_SOAK=$FACTOR TMPDIR=$TMP/it
    if ((${#bins[@]})); then
        log "building the tests: ${bins[*]}"
        if ! (cd "$ROOT" && "$CARGO" test --release --no-run "${bins[@]}") >"$TMP/tests-build.log" 2>&1; then
            tail -20 "$TMP/tests-build.log" >&2
            row "tests: build" "cargo test --no-run ${bins[*]} failed (see $TMP/tests-build.log)" FAIL
            return
        fi
    fi
    local t0 rc out summary passed failed secs first
    for entry in "${SOAK_TESTS[@]}"; do
        name=${entry%%:*} filter=
        [[ $entry == *:* ]] && filter=${entry#*:}
        case $entry in
            reliability:reload_storm_under_load) note="$((30 * FACTOR)) reloads, 4 load threads; " ;;
            reliability:kill_9_workers_under_load) note="$((5 * FACTOR)) kill -9, 6 load threads; " ;;
            *) note= ;;
        esac
        if [[ ! -f $ROOT/tests/$name.rs ]]; then
            row "tests: $entry" "tests/$name.rs is not in this tree" SKIP
            continue
        fi
        out=$TMP/test-${entry//[^A-Za-z0-9_]/_}.log
        log "cargo test --test $name${filter:+ -- $filter} (RL_SOAK=$FACTOR)"
        t0=$SECONDS
        (cd "$ROOT" && exec timeout -k 10 "$TEST_TIMEOUT" "$CARGO" test --release --test "$name" -- ${filter:+"$filter"} --test-threads=2) >"$out" 2>&1 &
        TEST_PID=$!
        rc=0
        wait "$TEST_PID" || rc=$?
        TEST_PID=
        secs=$((SECONDS - t0))
        summary=$(grep -E '^test result: ' "$out" | tail -1)
        passed=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$summary")
        failed=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$summary")
        if ((rc == 124 || rc == 137)); then
            row "tests: $entry" "${note}timed out after ${TEST_TIMEOUT}s (see $out)" FAIL
        elif [[ -z $summary ]]; then
            row "tests: $entry" "${note}no test result, exit $rc (see $out)" FAIL
        elif ((rc == 0 && ${passed:-0} + ${failed:-0} == 0)); then
            row "tests: $entry" "no test matches '${filter:-$name}'" SKIP
        elif ((rc == 0)); then
            row "tests: $entry" "${note}RL_SOAK=$FACTOR: $passed passed in ${secs}s" PASS
        else
            first=$(grep -m1 -E "panicked at|assertion" -A1 "$out" | tr '\n' ' ' | cut -c1-160)
            row "tests: $entry" "${note}RL_SOAK=$FACTOR: $passed passed, $failed failed in ${secs}s: $first" FAIL
            grep -E '^---- |panicked at' "$out" | head -10 >&2
        fi
    done
}

# ---------------------------------------------------------------- main
main() {
    ensure_packages
    [[ -f $MODULE ]] || die "module not found: $MODULE (make build-debian)"
    TMP=$(mktemp -d /tmp/nginx-rl-soak.XXXXXX)
    chmod 755 "$TMP"
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    # nginx maps the module: load a private copy, so that a rebuild during the
    # run cannot pull the file from under a running worker.
    cp "$MODULE" "$TMP/ngx_http_rl_module.so"
    MODULE=$TMP/ngx_http_rl_module.so
    log "${QUICK:+quick mode: }keyed load ${LOAD_SECS}s at most, RL_SOAK=$FACTOR; temp dir $TMP"
    [[ " $PARTS " == *" load "* ]] && soak_load
    [[ " $PARTS " == *" tests "* ]] && soak_tests
    print_table
}

main "$@"
