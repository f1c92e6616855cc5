#!/usr/bin/env bash
# Instructions per request, scenario by scenario, under valgrind's callgrind:
# deterministic where req/s on a shared machine is not. Writes
# bench/PROFILE.md: instructions per request for the baseline, limit_req and
# nginx-rl, and the functions where nginx-rl spends its share.
#
#   bench/profile.sh [N]     N requests per scenario (default 3000)
#
# Each nginx runs alone (`master_process off`) under callgrind; collection is
# zeroed before and dumped after each scenario's N requests (curl, one
# keep-alive connection), after a warm-up of 200 requests.

set -Eeuo pipefail
export LC_ALL=C
BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH")
NGINX=${NGINX:-/usr/sbin/nginx}
MODULE_SRC=${RL_MODULE:-$ROOT/build/debian/ngx_http_rl_module.so}
N=${1:-3000}
OUT=${PROFILE_OUT:-$BENCH/PROFILE.md}

log() { printf '[profile %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
command -v valgrind >/dev/null || { apt-get install -y -qq valgrind >/dev/null || die "valgrind missing"; }

TMP=$(mktemp -d /tmp/nginx-rl-profile.XXXXXX)
chmod 755 "$TMP"
PIDS=()
cleanup() {
    local rc=$? p
    set +e
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    [[ -n ${PROFILE_KEEP:-} || $rc -ne 0 ]] && log "files kept in $TMP" || rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cp "$MODULE_SRC" "$TMP/ngx_http_rl_module.so"
MODULE=$TMP/ngx_http_rl_module.so
mkdir -p "$TMP/html"
while IFS=$'\t' read -r id inst path _; do
    [[ -z $id || $id == \#* ]] && continue
    echo "hello from the nginx-rl bench" >"$TMP/html/${path#/}"
done <"$BENCH/scenarios.tsv"
echo "hello from the nginx-rl bench" >"$TMP/html/gcra_admit_noheaders"

free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
    done
    return 1
}

declare -A PORT VPID
start() { # name conf
    local name=$1 dir=$TMP/$1 port
    port=$(free_port)
    PORT[$name]=$port
    mkdir -p "$dir/tmp"
    for f in common.inc http.inc "$2"; do
        sed -e "s|@DIR@|$dir|g" -e "s|@HTML@|$TMP/html|g" -e "s|@PORT@|$port|g" -e "s|@MODULE@|$MODULE|g" \
            -e "s|@REDIS_PORT@|6379|g" -e "s|@BENCH@|$BENCH|g" -e "s|@MEMZ@|1m|g" "$BENCH/conf/$f" >"$dir/${f/$2/nginx.conf}"
    done
    sed -i 's/^worker_cpu_affinity.*//' "$dir/common.inc"
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$dir/cg.%p" \
        "$NGINX" -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log" -g 'daemon off; master_process off;' \
        2>"$dir/valgrind.log" &
    VPID[$name]=$!
    PIDS+=($!)
    for _ in $(seq 300); do
        curl -s -o /dev/null "http://127.0.0.1:$port/" && return 0
        sleep 0.1
    done
    cat "$dir/valgrind.log" "$dir/error.log" >&2
    die "nginx ($name) under valgrind does not answer"
}

requests() { # url n
    # Options in a curl config apply to every later URL unless "next" starts a new set.
    awk -v u="$1" -v n="$2" -v k="$3" 'BEGIN { srand(); for (i = 1; i <= n; i++) {
        if (i > 1) print "next"
        printf "silent\nwrite-out = \"%%{http_code}\\n\"\nurl = \"%s\"\noutput = \"/dev/null\"\n", u
        if (k > 0) printf "header = \"X-User: u%d\"\n", int(rand() * k) + 1 } }' >"$TMP/req.cfg"
    curl -K "$TMP/req.cfg" | sort | uniq -c | awk '{ printf "%s%s x %s", s, $1, $2; s = ", " }'
}

# profile NAME ID PATH NKEYS: prints "ID<TAB>Ir/request<TAB>statuses"; keeps the dump.
profile() {
    local name=$1 id=$2 path=$3 nkeys=$4 pid=${VPID[$1]} url st total
    url="http://127.0.0.1:${PORT[$name]}$path"
    callgrind_control -i on "$pid" >/dev/null 2>&1
    requests "$url" 200 "$nkeys" >/dev/null
    callgrind_control -z "$pid" >/dev/null 2>&1
    st=$(requests "$url" "$N" "$nkeys")
    callgrind_control -d "$id" "$pid" >/dev/null 2>&1
    callgrind_control -i off "$pid" >/dev/null 2>&1
    local f
    f=$(ls -t "$TMP/$name"/cg.* | sed -n 1p)
    mv "$f" "$TMP/$id.cg"
    total=$(callgrind_annotate "$TMP/$id.cg" 2>/dev/null | awk '/PROGRAM TOTALS/ && !t { gsub(/,/, "", $1); t = $1 } END { print t }')
    total=${total:-0}
    printf '%s\t%s\t%s\n' "$id" "$((total / N))" "$st"
    log "$id: $((total / N)) instructions/request ($st)"
}

log "starting nginx under callgrind"
start stock stock.conf
start rl rl.conf
: >"$TMP/ir.tsv"
profile stock baseline /baseline 0 >>"$TMP/ir.tsv"
profile stock limit_req /lr_admit 0 >>"$TMP/ir.tsv"
profile stock limit_req_reject /lr_reject 0 >>"$TMP/ir.tsv"
profile stock limit_req_k1m /lr_k1m 1000000 >>"$TMP/ir.tsv"
profile rl rl_loaded_no_limit /baseline 0 >>"$TMP/ir.tsv"
profile rl rl_gcra_no_headers /gcra_admit_noheaders 0 >>"$TMP/ir.tsv"
for a in fixed sliding sliding_log token_bucket leaky_bucket gcra; do
    profile rl "rl_$a" "/${a}_admit" 0 >>"$TMP/ir.tsv"
done
profile rl rl_gcra_reject /gcra_reject 0 >>"$TMP/ir.tsv"
profile rl rl_sliding_reject /sliding_reject 0 >>"$TMP/ir.tsv"
profile rl rl_gcra_k1m /gcra_k1m 1000000 >>"$TMP/ir.tsv"
profile rl rl_sliding_k1m /sliding_k1m 1000000 >>"$TMP/ir.tsv"
profile rl rl_token_bucket_k1m /token_bucket_k1m 1000000 >>"$TMP/ir.tsv"

base=$(awk -F'\t' '$1 == "baseline" { print $2 }' "$TMP/ir.tsv")
{
    echo "# nginx-rl: instructions per request (callgrind)"
    echo
    echo "Generated by \`bench/profile.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'): $("$NGINX" -v 2>&1 | sed 's/.*: //'),"
    echo "module ${RL_MODULE_NAME:-$MODULE_SRC} (sha256 $(sha256sum "$MODULE" | cut -c1-12)). One nginx process under valgrind's callgrind,"
    echo "$N sequential keep-alive requests per scenario after 200 of warm-up (the configurations of \`make bench\`)."
    echo "Instruction counts are deterministic, unlike req/s on a shared machine; they do not count cache misses."
    echo
    echo "| scenario | instructions/request | added over the baseline | statuses |"
    echo "|---|--:|--:|---|"
    awk -F'\t' -v b="$base" '{ printf "| `%s` | %d | %s | %s |\n", $1, $2, ($1 == "baseline") ? "-" : sprintf("%+d", $2 - b), $3 }' "$TMP/ir.tsv"
    selfcost() { # id: "instructions/request<TAB>function" per function (self cost)
        callgrind_annotate --auto=no --threshold=100 "$TMP/$1.cg" 2>/dev/null | awk -v n="$N" '
            /^ *[0-9,]+ / && / [^ ]*:[^ ]/ { x = $1; gsub(/,/, "", x); $1 = ""; sub(/^ *(\([ 0-9.]+%\))? */, "")
                gsub(/\[\/tmp[^]]*\]/, "[ngx_http_rl_module.so]"); sub(/^\/rustc\/[0-9a-f]+\/library\//, "std:"); print x / n "\t" $0 }'
    }
    for pair in "rl_gcra limit_req" "rl_gcra_reject limit_req_reject" "rl_gcra_k1m limit_req_k1m"; do
        read -r a b <<<"$pair"
        echo
        echo "## Where \`$a\` spends more than \`$b\`"
        echo
        echo "Self cost per request by function, the largest differences ($a minus $b; functions of the module"
        echo "with inlined code are listed once per source file)."
        echo
        echo '```'
        { selfcost "$a" | sed 's/^/A\t/'; selfcost "$b" | sed 's/^/B\t/'; } | awk -F'\t' '
            { v[$3] += ($1 == "A") ? $2 : -$2 }
            END { for (k in v) if (v[k] >= 10 || v[k] <= -10) printf "%+8.0f  %s\n", v[k], k }' | sort -rn | awk 'NR <= 30'
        echo '```'
    done
} >"$OUT"
cat "$OUT"
log "wrote $OUT"
