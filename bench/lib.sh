# Helpers the bench scripts share (sourced by run.sh, scrape.sh, soak.sh,
# profile.sh and redis_profile.sh after they set BENCH).

# A loopback port no socket uses, below the kernel's ephemeral range (a port
# in that range may be taken at any time as the local end of a connection),
# and none of the ports given (picked already, not listened on yet).
free_port() {
    local p lo used
    read -r lo _ </proc/sys/net/ipv4/ip_local_port_range
    ((lo > 12000)) || lo=32768
    used=" $(awk 'FNR > 1 { split($2, a, ":"); printf "%d ", strtonum_hex(a[2]) }
        function strtonum_hex(h,    i, n) { n = 0; for (i = 1; i <= length(h); i++) n = n * 16 + index("0123456789ABCDEF", substr(h, i, 1)) - 1; return n }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null) $* "
    for _ in $(seq 200); do
        p=$((10000 + RANDOM % (lo - 10000)))
        [[ $used == *" $p "* ]] && continue
        echo "$p"
        return 0
    done
    return 1
}

# CPU time (ns) a process has used, all its threads.
cpu_ns() {
    local s=0 a f
    for f in /proc/"$1"/task/*/schedstat; do
        read -r a _ <"$f" && s=$((s + a))
    done
    echo "$s"
}

# "busy total": clock ticks CPU $1 has spent so far, busy (neither idle nor
# waiting for I/O; time taken by the hypervisor counts as busy) and in all
# (/proc/stat: user nice system idle iowait irq softirq steal).
cpu_ticks() {
    awk -v c="cpu$1" '$1 == c { t = $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9; print t - $5 - $6, t }' /proc/stat
}

# A server per row: a configuration gives each row a port of its own
# (`listen 127.0.0.1:@PORT_<row>@`, the row being the scenario's path without
# its slash). assign_row_ports FILE [PORT...]: replaces each such placeholder
# in FILE with a free port, none of those given, and prints "row port" a line.
assign_row_ports() {
    local file=$1 row p
    shift
    local taken="$*"
    # (grep finds none in a configuration without such servers: not an error.)
    for row in $({ grep -o '@PORT_[A-Za-z0-9_]*@' "$file" || true; } | sort -u | sed 's/^@PORT_//; s/@$//'); do
        p=$(free_port $taken) || return 1
        taken="$taken $p"
        sed -i "s|@PORT_${row}@|$p|g" "$file"
        echo "$row $p"
    done
}

# row_url INST PATH: the URL a row is asked: a row with a server of its own
# (ROWPORT[INST/row], from assign_row_ports) GET /f on its port, the same
# request for every such row; any other PATH on the instance's port
# (PORT[INST]). Both arrays are the caller's.
row_url() {
    local p=${ROWPORT[$1/${2#/}]:-}
    if [[ -n $p ]]; then echo "http://127.0.0.1:$p/f"; else echo "http://127.0.0.1:${PORT[$1]}$2"; fi
}

# What the two callgrind scripts (profile.sh, redis_profile.sh) start with:
# log and die under the name $1, valgrind installed, and a temp dir TMP
# whose processes (PIDS) are stopped at exit, and which is removed then
# unless PROFILE_KEEP is set or the script failed.
callgrind_workspace() {
    PROFILE_NAME=$1
    log() { printf '[%s %s] %s\n' "$PROFILE_NAME" "$(date +%T)" "$*" >&2; }
    die() { log "ERROR: $*"; exit 1; }
    command -v valgrind >/dev/null || { apt-get install -y -qq valgrind >/dev/null || die "valgrind missing"; }
    TMP=$(mktemp -d "/tmp/nginx-rl-${PROFILE_NAME//_/-}.XXXXXX")
    PIDS=()
    trap callgrind_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

callgrind_cleanup() {
    local rc=$? p
    set +e
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    [[ -n ${PROFILE_KEEP:-} || $rc -ne 0 ]] && log "files kept in $TMP" || rm -rf "$TMP"
    exit "$rc"
}
