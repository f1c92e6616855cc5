#!/usr/bin/env bash
# make bench: what nginx-rl costs per request, side by side with what users
# would run instead (stock limit_req, Lua + Redis), on this machine, in one run.
#
#   bench/run.sh            full run: warm-up, 5 interleaved rounds of 5 s,
#                           memory test, scrape, callgrind profile; writes
#                           bench/RESULTS.md (~35 min on 2 cores)
#   QUICK=1 bench/run.sh    smoke test: 1 round of 1 s, small zones; writes
#                           bench/RESULTS.quick.md; exits non-zero if broken
#
# Environment (all optional): RL_MODULE (the module, default
# build/debian/ngx_http_rl_module.so), NGINX (/usr/sbin/nginx), BENCH_ROUNDS,
# BENCH_SECS, BENCH_WARM, BENCH_LEASE_WARM (untimed seconds before each
# timed run of a lease row, 2; 0 quick), BENCH_CONNS, BENCH_THREADS, BENCH_MEMZ (zone size
# of the memory test), BENCH_ONLY (regex on scenario ids: only those rows;
# it skips the memory test, the scrape and the profile too, unless
# BENCH_MEM=1, BENCH_SCRAPE=1, BENCH_PROFILE=1), BENCH_NO_MEM=1,
# BENCH_OUT (report path; the raw files go beside it), BENCH_KEEP=1 (keep the temp dir with the logs),
# BENCH_NO_SCRAPE=1 (skip bench/scrape.sh), BENCH_NO_PROFILE=1 (skip bench/profile.sh).
#
# See bench/README.md for the method.

set -Eeuo pipefail
export LC_ALL=C

BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
ROOT=$(dirname "$BENCH")
NGINX=${NGINX:-/usr/sbin/nginx}
# nginx reads an environment variable NGINX as listening sockets inherited
# in a binary upgrade: the knob must not reach the nginx it starts.
export -n NGINX
MODULE=${RL_MODULE:-$ROOT/build/debian/ngx_http_rl_module.so}
case "${QUICK:-}" in 0 | no | false) QUICK= ;; esac
QUICK=${QUICK:-}

if [[ -n $QUICK ]]; then
    ROUNDS=${BENCH_ROUNDS:-1} SECS=${BENCH_SECS:-1} WARM=${BENCH_WARM:-0} LEASE_WARM=${BENCH_LEASE_WARM:-0}
    MEMZ=${BENCH_MEMZ:-128k} NLONG=1000 OUT=${BENCH_OUT:-$BENCH/RESULTS.quick.md}
else
    ROUNDS=${BENCH_ROUNDS:-5} SECS=${BENCH_SECS:-5} WARM=${BENCH_WARM:-1} LEASE_WARM=${BENCH_LEASE_WARM:-2}
    MEMZ=${BENCH_MEMZ:-1m} NLONG=5000 OUT=${BENCH_OUT:-$BENCH/RESULTS.md}
fi
THREADS=${BENCH_THREADS:-1}
CONNS=${BENCH_CONNS:-32}
ONLY=${BENCH_ONLY:-}
NGX_CPU=0    # nginx (must match worker_cpu_affinity in conf/common.inc), redis-server and memcached
CLIENT_CPU=1 # wrk, alone (and redis-server in the scenarios whose redis column says client)

log() { printf '[bench %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- packages
# The Lua peer needs lua-nginx-module (libnginx-mod-http-lua) and
# lua-resty-redis (lua-nginx-redis). Installing them must not change what the
# system's own nginx loads: each libnginx-mod-* package links itself into
# /etc/nginx/modules-enabled on a fresh install, and lua-nginx-redis depends
# on nginx-extras, which pulls in about 20 more modules (nchan alone takes
# 128 MiB of shared memory in every nginx -t). So lua-nginx-redis is not
# installed: its one file, redis.lua, is unpacked from the package into
# build/bench-lua; libnginx-mod-http-lua is installed, the links its install
# added are taken away again (a later upgrade of the package keeps them
# away: its postinst links only on a fresh install), and lua.conf loads the
# modules by path. No service is started or reloaded meanwhile.
LUA_REDIS_SYSTEM=/usr/share/lua/5.1/nginx/redis.lua
LUA_REDIS_CACHE=${BENCH_LUA_CACHE:-$ROOT/build/bench-lua}
LUA_REDIS_DIR=
LUA_REDIS_VERSION=

# The links of /etc/nginx/modules-enabled, one "name -> target" a line.
modules_enabled() {
    find /etc/nginx/modules-enabled -mindepth 1 -maxdepth 1 -printf '%f -> %l\n' 2>/dev/null | sort
}

# apt-get install $@, with no service started or reloaded (a policy-rc.d
# that refuses, unless one is there already), then the links the install
# added to /etc/nginx/modules-enabled removed.
install_quietly() {
    local before policy=/usr/sbin/policy-rc.d own_policy= added link
    before=$(modules_enabled)
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# nginx-rl bench: no service starts or reloads while it installs\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        own_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
    local rc=$?
    [[ -n $own_policy ]] && rm -f "$policy"
    added=$(comm -13 <(echo "$before") <(modules_enabled))
    while IFS= read -r link; do
        [[ -n $link ]] || continue
        log "taking away /etc/nginx/modules-enabled/${link%% -> *} (the install added it; the system's nginx loads what it loaded before)"
        rm -f "/etc/nginx/modules-enabled/${link%% -> *}"
    done <<<"$added"
    return $rc
}

# redis.lua of lua-nginx-redis, unpacked from the package (apt-get download)
# into $LUA_REDIS_CACHE unless it is there already; sets LUA_REDIS_DIR (the
# directory that holds nginx/redis.lua) and LUA_REDIS_VERSION.
ensure_lua_redis() {
    if [[ -f $LUA_REDIS_SYSTEM ]]; then
        LUA_REDIS_DIR=/usr/share/lua/5.1
        LUA_REDIS_VERSION="$(dpkg-query -W -f='${Version}' lua-nginx-redis 2>/dev/null) (installed)"
        return 0
    fi
    if [[ ! -f $LUA_REDIS_CACHE/usr/share/lua/5.1/nginx/redis.lua ]]; then
        local dl deb
        dl=$(mktemp -d /tmp/nginx-rl-bench-deb.XXXXXX)
        chmod 777 "$dl" # apt-get downloads as _apt
        log "unpacking lua-nginx-redis's redis.lua into $LUA_REDIS_CACHE (not installing it: it would pull in nginx-extras)"
        (cd "$dl" && { apt-get download -qq lua-nginx-redis 2>/dev/null ||
            { apt-get update -qq && apt-get download -qq lua-nginx-redis 2>/dev/null; }; }) ||
            { rm -rf "$dl"; die "apt-get download lua-nginx-redis failed"; }
        deb=$(ls "$dl"/lua-nginx-redis_*.deb)
        rm -rf "$LUA_REDIS_CACHE" && mkdir -p "$LUA_REDIS_CACHE"
        dpkg-deb -x "$deb" "$LUA_REDIS_CACHE" && dpkg-deb -f "$deb" Version >"$LUA_REDIS_CACHE/version" ||
            { rm -rf "$dl"; die "dpkg-deb -x $deb failed"; }
        rm -rf "$dl"
    fi
    LUA_REDIS_DIR=$LUA_REDIS_CACHE/usr/share/lua/5.1
    LUA_REDIS_VERSION="$(cat "$LUA_REDIS_CACHE/version") (unpacked in $LUA_REDIS_CACHE)"
}

ensure_packages() {
    local need=()
    [[ -x $NGINX ]] || need+=(nginx)
    command -v wrk >/dev/null || need+=(wrk)
    command -v curl >/dev/null || need+=(curl)
    command -v taskset >/dev/null || need+=(util-linux)
    command -v redis-server >/dev/null || need+=(redis-server)
    command -v redis-cli >/dev/null || need+=(redis-tools)
    command -v memcached >/dev/null || need+=(memcached)
    [[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ]] || need+=(libnginx-mod-http-lua)
    if ((${#need[@]} > 0)); then
        ((EUID == 0)) || die "missing packages: ${need[*]} (run as root, or apt-get install them)"
        log "installing: ${need[*]}"
        install_quietly "${need[@]}" || die "apt-get install ${need[*]} failed"
    fi
    ensure_lua_redis
}

# ---------------------------------------------------------------- scenarios
declare -A S_INST S_PATH S_KEYS S_EXPECT S_GROUP S_REF S_QUICK S_CONNS S_RCPU S_DESC
IDS=()
load_scenarios() {
    local id inst path nkeys expect group ref quick conns redis desc
    while IFS=$'\t' read -r id inst path nkeys expect group ref quick conns redis desc; do
        [[ -z $id || $id == \#* ]] && continue
        [[ $conns == - ]] && conns=$CONNS
        S_RCPU[$id]=$NGX_CPU
        [[ $redis == client ]] && S_RCPU[$id]=$CLIENT_CPU
        S_INST[$id]=$inst S_PATH[$id]=$path S_KEYS[$id]=$nkeys S_EXPECT[$id]=$expect
        S_GROUP[$id]=$group S_REF[$id]=$ref S_QUICK[$id]=$quick S_CONNS[$id]=$conns S_DESC[$id]=$desc
        [[ -n $QUICK && $quick != 1 ]] && continue
        [[ -n $ONLY && ! $id =~ $ONLY ]] && continue
        IDS+=("$id")
    done <"$BENCH/scenarios.tsv"
    ((${#IDS[@]} > 0)) || die "no scenario selected"
}

# ---------------------------------------------------------------- processes
TMP=
declare -A PORT MASTER WORKER ROWPORT
INSTANCES=()
REDIS_PID=
MEMCACHED_PID=
WRK_PID=
FAILED=0

cleanup() {
    local rc=$?
    set +e
    trap - ERR
    [[ -n $WRK_PID ]] && kill "$WRK_PID" 2>/dev/null
    local name pid
    for name in "${INSTANCES[@]}"; do
        pid=${MASTER[$name]:-}
        [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null
    done
    [[ -n $REDIS_PID ]] && kill -TERM "$REDIS_PID" 2>/dev/null
    [[ -n $MEMCACHED_PID ]] && kill -TERM "$MEMCACHED_PID" 2>/dev/null
    for name in "${INSTANCES[@]}"; do
        pid=${MASTER[$name]:-}
        [[ -n $pid ]] || continue
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
    done
    [[ -n $REDIS_PID ]] && wait "$REDIS_PID" 2>/dev/null
    [[ -n $MEMCACHED_PID ]] && wait "$MEMCACHED_PID" 2>/dev/null
    if [[ -n $TMP && -d $TMP ]]; then
        if [[ -n ${BENCH_KEEP:-} || $rc -ne 0 ]]; then
            log "logs kept in $TMP"
        else
            rm -rf "$TMP"
        fi
    fi
    exit "$rc"
}

render() { # template dir port > file
    sed -e "s|@DIR@|$2|g" -e "s|@HTML@|$TMP/html|g" -e "s|@PORT@|$3|g" \
        -e "s|@MODULE@|$MODULE|g" -e "s|@REDIS_PORT@|$REDIS_PORT|g" -e "s|@MEMCACHED_PORT@|$MEMCACHED_PORT|g" \
        -e "s|@BENCH@|$BENCH|g" -e "s|@MEMZ@|$MEMZ|g" -e "s|@LUA_REDIS@|$LUA_REDIS_DIR|g" "$1"
}

# prepare_nginx NAME CONF: renders the configuration and runs nginx -t.
prepare_nginx() {
    local name=$1 conf=$2 dir=$TMP/$1 port
    port=$(free_port ${PORT[*]:-} "$REDIS_PORT" "$MEMCACHED_PORT") && [[ -n $port ]] || die "no free port"
    PORT[$name]=$port
    mkdir -p "$dir/tmp"
    render "$BENCH/conf/common.inc" "$dir" "$port" >"$dir/common.inc"
    render "$BENCH/conf/http.inc" "$dir" "$port" >"$dir/http.inc"
    render "$BENCH/conf/$conf" "$dir" "$port" >"$dir/nginx.conf"
    local row p
    while read -r row p; do
        ROWPORT[$name/$row]=$p
    done < <(assign_row_ports "$dir/nginx.conf" ${PORT[*]:-} ${ROWPORT[*]:-} "$REDIS_PORT" "$MEMCACHED_PORT")
    "$NGINX" -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log" -t -q >"$dir/test.log" 2>&1
}

start_nginx() {
    local name=$1 dir=$TMP/$1 pid= w=
    INSTANCES+=("$name")
    "$NGINX" -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log" ||
        { cat "$dir/error.log" >&2; die "nginx ($name) failed to start"; }
    for _ in $(seq 100); do
        [[ -s $dir/nginx.pid ]] && pid=$(<"$dir/nginx.pid")
        [[ -n $pid ]] && w=$(pgrep -P "$pid" | head -1 || true)
        [[ -n $w ]] && break
        sleep 0.05
    done
    [[ -n $w ]] || { cat "$dir/error.log" >&2; die "nginx ($name) has no worker"; }
    MASTER[$name]=$pid WORKER[$name]=$w
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:${PORT[$name]}/" && return 0
        sleep 0.05
    done
    die "nginx ($name) does not answer on port ${PORT[$name]}"
}

start_redis() {
    mkdir -p "$TMP/redis"
    local attempt
    for attempt in 1 2 3; do
        taskset -c "$NGX_CPU" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" \
            --appendonly no --protected-mode no --dir "$TMP/redis" --logfile "$TMP/redis/redis.log" \
            --daemonize no &
        REDIS_PID=$!
        for _ in $(seq 100); do
            [[ $(redis-cli -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]] && return 0
            kill -0 "$REDIS_PID" 2>/dev/null || break
            sleep 0.05
        done
        kill "$REDIS_PID" 2>/dev/null || true
        wait "$REDIS_PID" 2>/dev/null || true
        REDIS_PID=
        log "redis-server did not start on port $REDIS_PORT (attempt $attempt)"
        REDIS_PORT=$(free_port ${PORT[*]:-} "$REDIS_PORT" "$MEMCACHED_PORT") || break
    done
    cat "$TMP/redis/redis.log" >&2
    die "redis-server does not start"
}

# memcached for the Memcached zone rows, started as redis-server is for the
# Redis rows: on CPU 0, and run_one moves it (all its threads) to each row's
# CPU as it moves redis-server. -t 1: one worker thread, as redis-server
# answers on one core, so that the two servers' CPU per request compare.
# -m 64: room for every counter the rows make (at the rows' line, a window
# of 655 us, about one new counter a request, each living a second or two)
# without evicting one. -U 0: no UDP. As root memcached starts only with -u.
start_memcached() {
    mkdir -p "$TMP/memcached"
    local attempt user=()
    ((EUID == 0)) && user=(-u nobody)
    for attempt in 1 2 3; do
        taskset -c "$NGX_CPU" memcached -l 127.0.0.1 -p "$MEMCACHED_PORT" -U 0 -m 64 -t 1 "${user[@]}" \
            >"$TMP/memcached/memcached.log" 2>&1 &
        MEMCACHED_PID=$!
        for _ in $(seq 100); do
            [[ $(memcached_cmd version) == VERSION* ]] && return 0
            kill -0 "$MEMCACHED_PID" 2>/dev/null || break
            sleep 0.05
        done
        kill "$MEMCACHED_PID" 2>/dev/null || true
        wait "$MEMCACHED_PID" 2>/dev/null || true
        MEMCACHED_PID=
        log "memcached did not start on port $MEMCACHED_PORT (attempt $attempt)"
        MEMCACHED_PORT=$(free_port ${PORT[*]:-} "$REDIS_PORT" "$MEMCACHED_PORT") || break
    done
    cat "$TMP/memcached/memcached.log" >&2
    die "memcached does not start"
}

# memcached_cmd CMD: memcached's reply to one text-protocol command (its
# VERSION line, the STAT lines of `stats`), over a connection of its own
# (bash's /dev/tcp: the bench needs no memcached client). Prints nothing if
# memcached does not answer.
memcached_cmd() {
    local fd line
    { exec {fd}<>"/dev/tcp/127.0.0.1/$MEMCACHED_PORT"; } 2>/dev/null || return 0
    printf '%s\r\n' "$1" >&"$fd"
    while IFS= read -r -t 2 line <&"$fd"; do
        line=${line%$'\r'}
        echo "$line"
        [[ $line == END || $line == VERSION* || $line == *ERROR* ]] && break
    done
    exec {fd}>&-
}

# What memcached says of its counters at the end: whether it evicted any
# (a counter lost within its window lets its key start again from zero).
memcached_summary() {
    memcached_cmd stats | awk '
        $2 == "evictions" { ev = $3 } $2 == "curr_items" { cur = $3 } $2 == "total_items" { tot = $3 }
        $2 == "limit_maxbytes" { mb = $3 / 1048576 } $2 == "bytes" { used = $3 / 1048576 }
        END { if (tot != "") printf "%d evictions; %d items at the end (%.1f of %d MB), %d stored in all", ev, cur, used, mb, tot }'
}

# What waking a sleeping thread costs here (bench/wakeup.c): a round trip
# between CPU 0 and the client's CPU, and within CPU 0, and the guest's idle
# settings, which decide the former on a virtual machine. Prints one line,
# or nothing without a C compiler.
wakeups() {
    cc -O2 -pthread -o "$TMP/wakeup" "$BENCH/wakeup.c" 2>/dev/null || return 0
    local cross same idle=
    cross=$("$TMP/wakeup" "$NGX_CPU" "$CLIENT_CPU") && same=$("$TMP/wakeup" "$NGX_CPU" "$NGX_CPU") || return 0
    [[ -r /sys/devices/system/cpu/cpuidle/current_driver ]] &&
        idle="; cpuidle driver $(cat /sys/devices/system/cpu/cpuidle/current_driver)"
    [[ -r /sys/module/haltpoll/parameters/guest_halt_poll_ns ]] &&
        idle="$idle, guest_halt_poll_ns=$(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns)"
    echo "a thread wakes another and is woken back (bench/wakeup.c) in ${cross} us between CPU $NGX_CPU and CPU $CLIENT_CPU, ${same} us within CPU $NGX_CPU$idle"
}

# ---------------------------------------------------------------- one run
# The script calls redis-server has run so far (FCALL, EVALSHA, EVAL: the
# Lua peer's and nginx-rl's, decisions and lease syncs alike).
redis_calls() {
    redis-cli -p "$REDIS_PORT" INFO commandstats 2>/dev/null |
        awk -F'[:=,]' '/^cmdstat_(fcall|evalsha|eval):/ { n += $3 } END { print n + 0 }'
}

# run_one PHASE ID SECS: one wrk run; appends a line to raw.tsv.
run_one() {
    local phase=$1 id=$2 secs=$3
    local inst=${S_INST[$id]} out=$TMP/wrk.out
    local w=${WORKER[$inst]} c0 c1 r0=0 r1=0 q0=0 q1=0 k0 k1 res status reason count= spid= sname=
    # Statuses are counted one by one in the warm-up and in a quick run; a
    # timed run counts only those of 400 or above (wrk's own count), so that
    # the client's work does not grow with the fields a response carries
    # (bench/wrk/load.lua).
    [[ $phase == warm || -n $QUICK ]] && count=count
    kill -0 "$w" 2>/dev/null || die "the nginx worker of '$inst' is gone (crashed?), see $TMP/$inst/error.log"
    # The server the row's requests wait for: redis-server for the Lua peer
    # and the Redis zone, memcached for the Memcached zone.
    case $inst in
        lua | rlredis) spid=$REDIS_PID sname=redis ;;
        rlmemcached) spid=$MEMCACHED_PID sname=memcached ;;
    esac
    if [[ -n $spid ]]; then
        # Its CPU, all its threads: the server's (CPU 0) unless the scenario says wrk's.
        taskset -a -p -c "${S_RCPU[$id]}" "$spid" >/dev/null || die "taskset on $sname failed"
        r0=$(cpu_ns "$spid")
    fi
    if [[ $sname == redis ]]; then q0=$(redis_calls); fi
    c0=$(cpu_ns "$w")
    k0=$(cpu_ticks "$CLIENT_CPU")
    taskset -c "$CLIENT_CPU" wrk -t"$THREADS" -c"${S_CONNS[$id]}" -d"${secs}s" --timeout 5s \
        -s "$BENCH/wrk/load.lua" "$(row_url "${S_INST[$id]}" "${S_PATH[$id]}")" -- "${S_KEYS[$id]}" $count \
        >"$out" 2>&1 &
    WRK_PID=$!
    wait "$WRK_PID" || { cat "$out" >&2; die "wrk failed on $id"; }
    WRK_PID=
    c1=$(cpu_ns "$w")
    k1=$(cpu_ticks "$CLIENT_CPU")
    if [[ -n $spid ]]; then r1=$(cpu_ns "$spid"); fi
    if [[ $sname == redis ]]; then q1=$(redis_calls); fi
    res=$(grep '^RESULT ' "$out") || { cat "$out" >&2; die "no result from wrk on $id"; }
    # A worker that crashed is replaced by the master with a new pid.
    [[ $(pgrep -P "${MASTER[$inst]}" | head -1) == "$w" ]] ||
        die "the nginx worker of '$inst' was replaced during $id (crashed?), see $TMP/$inst/error.log"
    # requests duration_us p50_us p99_us n200 n429 n5xx nother (-1: not counted)
    # err_connect err_read err_write err_timeout err_status (400 and above)
    local -a v
    read -r -a v <<<"$(sed 's/[a-z0-9_]*=//g; s/^RESULT //' <<<"$res")"
    local req=${v[0]} n200=${v[4]} n429=${v[5]} n5xx=${v[6]} nother=${v[7]} econn=${v[8]} nhigh=${v[12]}
    status=ok reason=
    if ((req == 0)); then
        reason="no request completed"
    elif ((n5xx > 0)); then
        reason="$n5xx responses 5xx"
    elif ((econn > 0)); then
        reason="$econn connect errors"
    elif [[ -z $count && ${S_EXPECT[$id]} == admit ]] && ((nhigh > 0)); then
        reason="admit path: $nhigh of $req answered with a status of 400 or above"
    elif [[ -z $count && ${S_EXPECT[$id]} == reject ]] && ((nhigh * 100 < req * 99)); then
        reason="reject path: only $nhigh of $req answered with a status of 400 or above"
    elif [[ -n $count && ${S_EXPECT[$id]} == admit ]] && ((n200 != req)); then
        reason="admit path: $((req - n200)) of $req not 200 ($n429 x 429, $nother other)"
    elif [[ -n $count && ${S_EXPECT[$id]} == reject ]] && ((nother > 0 || n429 * 100 < req * 99)); then
        reason="reject path: only $n429 of $req are 429 ($n200 x 200, $nother other)"
    fi
    if [[ -n $reason ]]; then
        status=FAIL
        FAILED=1
        log "FAIL $id ($phase): $reason"
    fi
    local vt calls=$((q1 - q0))
    vt=$(IFS=$'\t' && echo "${v[*]}")
    # memcached has no count of our round trips (its stats count neither an
    # `ma` that creates its counter nor a batch): none, not zero.
    [[ $sname == memcached ]] && calls=-
    # CPU 1's busy share in thousandths: near 1000, the client set the pace.
    local -a ka kb
    read -r -a ka <<<"$k0"
    read -r -a kb <<<"$k1"
    local kbusy=$(((kb[0] - ka[0]) * 1000 / (kb[1] - ka[1] > 0 ? kb[1] - ka[1] : 1)))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$phase" "$id" "$secs" "$vt" \
        "$((c1 - c0))" "$((r1 - r0))" "$status" "${reason:--}" "$(cut -d' ' -f1 /proc/loadavg)" "$kbusy" \
        "$calls" >>"$TMP/raw.tsv"
    if [[ $phase != warm ]]; then
        awk -v id="$id" -v r="$req" -v d="${v[1]}" -v p50="${v[2]}" -v p="${v[3]}" -v c="$((c1 - c0))" -v rc="$((r1 - r0))" -v q="$((q1 - q0))" -v k="$kbusy" -v sn="$sname" 'BEGIN {
            printf "  %-28s %9.0f req/s  p50 %7.2f ms  p99 %7.2f ms  %6.2f us/req", id, r / (d / 1e6), p50 / 1000, p / 1000, c / r / 1000
            if (rc > 0 && sn == "memcached") printf "  memcached %6.2f us/req", rc / r / 1000
            else if (rc > 0) printf "  redis %6.2f us/req %7.1f calls/1000", rc / r / 1000, 1000 * q / r
            printf "  client CPU %3.0f%%\n", k / 10 }' >&2
    fi
}

# ---------------------------------------------------------------- memory
# curl_keys URL FIRST LAST STEP PREFIX PAD: one request per key, in order,
# over one keep-alive connection; prints one status code per line.
curl_keys() {
    awk -v u="$1" -v a="$2" -v b="$3" -v s="$4" -v p="$5" -v pad="$6" 'BEGIN {
        for (i = a; (s > 0) ? i <= b : i >= b; i += s) {
            k = p i
            while (length(k) < pad) k = k "x"
            printf "url = \"%s?u=%s\"\noutput = \"/dev/null\"\n", u, k
        }
    }' >"$TMP/keys.cfg"
    curl -s -K "$TMP/keys.cfg" -w '%{http_code}\n'
}

size_bytes() {
    local s=${1,,}
    case $s in
        *k) echo $((${s%k} * 1024)) ;;
        *m) echo $((${s%m} * 1048576)) ;;
        *) echo "$s" ;;
    esac
}

# For each zone: fill it with NFILL short keys (s1..sNFILL, one request
# each), then count the keys it still holds: ask again from the newest key
# down; a held key answers 429 (its one request is spent), the first
# forgotten key answers 200. For nginx-rl, also where the first eviction
# was logged. Then send NLONG new long keys (100 bytes) into the zone full of
# short ones and count how many are refused (429) for lack of memory.
memory_test() {
    local zbytes nfill chunk z url held first codes i lo n
    zbytes=$(size_bytes "$MEMZ")
    nfill=$((zbytes * 48000 / 1048576))
    chunk=2000
    prepare_nginx mem mem.conf || { cat "$TMP/mem/test.log" >&2; die "nginx -t failed for the memory test"; }
    start_nginx mem
    : >"$TMP/mem.tsv"
    for z in fixed sliding sliding_log token_bucket leaky_bucket gcra limit_req; do
        url="http://127.0.0.1:${PORT[mem]}/m_$z"
        codes=$(curl_keys "$url" 1 "$nfill" 1 s 0 | sort | uniq -c | awk '{printf "%s%s x %s", sep, $1, $2; sep=", "}')
        held=0 i=$nfill
        while ((i > 0)); do
            lo=$((i - chunk + 1))
            ((lo < 1)) && lo=1
            n=$(curl_keys "$url" "$i" "$lo" -1 s 0 | awk '$1 != 429 && !f { n = NR - 1; f = 1 } END { print f ? n : NR }')
            held=$((held + n))
            ((n < i - lo + 1)) && break
            i=$((lo - 1))
        done
        first=$(awk '/is full/ { print n + 0; f = 1; exit } /^s[0-9]+ [0-9]+$/ { n++ } END { if (!f) print "-" }' "$TMP/mem/m_$z.log")
        local long
        long=$(curl_keys "$url" 1 "$NLONG" 1 L 100 | awk '
            $1 == 200 { ok++ } $1 == 429 { rej++ } $1 != 200 && $1 != 429 { other++ }
            END { printf "%d\t%d\t%d", ok, rej, other }')
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$z" "$zbytes" "$nfill" "$codes" "$held" "$first" "$NLONG" "$long" >>"$TMP/mem.tsv"
        log "memory $z: holds $held keys in $MEMZ (fill: $codes; first eviction logged after $first keys); long keys: $(cut -f2 <<<"$long") of $NLONG refused"
        if [[ $z != limit_req ]]; then
            [[ $(cut -f2 <<<"$long") == 0 && $(cut -f3 <<<"$long") == 0 ]] || { FAILED=1; log "FAIL memory $z: new keys refused or errors ($long)"; }
            [[ $codes == *" x 200" && $codes != *,* ]] || { FAILED=1; log "FAIL memory $z: fill answers $codes"; }
        fi
        ((held > 0)) || { FAILED=1; log "FAIL memory $z: holds no key"; }
    done
    grep -c 'could not allocate node' "$TMP/mem/error.log" >"$TMP/mem.lr_nomem" || true
}

# ---------------------------------------------------------------- main
main() {
    ensure_packages
    [[ -f $MODULE ]] || die "module not found: $MODULE (make build-debian)"
    load_scenarios
    TMP=$(mktemp -d /tmp/nginx-rl-bench.XXXXXX)
    chmod 755 "$TMP"
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'log "failed at line $LINENO: $BASH_COMMAND"' ERR
    mkdir -p "$TMP/html"
    # nginx maps the module: load a private copy, so that a rebuild during the
    # run cannot pull the file from under a running worker.
    cp "$MODULE" "$TMP/ngx_http_rl_module.so"
    MODULE_SRC=$MODULE
    MODULE=$TMP/ngx_http_rl_module.so
    local git_rev module_info
    git_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [[ -n $(git -C "$ROOT" status --porcelain -- src rl-core 2>/dev/null) ]]; then
        git_rev="$git_rev + uncommitted changes in src/ or rl-core/"
    fi
    module_info="$MODULE_SRC (built $(date -u -r "$MODULE_SRC" '+%Y-%m-%d %H:%M UTC'), sha256 $(sha256sum "$MODULE" | cut -c1-12); repo at $git_rev when the run started)"
    : >"$TMP/raw.tsv"
    : >"$TMP/mem.tsv"
    local id
    for id in "${!S_PATH[@]}"; do
        echo "hello from the nginx-rl bench" >"$TMP/html/${S_PATH[$id]#/}"
    done
    for id in f index.html m_fixed m_sliding m_sliding_log m_token_bucket m_leaky_bucket m_gcra m_limit_req; do
        echo "hello from the nginx-rl bench" >"$TMP/html/$id"
    done

    REDIS_PORT=0 MEMCACHED_PORT=0
    REDIS_PORT=$(free_port ${PORT[*]:-} "$REDIS_PORT") && [[ -n $REDIS_PORT ]] || die "no free port"
    MEMCACHED_PORT=$(free_port ${PORT[*]:-} "$REDIS_PORT") && [[ -n $MEMCACHED_PORT ]] || die "no free port"
    local load0 start_s wake
    load0=$(cut -d' ' -f1-3 /proc/loadavg)
    wake=$(wakeups)
    [[ -n $wake ]] && log "wake-ups: $wake"
    start_s=$(date +%s)

    # Which instances the selected scenarios need.
    local -A need=()
    for id in "${IDS[@]}"; do need[${S_INST[$id]}]=1; done
    if [[ -n ${need[lua]:-} || -n ${need[rlredis]:-} ]]; then
        start_redis
    fi
    if [[ -n ${need[rlmemcached]:-} ]]; then
        start_memcached
    fi
    local name why
    SKIP_REDIS= SKIP_MEMCACHED=
    for name in stock rl lua rlredis rlmemcached; do
        [[ -n ${need[$name]:-} ]] || continue
        if ! prepare_nginx "$name" "$name.conf"; then
            if [[ $name == rlredis || $name == rlmemcached ]]; then
                why=$(sed -n 's/^nginx: \[emerg\] \(.*\) in \/.*$/\1/p' "$TMP/$name/test.log" | head -1)
                [[ -n $why ]] || why=$(head -1 "$TMP/$name/test.log")
                if [[ $name == rlredis ]]; then
                    SKIP_REDIS=$why
                    log "skipping the nginx-rl Redis scenarios: nginx -t says: $why"
                else
                    SKIP_MEMCACHED=$why
                    log "skipping the nginx-rl Memcached scenarios: nginx -t says: $why"
                fi
                continue
            fi
            cat "$TMP/$name/test.log" >&2
            die "nginx -t failed for '$name'"
        fi
        start_nginx "$name"
        log "nginx '$name' on 127.0.0.1:${PORT[$name]}, worker ${WORKER[$name]} on CPU $(taskset -pc "${WORKER[$name]}" | awk '{print $NF}')"
    done
    local run_ids=()
    for id in "${IDS[@]}"; do
        [[ ${S_INST[$id]} == rlredis && -n $SKIP_REDIS ]] && continue
        [[ ${S_INST[$id]} == rlmemcached && -n $SKIP_MEMCACHED ]] && continue
        run_ids+=("$id")
    done

    if ((WARM > 0)); then
        log "warm-up: ${#run_ids[@]} scenarios x ${WARM}s"
        for id in $(printf '%s\n' "${run_ids[@]}" | shuf); do run_one warm "$id" "$WARM"; done
    fi
    local r
    for ((r = 1; r <= ROUNDS; r++)); do
        log "round $r/$ROUNDS: ${#run_ids[@]} scenarios x ${SECS}s, in random order"
        for id in $(printf '%s\n' "${run_ids[@]}" | shuf); do
            # A lease row runs its own load untimed first: in the minute the
            # other rows take, its keys' leases end and their demand decays,
            # and each round would time a cold start (README, Performance).
            if [[ ${S_PATH[$id]} == /lease* ]] && ((LEASE_WARM > 0)); then run_one warm "$id" "$LEASE_WARM"; fi
            run_one "$r" "$id" "$SECS"
        done
    done

    # What memcached says of the rows: whether it evicted a counter (its key
    # then counts again from zero), and anything it logged.
    local mc_stats=
    if [[ -n $MEMCACHED_PID ]]; then
        mc_stats=$(memcached_summary)
        log "memcached: ${mc_stats:-no answer to stats}"
        if [[ -s $TMP/memcached/memcached.log ]]; then
            log "memcached logged:"
            cat "$TMP/memcached/memcached.log" >&2
        fi
    fi

    if [[ -z ${BENCH_NO_MEM:-} && (-z $ONLY || -n ${BENCH_MEM:-}) ]]; then
        log "memory test: zones of $MEMZ"
        memory_test
    fi

    # One rl_metrics scrape of 100 zones and 1,000 lines, and what scraping
    # does to the requests served meanwhile (issue #17): a section of the report.
    : >"$TMP/scrape.md"
    if [[ -z ${BENCH_NO_SCRAPE:-} && (-z $ONLY || -n ${BENCH_SCRAPE:-}) ]]; then
        log "a metrics scrape: bench/scrape.sh"
        RL_MODULE=$MODULE NGINX=$NGINX QUICK=$QUICK SCRAPE_OUT=$TMP/scrape.md "$BENCH/scrape.sh" ||
            { FAILED=1; log "FAIL bench/scrape.sh"; }
    fi

    # Instructions per request under callgrind: deterministic where the
    # numbers above are at the mercy of the machine's other load.
    if [[ (-z $QUICK && -z $ONLY && -z ${BENCH_NO_PROFILE:-}) || -n ${BENCH_PROFILE:-} ]]; then
        log "instructions per request: bench/profile.sh (callgrind)"
        RL_MODULE=$MODULE RL_MODULE_NAME=$MODULE_SRC NGINX=$NGINX PROFILE_OUT=$TMP/PROFILE.md \
            "$BENCH/profile.sh" 3000 >"$TMP/profile.log" 2>&1 ||
            { FAILED=1; tail -20 "$TMP/profile.log" >&2; log "FAIL bench/profile.sh"; }
    fi

    local elapsed=$(($(date +%s) - start_s))
    local reportmeta=$TMP/meta
    {
        echo "date	$(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "quick	${QUICK:+1}"
        echo "cpus	$(nproc) ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo))"
        echo "kernel	$(uname -sr)"
        echo "os	$(. /etc/os-release && echo "$PRETTY_NAME")"
        echo "nginx	$("$NGINX" -v 2>&1 | sed 's/^nginx version: //')"
        echo "lua	libnginx-mod-http-lua $(dpkg-query -W -f='${Version}' libnginx-mod-http-lua 2>/dev/null), lua-nginx-redis $LUA_REDIS_VERSION"
        echo "redis	$(redis-server --version | awk '{print $3}' | sed 's/v=//')"
        echo "memcached	$(memcached -V | awk '{print $2}')"
        echo "memcached_stats	${mc_stats:--}"
        echo "wrk	$(dpkg-query -W -f='${Version}' wrk 2>/dev/null)"
        echo "module	$module_info"
        echo "setup	$ROUNDS round(s) of ${SECS}s per scenario in a fresh random order each round, after a warm-up of ${WARM}s per scenario; wrk -t$THREADS -c$CONNS (unless a scenario says otherwise); server on CPU $NGX_CPU (1 nginx worker, and redis-server for the Redis scenarios, memcached for the Memcached ones), wrk alone on CPU $CLIENT_CPU (redis-server too where a group says beside wrk)"
        echo "load	load average $load0 at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
        echo "elapsed	${elapsed}s"
        echo "memz	$MEMZ"
        echo "conns	$CONNS"
        echo "lr_nomem	$(cat "$TMP/mem.lr_nomem" 2>/dev/null || echo -)"
        echo "skip_redis	$SKIP_REDIS"
        echo "skip_memcached	$SKIP_MEMCACHED"
        echo "wakeup	${wake:--}"
    } >"$reportmeta"
    awk -f "$BENCH/report.awk" -v failed="$FAILED" -v prof="$TMP/PROFILE.md" -v scrape="$TMP/scrape.md" "$reportmeta" "$BENCH/scenarios.tsv" "$TMP/raw.tsv" "$TMP/mem.tsv" >"$OUT.tmp" ||
        die "report failed"
    mv "$OUT.tmp" "$OUT"
    if [[ -z $QUICK ]]; then
        # Beside the report: bench/raw-* for bench/RESULTS.md, REPORT-raw-* for
        # another BENCH_OUT (a run of a few rows keeps the full run's files).
        local raw=$BENCH/raw- prof=$BENCH/PROFILE.md
        if ! [[ $OUT -ef $BENCH/RESULTS.md ]]; then raw=${OUT%.md}-raw- prof=${OUT%.md}-PROFILE.md; fi
        cp "$TMP/raw.tsv" "${raw}runs.tsv"
        cp "$reportmeta" "${raw}meta.tsv"
        if [[ -s $TMP/mem.tsv ]]; then cp "$TMP/mem.tsv" "${raw}memory.tsv"; fi
        if [[ -s $TMP/PROFILE.md ]]; then cp "$TMP/PROFILE.md" "$prof"; fi
        if [[ -s $TMP/scrape.md ]]; then cp "$TMP/scrape.md" "${raw}scrape.md"; fi
    fi
    cat "$OUT"
    log "wrote $OUT (${elapsed}s)"
    if ((FAILED)); then
        die "some scenarios are broken (see FAIL above and in $OUT)"
    fi
}

main "$@"
