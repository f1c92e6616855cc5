#!/usr/bin/env bash
# The `make bench` row for a metrics scrape (issue #17): what one rl_metrics
# scrape of 100 shared-memory zones and 1,000 rl_limit lines costs, and
# whether requests served meanwhile are slowed. run.sh runs it after its
# rounds and puts the section it writes into the report; alone:
#
#   bench/scrape.sh            the full measurement (about a minute)
#   QUICK=1 bench/scrape.sh    smoke test: 1 round of 1 s, a few seconds
#   bench/scrape.sh --render RAW   the section again, from SCRAPE_RAW's file
#
# One nginx (Debian's, one worker pinned to CPU 0 as every bench nginx) with
# conf/scrape.conf and the zones and locations generated below. First
# traffic on every location, so that zones hold keys and the counters have
# passes, rejections and dry-run rejections. Then:
#  1. SCRAPE_N scrapes one after the other (curl on CPU 1, one keep-alive
#     connection, the server otherwise idle), in the Prometheus format and
#     in JSON: latency (curl's time_total), the worker's CPU time per
#     scrape, the size and the series;
#  2. wrk on /admit (one key, gcra; -t1 -c32 on CPU 1, as run.sh), without
#     scrapes and with a scraper on CPU 1 fetching /metrics at SCRAPE_RATE
#     a second (curl --rate, one keep-alive connection) for the whole run,
#     in interleaved rounds in a fresh random order: req/s, p99, and the
#     worker's CPU time per /admit request (scrapes included).
#
# Environment (all optional): RL_MODULE, NGINX, QUICK, SCRAPE_ROUNDS,
# SCRAPE_SECS, SCRAPE_WARM, SCRAPE_RATE (scrapes a second during wrk),
# SCRAPE_N (sequential scrapes), SCRAPE_OUT (the report section, default
# stdout), SCRAPE_RAW (a copy of the raw measurements), SCRAPE_KEEP=1 (keep
# the temp dir). Exits non-zero if anything is broken (nginx does not start
# or its worker dies, /admit answers anything but 200, a scrape anything but
# 200, the scrape does not show the 1,000 lines and 100 zones).

set -Eeuo pipefail
export LC_ALL=C

BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
ROOT=$(dirname "$BENCH")
NGINX=${NGINX:-/usr/sbin/nginx}
# nginx reads an environment variable NGINX as sockets inherited from an
# old binary, and then stays in the foreground: keep ours out of its way.
export -n NGINX
MODULE_SRC=${RL_MODULE:-$ROOT/build/debian/ngx_http_rl_module.so}
case "${QUICK:-}" in 0 | no | false) QUICK= ;; esac
QUICK=${QUICK:-}
if [[ -n $QUICK ]]; then
    ROUNDS=${SCRAPE_ROUNDS:-1} SECS=${SCRAPE_SECS:-1} WARM=${SCRAPE_WARM:-0} N=${SCRAPE_N:-20} NKEYS=4
else
    ROUNDS=${SCRAPE_ROUNDS:-5} SECS=${SCRAPE_SECS:-5} WARM=${SCRAPE_WARM:-1} N=${SCRAPE_N:-200} NKEYS=20
fi
RATE=${SCRAPE_RATE:-10}
OUT=${SCRAPE_OUT:-/dev/stdout}
NZONES=100
PER_ZONE=10
PER_KEY=4 # requests per key and location in the first traffic: the 4th meets burst=3
NGX_CPU=0    # must match worker_cpu_affinity in conf/common.inc
CLIENT_CPU=1 # wrk, curl

# ---------------------------------------------------------------- the report section
# render RAW: the section, from the raw measurements.
render() {
    awk -F'\t' -v nz="$NZONES" -v per="$PER_ZONE" '
function sortv(a, n,    i, j, t) { for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t } }
function med(a, n) { sortv(a, n); return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
# nearest rank
function p99(a, n,    k) { sortv(a, n); k = int(0.99 * n); if (k < 0.99 * n) k++; if (k < 1) k = 1; return a[k] }
function commas(x,    r) {
    x = sprintf("%.0f", x); r = ""
    while (length(x) > 3) { r = "," substr(x, length(x) - 2) r; x = substr(x, 1, length(x) - 3) }
    return x r
}
$1 == "meta" { meta[$2] = $3; next }
$1 == "fail" { fails = fails "\n- **FAIL: " $2 "**"; next }
$1 == "scrape" && $2 == "idle" { f = $3; n = ++ni[f]; it[f, n] = $5 * 1000; ib[f] = $6; next }
$1 == "scrape" && $2 == "load" && $3 != "warm" { n = ++nl; lt[n] = $5 * 1000; next }
$1 == "cpu" { icpu[$3] = $5 / $4 / 1000; next }
$1 == "wrk" && $2 != "warm" {
    c = $3; n = ++nr[c]
    rps[c, n] = $5 / ($6 / 1e6); lat[c, n] = $8 / 1000; cpu[c, n] = $17 / $5 / 1000; busy[c, n] = 100 * $17 / ($6 * 1000)
    req[c] += $5; ns[c] += $17; nscr[c] += $18; secs[c] += $4
    R[c, $2] = rps[c, n]; C[c, $2] = cpu[c, n]
    next
}
END {
    print "## A metrics scrape: " nz " zones, " commas(nz * per) " lines"
    print ""
    print "`bench/scrape.sh` (issue #17): one nginx worker on CPU 0 with " nz " shared-memory zones and " commas(nz * per) " `rl_limit` lines"
    print "(`conf/scrape.conf`: " per " a zone, a rate each, every algorithm, half of them named), after " commas(meta["fill_n"]) " requests on"
    print "their locations (" meta["nkeys"] " keys a location, " meta["per_key"] " requests a key; " meta["fill"] "): the zones hold " commas(meta["keys"]) " states, the"
    print "counters show " commas(meta["rejected"]) " rejections and " commas(meta["dry_rejected"]) " dry-run rejections. A scrape has " commas(meta["series"]) " series (" commas(meta["lines"]) " lines, " meta["zones"] " zones)."
    print ""
    print "One scrape at a time: " meta["n"] " in a row, curl on CPU 1 over one keep-alive connection, nothing else asked of the"
    print "server. Latency: curl\047s `time_total`. Worker CPU: the worker\047s CPU time over the " meta["n"] " scrapes, per scrape."
    print ""
    print "| format | latency median | p99 | min | worker CPU a scrape | bytes |"
    print "|---|--:|--:|--:|--:|--:|"
    split("prometheus json", fm, " ")
    for (i = 1; i <= 2; i++) {
        f = fm[i]; n = ni[f]
        if (!n) continue
        for (k = 1; k <= n; k++) a[k] = it[f, k]
        m = med(a, n)
        printf "| %s | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %s |\n", (f == "json" ? "JSON (`?format=json`)" : "Prometheus text"), m, p99(a, n), a[1], icpu[f] / 1000, commas(ib[f])
    }
    print ""
    rate = meta["rate"]
    print "`/admit` (one key, `gcra`) under wrk -t1 -c32 on CPU 1 for " meta["secs"] " s, without scrapes and with a scraper fetching"
    print "`/metrics` " rate " times a second for the whole run (curl `--rate " rate "/s` on CPU 1, one keep-alive connection), in " meta["rounds"]
    print "interleaved round(s), each in a fresh random order. req/s, p99 and CPU: medians over the rounds; CPU: the worker\047s CPU time"
    print "(the scrapes\047 included) per `/admit` request; worker busy: its CPU time over the run\047s wall time."
    print ""
    print "| `/admit` | req/s | min - max | p99 | worker CPU us/req | worker busy | scrapes |"
    print "|---|--:|--:|--:|--:|--:|--:|"
    split("none scrape", cs, " ")
    for (i = 1; i <= 2; i++) {
        c = cs[i]; n = nr[c]
        if (!n) continue
        for (k = 1; k <= n; k++) { a[k] = rps[c, k]; b[k] = lat[c, k]; d[k] = cpu[c, k]; e[k] = busy[c, k] }
        M[c] = med(a, n); lo = a[1]; hi = a[n]; MC[c] = med(d, n); MB[c] = med(e, n)
        printf "| %s | %s | %s - %s | %.2f ms | %.2f | %.0f%% | %s |\n", (c == "none" ? "without scrapes" : "scraped " rate " times a second"),
            commas(M[c]), commas(lo), commas(hi), med(b, n), MC[c], med(e, n), (c == "none" ? "-" : commas(nscr[c]) sprintf(" (%.1f/s)", nscr[c] / secs[c]))
    }
    print ""
    if (nr["none"] && nr["scrape"]) {
        # Per round: the two runs of a round ran back to back.
        np = 0
        for (r = 1; r <= meta["rounds"]; r++) if ((("none", r) in R) && (("scrape", r) in R)) { np++; pr[np] = R["scrape", r] / R["none", r]; pc[np] = C["scrape", r] - C["none", r] }
        sortv(pr, np); sortv(pc, np)
        # What the scrapes would add at their CPU cost one at a time, spread over the requests.
        expc = (req["scrape"] > 0) ? nscr["scrape"] * icpu["prometheus"] / req["scrape"] : 0
        printf "req/s while scraping / req/s without: **%.3fx** (per round %.3f - %.3f). Worker CPU added per request: **%+.2f us**\n", M["scrape"] / M["none"], pr[1], pr[np], MC["scrape"] - MC["none"]
        printf "(per round %+.2f - %+.2f; the scrapes at their CPU time one at a time, spread over the requests: %+.2f us).\n", pc[1], pc[np], expc
        if (nl) {
            for (k = 1; k <= nl; k++) a[k] = lt[k]
            printf "A scrape under that load took %.2f ms (median; p99 %.2f ms; %d scrapes).\n", med(a, nl), p99(a, nl), nl
        }
        print ""
        # As report.awk: req/s says little of nginx when its worker was not saturated.
        if (MB["none"] < 90 || MB["scrape"] < 90)
            printf "**The req/s ratio is inconclusive**: the worker was %.0f%% / %.0f%% busy, the machine\047s other load, not nginx,\nset the pace; the CPU figures are the ones to trust.\n\n", MB["none"], MB["scrape"]
    }
    print "Load average " meta["load0"] " at the start, " meta["load"] " at the end (" meta["elapsed"] " s)."
    print ""
    if (meta["quick"] != "") print "QUICK run: one round of " meta["secs"] " s and " meta["n"] " scrapes in a row, indicative only.\n"
    if (fails != "") print "Broken:" fails "\n"
}' "$1"
}

log() { printf '[scrape %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
if [[ ${1:-} == --render ]]; then
    render "${2:?--render RAW}"
    exit
fi
for c in wrk curl taskset; do command -v "$c" >/dev/null || die "$c is missing (bench/run.sh installs it)"; done
[[ -f $MODULE_SRC ]] || die "module not found: $MODULE_SRC (make build-debian)"

TMP=$(mktemp -d /tmp/nginx-rl-scrape.XXXXXX)
chmod 755 "$TMP"
MASTER= WRK_PID= SCR_PID=
cleanup() {
    local rc=$?
    set +e
    trap - ERR
    [[ -n $WRK_PID ]] && kill "$WRK_PID" 2>/dev/null
    [[ -n $SCR_PID ]] && kill "$SCR_PID" 2>/dev/null
    if [[ -n $MASTER ]]; then
        kill -TERM "$MASTER" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$MASTER" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$MASTER" 2>/dev/null
    fi
    if [[ -n ${SCRAPE_KEEP:-} || $rc -ne 0 ]]; then log "files kept in $TMP"; else rm -rf "$TMP"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'log "failed at line $LINENO: $BASH_COMMAND"' ERR

# nginx maps the module: a private copy, as run.sh loads.
cp "$MODULE_SRC" "$TMP/ngx_http_rl_module.so"
MODULE=$TMP/ngx_http_rl_module.so

# ---------------------------------------------------------------- configuration
# Zone zN's line j: every algorithm across the lines, a rate of its own
# (N * 10 + j a minute), key $arg_k; the lines of even j named. Line 1 has
# burst=3 (the 4th request of a key is rejected), line 2 is a dry run with
# burst=2; the others are not reached by the first traffic.
gen_conf() {
    local dir=$1
    awk -v nz="$NZONES" -v per="$PER_ZONE" -v zones="$dir/zones.inc" -v locs="$dir/locations.inc" 'BEGIN {
        split("fixed sliding sliding_log token_bucket leaky_bucket gcra", alg, " ")
        for (z = 1; z <= nz; z++) {
            print "rl_zone z" z " size=128k;" > zones
            printf "location = /z%d {\n", z > locs
            for (j = 1; j <= per; j++) {
                if (z == 1 && j == per) continue # z1 line 10 is in /admit (scrape.conf)
                burst = (j == 1) ? 3 : (j == 2) ? 2 : 10 + j
                printf "    rl_limit zone=z%d key=$arg_k rate=%dr/m burst=%d algorithm=%s%s%s;\n", z, z * 10 + j, burst,
                    alg[(z + j) % 6 + 1], (j % 2 == 0) ? " name=z" z "_l" j : "", (j == 2) ? " dry_run" : "" > locs
            }
            print "}" > locs
        }
    }'
}

DIR=$TMP/nginx
PORT=
start_nginx() {
    local pid= w=
    PORT=$(free_port) && [[ -n $PORT ]] || die "no free port"
    mkdir -p "$DIR/tmp" "$TMP/html"
    local f
    for f in common.inc http.inc scrape.conf; do
        sed -e "s|@DIR@|$DIR|g" -e "s|@HTML@|$TMP/html|g" -e "s|@PORT@|$PORT|g" -e "s|@MODULE@|$MODULE|g" \
            "$BENCH/conf/$f" >"$DIR/${f/scrape.conf/nginx.conf}"
    done
    gen_conf "$DIR"
    echo "hello from the nginx-rl bench" >"$TMP/html/admit"
    echo "hello from the nginx-rl bench" >"$TMP/html/index.html"
    for ((z = 1; z <= NZONES; z++)); do echo "hello from the nginx-rl bench" >"$TMP/html/z$z"; done
    "$NGINX" -p "$DIR/" -c "$DIR/nginx.conf" -e "$DIR/error.log" -t -q >"$DIR/test.log" 2>&1 ||
        { cat "$DIR/test.log" >&2; die "nginx -t failed for conf/scrape.conf"; }
    "$NGINX" -p "$DIR/" -c "$DIR/nginx.conf" -e "$DIR/error.log" ||
        { cat "$DIR/error.log" >&2; die "nginx failed to start"; }
    for _ in $(seq 100); do
        [[ -s $DIR/nginx.pid ]] && pid=$(<"$DIR/nginx.pid")
        [[ -n $pid ]] && w=$(pgrep -P "$pid" | head -1 || true)
        [[ -n $w ]] && break
        sleep 0.05
    done
    [[ -n $w ]] || { cat "$DIR/error.log" >&2; die "nginx has no worker"; }
    MASTER=$pid WORKER=$w
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$PORT/" && return 0
        sleep 0.05
    done
    die "nginx does not answer on port $PORT"
}

worker_alive() {
    kill -0 "$WORKER" 2>/dev/null && [[ $(pgrep -P "$MASTER" | head -1) == "$WORKER" ]] ||
        die "the nginx worker died or was replaced (crashed?), see $DIR/error.log"
}

# scrapes CFG N URL: a curl config of N fetches of URL, one connection.
scrapes() {
    awk -v n="$2" -v u="$3" 'BEGIN { for (i = 0; i < n; i++) printf "url = \"%s\"\noutput = \"/dev/null\"\n", u }' >"$1"
}
CURL_W='%{http_code}\t%{time_total}\t%{size_download}\n'

FAILED=0
fail() { FAILED=1; log "FAIL: $*"; printf 'fail\t%s\n' "$*" >>"$RAW"; }
RAW=$TMP/raw.tsv
: >"$RAW"

# ---------------------------------------------------------------- run
start_s=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
start_nginx
log "nginx on 127.0.0.1:$PORT, worker $WORKER on CPU $(taskset -pc "$WORKER" | awk '{print $NF}'): $NZONES zones, $((NZONES * PER_ZONE)) lines"

# The first traffic: each location, NKEYS keys, PER_KEY requests a key in a row.
awk -v u="http://127.0.0.1:$PORT" -v nz="$NZONES" -v nk="$NKEYS" -v pk="$PER_KEY" 'BEGIN {
    for (z = 1; z <= nz; z++) for (k = 1; k <= nk; k++) for (r = 0; r < pk; r++)
        printf "url = \"%s/z%d?k=k%d\"\noutput = \"/dev/null\"\n", u, z, k
}' >"$TMP/fill.cfg"
fill=$(curl -s -K "$TMP/fill.cfg" -w '%{http_code}\n' | sort | uniq -c | awk '{ printf "%s%s x %s", sep, $1, $2; sep = ", " }')
log "first traffic: $fill"
printf 'meta\tfill\t%s\nmeta\tfill_n\t%s\n' "$fill" "$((NZONES * NKEYS * PER_KEY))" >>"$RAW"
[[ $fill =~ ^[0-9]+\ x\ 200,\ [0-9]+\ x\ 429$ ]] || fail "first traffic answered $fill (200s and 429s expected)"
taskset -c "$CLIENT_CPU" curl -s "http://127.0.0.1:$PORT/metrics" -o "$TMP/metrics.txt" || die "no answer from /metrics"
taskset -c "$CLIENT_CPU" curl -s "http://127.0.0.1:$PORT/metrics?format=json" -o "$TMP/metrics.json" || die "no answer from /metrics?format=json"
# What a scrape holds: series (sample lines), distinct lines and zones, the keys held, rejections counted.
read -r series lines zones keys rejected dryrej < <(awk '
    /^#/ || NF == 0 { next }
    { n++ }
    /^nginx_rl_requests_total\{/ { match($0, /line="[^"]*"/); l[substr($0, RSTART, RLENGTH)] = 1 }
    /^nginx_rl_requests_total\{.*result="rejected"/ { rej += $NF }
    /^nginx_rl_requests_total\{.*result="dry_run_rejected"/ { dry += $NF }
    /^nginx_rl_zone_keys\{/ { z++; k += $NF }
    END { for (x in l) nl++; print n + 0, nl + 0, z + 0, k + 0, rej + 0, dry + 0 }' "$TMP/metrics.txt")
log "a scrape: $(wc -c <"$TMP/metrics.txt") bytes, $series series, $lines lines, $zones zones, $keys keys held, $rejected rejected, $dryrej dry-run rejected"
printf 'meta\tseries\t%s\nmeta\tlines\t%s\nmeta\tzones\t%s\nmeta\tkeys\t%s\nmeta\trejected\t%s\nmeta\tdry_rejected\t%s\n' \
    "$series" "$lines" "$zones" "$keys" "$rejected" "$dryrej" >>"$RAW"
((lines == NZONES * PER_ZONE)) || fail "the scrape shows $lines lines, not $((NZONES * PER_ZONE))"
((zones == NZONES)) || fail "the scrape shows $zones zones, not $NZONES"
((keys > 0 && rejected > 0 && dryrej > 0)) || fail "the counters are empty ($keys keys, $rejected rejected, $dryrej dry-run rejected)"

# 1. Scrapes one after the other, the server otherwise idle.
for fmt in prometheus json; do
    url="http://127.0.0.1:$PORT/metrics"
    [[ $fmt == json ]] && url="$url?format=json"
    scrapes "$TMP/seq.cfg" "$N" "$url"
    worker_alive
    c0=$(cpu_ns "$WORKER")
    taskset -c "$CLIENT_CPU" curl -s -K "$TMP/seq.cfg" -w "$CURL_W" >"$TMP/seq.out" || true
    c1=$(cpu_ns "$WORKER")
    awk -v f="$fmt" '{ print "scrape\tidle\t" f "\t" $0 }' "$TMP/seq.out" >>"$RAW"
    printf 'cpu\tidle\t%s\t%s\t%s\n' "$fmt" "$(wc -l <"$TMP/seq.out")" "$((c1 - c0))" >>"$RAW"
    bad=$(awk '$1 != 200' "$TMP/seq.out" | wc -l)
    ((bad == 0 && $(wc -l <"$TMP/seq.out") == N)) || fail "$fmt scrapes: $bad of $(wc -l <"$TMP/seq.out") not 200 ($N sent)"
    log "$N $fmt scrapes: $(sort -n -k2 "$TMP/seq.out" | awk '{ t[NR] = $2 } END { printf "median %.2f ms", 1000 * t[int((NR + 1) / 2)] }'), worker CPU $(((c1 - c0) / N / 1000)) us a scrape"
done

# 2. wrk on /admit, without and with the scraper.
# run_wrk PHASE COND SECS: one wrk run; COND none or scrape.
run_wrk() {
    local phase=$1 cond=$2 secs=$3 c0 c1 res nscr=0
    worker_alive
    c0=$(cpu_ns "$WORKER")
    if [[ $cond == scrape ]]; then
        # Starts are RATE a second (curl --rate spaces their starts): the last starts within the wrk run.
        scrapes "$TMP/load.cfg" "$((secs * RATE))" "http://127.0.0.1:$PORT/metrics"
        taskset -c "$CLIENT_CPU" curl -s --rate "$RATE/s" -K "$TMP/load.cfg" -w "$CURL_W" >"$TMP/load.out" &
        SCR_PID=$!
    fi
    taskset -c "$CLIENT_CPU" wrk -t1 -c32 -d"${secs}s" --timeout 5s -s "$BENCH/wrk/load.lua" \
        "http://127.0.0.1:$PORT/admit" -- 0 count >"$TMP/wrk.out" 2>&1 &
    WRK_PID=$!
    wait "$WRK_PID" || { cat "$TMP/wrk.out" >&2; die "wrk failed"; }
    WRK_PID=
    if [[ -n $SCR_PID ]]; then
        # A scrape late behind the load may finish after wrk; not much later.
        for _ in $(seq 100); do kill -0 "$SCR_PID" 2>/dev/null || break; sleep 0.1; done
        kill "$SCR_PID" 2>/dev/null || true
        wait "$SCR_PID" 2>/dev/null || true
        SCR_PID=
        nscr=$(wc -l <"$TMP/load.out")
        awk -v p="$phase" '{ print "scrape\tload\t" p "\t" $0 }' "$TMP/load.out" >>"$RAW"
        local bad
        bad=$(awk '$1 != 200' "$TMP/load.out" | wc -l)
        ((bad == 0 && nscr == secs * RATE)) || fail "scrapes during wrk ($phase): $bad of $nscr not 200 ($((secs * RATE)) sent)"
    fi
    c1=$(cpu_ns "$WORKER")
    worker_alive
    res=$(grep '^RESULT ' "$TMP/wrk.out") || { cat "$TMP/wrk.out" >&2; die "no result from wrk"; }
    # requests duration_us p50_us p99_us n200 n429 n5xx nother err_connect err_read err_write err_timeout
    # (and err_status, left out: n200 tells more)
    local -a v
    read -r -a v <<<"$(sed 's/[a-z0-9_]*=//g; s/^RESULT //' <<<"$res")"
    v=("${v[@]:0:12}")
    ((v[0] > 0 && v[4] == v[0] && v[8] + v[9] + v[10] + v[11] == 0)) ||
        fail "/admit ($phase, $cond): ${v[4]} of ${v[0]} answered 200 (429: ${v[5]}, 5xx: ${v[6]}, other: ${v[7]}), socket errors $((v[8] + v[9] + v[10] + v[11]))"
    printf 'wrk\t%s\t%s\t%s\t%s\t%s\t%s\n' "$phase" "$cond" "$secs" "$(IFS=$'\t' && echo "${v[*]}")" "$((c1 - c0))" "$nscr" >>"$RAW"
    [[ $phase == warm ]] && return 0
    awk -v c="$cond" -v r="${v[0]}" -v d="${v[1]}" -v p="${v[3]}" -v ns="$((c1 - c0))" -v s="$nscr" 'BEGIN {
        printf "  %-7s %9.0f req/s  p99 %7.2f ms  %6.2f us/req  %d scrapes\n", c, r / (d / 1e6), p / 1000, ns / r / 1000, s }' >&2
}

if ((WARM > 0)); then
    log "warm-up: ${WARM}s without and with scrapes"
    run_wrk warm none "$WARM"
    run_wrk warm scrape "$WARM"
fi
for ((r = 1; r <= ROUNDS; r++)); do
    log "round $r/$ROUNDS: ${SECS}s without and with $RATE scrapes a second, in random order"
    for cond in $(printf 'none\nscrape\n' | shuf); do run_wrk "$r" "$cond" "$SECS"; done
done
worker_alive

printf 'meta\trounds\t%s\nmeta\tsecs\t%s\nmeta\twarm\t%s\nmeta\trate\t%s\nmeta\tn\t%s\nmeta\tnkeys\t%s\nmeta\tper_key\t%s\nmeta\telapsed\t%s\n' \
    "$ROUNDS" "$SECS" "$WARM" "$RATE" "$N" "$NKEYS" "$PER_KEY" "$(($(date +%s) - start_s))" >>"$RAW"
printf 'meta\tquick\t%s\nmeta\tload0\t%s\nmeta\tload\t%s\n' "$QUICK" "$load0" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$RAW"
[[ -n ${SCRAPE_RAW:-} ]] && cp "$RAW" "$SCRAPE_RAW"

render "$RAW" >"$TMP/section.md"
cat "$TMP/section.md" >"$OUT"
log "done in $(($(date +%s) - start_s))s"
((FAILED == 0)) || die "the scrape measurement is broken (see FAIL above)"
