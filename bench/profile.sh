#!/usr/bin/env bash
# Instructions per request, scenario by scenario, under valgrind's callgrind:
# deterministic where req/s on a shared machine is not. Writes
# bench/PROFILE.md: instructions per request for the baseline, limit_req and
# nginx-rl, what each limit adds, and the functions where it adds them.
#
#   bench/profile.sh [N]     N requests per scenario (default 3000)
#
# Each nginx runs alone (`master_process off`) under callgrind; collection is
# zeroed before and dumped after each scenario's N requests (curl, one
# keep-alive connection), after a warm-up of 200 requests.
#
# What a limit adds is measured against the same request (same URI, same
# header lengths) to a twin server in the same nginx: a copy of the row's
# server without its limit_req and rl_limit lines, on the same port, reached
# by its name. Each row has a server of its own answering the same URI, so
# that finding the location costs every row the same (in one server, a
# location's place in the tree and the length of its name moved a request by
# up to 420 instructions), but the heap a configuration leaves can make
# glibc's malloc take a longer path on every request (about 125 instructions
# in rl.conf against stock.conf): another nginx would count it as the
# limiter's.

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
MODULE_SRC=${RL_MODULE:-$ROOT/build/debian/ngx_http_rl_module.so}
N=${1:-3000}
OUT=${PROFILE_OUT:-$BENCH/PROFILE.md}

callgrind_workspace profile
chmod 755 "$TMP"

cp "$MODULE_SRC" "$TMP/ngx_http_rl_module.so"
MODULE=$TMP/ngx_http_rl_module.so
mkdir -p "$TMP/html"
# Every row profiled here has a server of its own answering GET /f.
echo "hello from the nginx-rl bench" >"$TMP/html/f"

declare -A PORT VPID ROWPORT
# The twin server's name: as long as "127.0.0.1", so that both Host headers
# (with the port) have the same length.
TWIN=twin.test
start() { # name conf
    local name=$1 dir=$TMP/$1 port
    port=$(free_port ${PORT[*]:-})
    PORT[$name]=$port
    mkdir -p "$dir/tmp"
    for f in common.inc http.inc "$2"; do
        sed -e "s|@DIR@|$dir|g" -e "s|@HTML@|$TMP/html|g" -e "s|@PORT@|$port|g" -e "s|@MODULE@|$MODULE|g" \
            -e "s|@REDIS_PORT@|6379|g" -e "s|@BENCH@|$BENCH|g" -e "s|@MEMZ@|1m|g" "$BENCH/conf/$f" >"$dir/${f/$2/nginx.conf}"
    done
    sed -i 's/^worker_cpu_affinity.*//' "$dir/common.inc"
    local row p
    while read -r row p; do
        ROWPORT[$name/$row]=$p
    done < <(assign_row_ports "$dir/nginx.conf" ${PORT[*]:-} ${ROWPORT[*]:-})
    # The twins: each server block (one line, or from "    server {" to "    }") again, after it,
    # on the same port, without limits.
    awk -v twin="$TWIN" '
        function twin_of(block) {
            gsub(/limit_req zone=[^;]*;|rl_limit [^;]*;|limit_conn [^;]*;|rl_conn [^;]*;/, "", block)
            sub(/ backlog=[0-9]+;/, ";", block)
            sub(/server \{/, "server { server_name " twin ";", block)
            return block
        }
        /^    server \{.*\} *\}$/ { print; print twin_of($0); next }
        /^    server \{/ { in_server = 1; block = "" }
        in_server { block = block $0 "\n" }
        { print }
        in_server && /^    \}/ { in_server = 0; printf "%s", twin_of(block) }' "$dir/nginx.conf" >"$dir/nginx.conf.twin"
    mv "$dir/nginx.conf.twin" "$dir/nginx.conf"
    grep -q "server_name $TWIN;" "$dir/nginx.conf" || die "no twin server in $dir/nginx.conf"
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$dir/cg.%p" \
        "$NGINX" -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log" -g 'daemon off; master_process off;' \
        2>"$dir/valgrind.log" &
    VPID[$name]=$!
    PIDS+=($!)
    for _ in $(seq 300); do
        curl -s -o /dev/null "http://127.0.0.1:$port/" && return 0
        kill -0 "${VPID[$name]}" 2>/dev/null || break
        sleep 0.1
    done
    cat "$dir/valgrind.log" "$dir/error.log" >&2
    die "nginx ($name) under valgrind does not answer"
}

requests() { # url n nkeys [host]
    # Options in a curl config apply to every later URL unless "next" starts a new set.
    awk -v u="$1" -v n="$2" -v k="$3" -v h="${4:-}" 'BEGIN { srand(); for (i = 1; i <= n; i++) {
        if (i > 1) print "next"
        printf "silent\nwrite-out = \"%%{http_code}\\n\"\nurl = \"%s\"\noutput = \"/dev/null\"\n", u
        if (h != "") printf "header = \"Host: %s\"\n", h
        if (k > 0) printf "header = \"X-User: u%d\"\n", int(rand() * k) + 1 } }' >"$TMP/req.cfg"
    curl -K "$TMP/req.cfg" | sort | uniq -c | awk '{ printf "%s%s x %s", s, $1, $2; s = ", " }'
}

# measure NAME PATH NKEYS DUMP [HOST]: Ir/request of N requests, and their statuses.
measure() {
    local name=$1 path=$2 nkeys=$3 dump=$4 host=${5:-} pid=${VPID[$1]} url st total f
    url=$(row_url "$name" "$path")
    callgrind_control -i on "$pid" >/dev/null 2>&1
    requests "$url" 200 "$nkeys" "$host" >/dev/null
    callgrind_control -z "$pid" >/dev/null 2>&1
    st=$(requests "$url" "$N" "$nkeys" "$host")
    callgrind_control -d "${dump##*/}" "$pid" >/dev/null 2>&1
    callgrind_control -i off "$pid" >/dev/null 2>&1
    f=$(ls -t "$TMP/$name"/cg.* | sed -n 1p)
    mv "$f" "$dump"
    total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ && !t { gsub(/,/, "", $1); t = $1 } END { print t }')
    printf '%s\t%s\n' "$((${total:-0} / N))" "$st"
}

# profile NAME ID PATH NKEYS: prints "ID<TAB>Ir/request<TAB>Ir/request of the
# same request to the twin<TAB>statuses"; keeps both dumps (ID.cg, ID.twin.cg).
profile() {
    local name=$1 id=$2 path=$3 nkeys=$4 ir st tw
    # (PROFILE_ONLY: a regex of the rows to run, while working on a few)
    [[ -z ${PROFILE_ONLY:-} || $id =~ $PROFILE_ONLY ]] || return 0
    IFS=$'\t' read -r ir st < <(measure "$name" "$path" "$nkeys" "$TMP/$id.cg")
    IFS=$'\t' read -r tw _ < <(measure "$name" "$path" "$nkeys" "$TMP/$id.twin.cg" "$TWIN:${PORT[$name]}")
    printf '%s\t%s\t%s\t%s\n' "$id" "$ir" "$tw" "$st"
    log "$id: $ir instructions/request, $((ir - tw)) over the same request without a limit ($st)"
}

log "starting nginx under callgrind"
start stock stock.conf
start rl rl.conf
: >"$TMP/ir.tsv"
profile stock baseline /baseline 0 >>"$TMP/ir.tsv"
profile stock limit_req /lr_admit 0 >>"$TMP/ir.tsv"
profile stock limit_req_reject /lr_reject 0 >>"$TMP/ir.tsv"
profile stock limit_req_k1m /lr_k1m 1000000 >>"$TMP/ir.tsv"
profile stock limit_conn /lc_admit 0 >>"$TMP/ir.tsv"
# limit_req in the nginx that loads the module: the reference of the rows
# below in the same process (the same heap).
profile rl limit_req_rl /lr_admit 0 >>"$TMP/ir.tsv"
profile rl limit_req_reject_rl /lr_reject 0 >>"$TMP/ir.tsv"
profile rl limit_req_k1m_rl /lr_k1m 1000000 >>"$TMP/ir.tsv"
profile rl limit_conn_rl /lc_admit 0 >>"$TMP/ir.tsv"
# A location without limits in the nginx that loads the module, against the
# same request to stock nginx: what the module costs every request.
if [[ -e $TMP/baseline.cg ]]; then
    IFS=$'\t' read -r ir st < <(measure rl /baseline 0 "$TMP/rl_loaded_no_limit.cg")
    cp "$TMP/baseline.cg" "$TMP/rl_loaded_no_limit.twin.cg"
    printf 'rl_loaded_no_limit\t%s\t%s\t%s\n' "$ir" "$(awk -F'\t' '$1 == "baseline" { print $2 }' "$TMP/ir.tsv")" "$st" >>"$TMP/ir.tsv"
fi
profile rl rl_gcra_no_headers /gcra_admit_noheaders 0 >>"$TMP/ir.tsv"
profile rl rl_sliding_no_headers /sliding_admit_noheaders 0 >>"$TMP/ir.tsv"
for a in fixed sliding sliding_log token_bucket leaky_bucket gcra; do
    profile rl "rl_$a" "/${a}_admit" 0 >>"$TMP/ir.tsv"
done
# A plan's rate from a map, beside the same static line (rl_gcra).
profile rl rl_gcra_map /gcra_map_admit 0 >>"$TMP/ir.tsv"
profile rl rl_gcra_reject /gcra_reject 0 >>"$TMP/ir.tsv"
profile rl rl_gcra_reject_no_headers /gcra_reject_noheaders 0 >>"$TMP/ir.tsv"
profile rl rl_sliding_reject /sliding_reject 0 >>"$TMP/ir.tsv"
profile rl rl_gcra_k1m /gcra_k1m 1000000 >>"$TMP/ir.tsv"
profile rl rl_sliding_k1m /sliding_k1m 1000000 >>"$TMP/ir.tsv"
profile rl rl_token_bucket_k1m /token_bucket_k1m 1000000 >>"$TMP/ir.tsv"
# rl_conn beside limit_conn (#39): one key, never refused.
profile rl rl_conn_no_headers /conn_admit_noheaders 0 >>"$TMP/ir.tsv"
profile rl rl_conn /conn_admit 0 >>"$TMP/ir.tsv"
# The same line with two classes and a reserve (#39 §2): what classes cost.
profile rl rl_conn_classes_no_headers /conn_classes_noheaders 0 >>"$TMP/ir.tsv"

selfcost() { # dump: "instructions/request<TAB>function" per function (self cost)
    callgrind_annotate --auto=no --threshold=100 "$1" 2>/dev/null | awk -v n="$N" -v root="$ROOT/" '
        /^ *[0-9,]+ / && / [^ ]*:[^ ]/ { x = $1; gsub(/,/, "", x); $1 = ""; sub(/^ *(\([ 0-9.]+%\))? */, "")
            gsub(/\[\/tmp[^]]*\]/, "[ngx_http_rl_module.so]"); sub(/^\/rustc\/[0-9a-f]+\/library\//, "std:")
            if (index($0, root) == 1) $0 = substr($0, length(root) + 1)
            sub(/^\/[^ :]*\/rl-core\/src\//, "rl-core/src/"); sub(/^\/[^ :]*\/registry\/src\/[^\/]+\//, "")
            print x / n "\t" $0 }'
}
added() { # id: "instructions/request<TAB>function": what the limit adds, per function
    { selfcost "$TMP/$1.cg" | sed 's/^/+\t/'; selfcost "$TMP/$1.twin.cg" | sed 's/^/-\t/'; } |
        awk -F'\t' '{ v[$3] += ($1 == "+") ? $2 : -$2 } END { for (k in v) printf "%.1f\t%s\n", v[k], k }'
}
modsum() { # id: what the limit adds in the module's own code (nginx-rl's functions and what they inline)
    { selfcost "$TMP/$1.cg" | sed 's/^/+\t/'; selfcost "$TMP/$1.twin.cg" | sed 's/^/-\t/'; } |
        awk -F'\t' '$3 ~ /ngx_http_rl_module|rl_core|aes::/ { s += ($1 == "+") ? $2 : -$2 } END { printf "%d\n", s }'
}
: >"$TMP/mod.tsv"
while IFS=$'\t' read -r id _; do
    [[ $id == rl_* && $id != rl_loaded_no_limit ]] && printf '%s\t%s\n' "$id" "$(modsum "$id")" >>"$TMP/mod.tsv"
done <"$TMP/ir.tsv"

{
    echo "# nginx-rl: instructions per request (callgrind)"
    echo
    echo "Generated by \`bench/profile.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'): $("$NGINX" -v 2>&1 | sed 's/.*: //'),"
    echo "module ${RL_MODULE_NAME:-$MODULE_SRC} (sha256 $(sha256sum "$MODULE" | cut -c1-12)). One nginx process under valgrind's callgrind,"
    echo "$N sequential keep-alive requests per scenario after 200 of warm-up (the configurations of \`make bench\`)."
    echo "Instruction counts are deterministic, unlike req/s on a shared machine; they do not count cache misses."
    echo
    echo "What a limit adds is counted against the same request (same URI, headers of the same length) to a"
    echo "twin server in the same nginx, without limits: a longer URI or a deeper location costs instructions"
    echo "of its own, and so can the heap another configuration leaves to malloc. \`baseline\` shows the"
    echo "method's noise; \`rl_loaded_no_limit\` is a server without \`rl_limit\` in the nginx that loads the"
    echo "module, against \`baseline\` (stock nginx): what the module costs every request, its hooks and"
    echo "whatever malloc's path costs in its heap. \`*_rl\`: limit_req in the nginx that loads the module (the"
    echo "same process and heap as the nginx-rl rows). \`*_no_headers\`: \`rl_headers off\`; the other rows send"
    echo "the default legacy headers. \"Of them in nginx-rl's code\": the self cost of the module's own functions"
    echo "(and of what they inline) over the twin's: the part of the addition that heap layout does not move."
    echo
    echo "| scenario | instructions/request | the same request without a limit | added by the limit | of them in nginx-rl's code | x limit_req's addition | statuses |"
    echo "|---|--:|--:|--:|--:|--:|---|"
    awk -F'\t' 'FNR == NR { mod[$1] = $2; next }
        { id[++n] = $1; ir[n] = $2; pl[n] = $3; st[n] = $4; add[$1] = $2 - $3 }
        END { for (i = 1; i <= n; i++) {
            ref = (id[i] ~ /_k1m$/) ? "limit_req_k1m" : (id[i] ~ /^rl_conn/) ? "limit_conn" : "limit_req"; r = "-"
            if (id[i] ~ /^rl_/ && id[i] !~ /_reject|^rl_loaded/ && add[ref] > 0) r = sprintf("%.2f", add[id[i]] / add[ref])
            m = (id[i] in mod) ? sprintf("%+d", mod[id[i]]) : "-"
            printf "| `%s` | %d | %d | %+d | %s | %s | %s |\n", id[i], ir[i], pl[i], ir[i] - pl[i], m, r, st[i] } }' "$TMP/mod.tsv" "$TMP/ir.tsv"
    echo
    echo "Goals: with \`rl_headers off\` nginx-rl adds no more instructions than limit_req, with the legacy"
    echo "headers no more than twice as many (the structure issue); an \`rl_conn\` line adds at most 1.2 times"
    echo "what limit_conn adds (#39)."
    echo
    echo "| goal | measured | |"
    echo "|---|---|---|"
    awk -F'\t' '{ add[$1] = $2 - $3 }
        function goal(id, x, ref, what) {
            if (!(id in add) || !(ref in add)) return
            printf "| `%s` adds <= %s%s'"'"'s instructions (%s) | %+d vs %+d (%.2fx) | %s |\n", id, x == 1 ? "" : x " x ", ref, what,
                add[id], add[ref], add[id] / add[ref], add[id] <= x * add[ref] ? "met" : "**NOT met**" }
        END { goal("rl_gcra_no_headers", 1, "limit_req", "headers off"); goal("rl_sliding_no_headers", 1, "limit_req", "headers off")
              goal("rl_gcra", 2, "limit_req", "legacy headers"); goal("rl_sliding", 2, "limit_req", "legacy headers")
              goal("rl_conn_no_headers", 1.2, "limit_conn", "headers off"); goal("rl_conn", 1.2, "limit_conn", "legacy headers") }' "$TMP/ir.tsv"
    for pair in "rl_conn_no_headers limit_conn" "rl_gcra_no_headers limit_req" "rl_gcra limit_req" "rl_gcra_reject limit_req_reject" "rl_gcra_reject_no_headers limit_req_reject" "rl_gcra_k1m limit_req_k1m" \
        "rl_loaded_no_limit baseline"; do
        read -r a b <<<"$pair"
        [[ -e $TMP/$a.cg && -e $TMP/$b.cg ]] || continue
        echo
        echo "## Where \`$a\` and \`$b\` add their instructions"
        echo
        echo "Self cost per request by function, each scenario minus the same request without a limit (A: \`$a\`,"
        echo "B: \`$b\`); the functions where either adds or saves 10 or more, largest first (the module's inlined"
        echo "code is listed once per source file and function it is inlined into)."
        echo
        echo '```'
        printf '%8s %8s  %s\n' A B function
        { added "$a" | sed 's/^/A\t/'; added "$b" | sed 's/^/B\t/'; } | awk -F'\t' '
            { if ($1 == "A") va[$3] = $2; else vb[$3] = $2; k[$3] = 1 }
            END { for (f in k) if (va[f] >= 10 || va[f] <= -10 || vb[f] >= 10 || vb[f] <= -10)
                printf "%.0f\t%+8.0f %+8.0f  %s\n", (va[f] ^ 2 > vb[f] ^ 2) ? va[f] ^ 2 : vb[f] ^ 2, va[f], vb[f], f }' |
            sort -t"$(printf '\t')" -k1,1nr | cut -f2- | awk 'NR <= 40'
        echo '```'
    done
} >"$OUT"
cat "$OUT"
log "wrote $OUT"
