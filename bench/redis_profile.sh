#!/usr/bin/env bash
# Instructions a Redis zone's script costs redis-server, under valgrind's
# callgrind: per request of a call carrying one request, per request of a
# call carrying 64, and the OpenResty peer's script (bench/lua/rlpeer.lua,
# EVALSHA of its fixed window) per request. Writes bench/REDIS_PROFILE.md.
#
#   bench/redis_profile.sh [N]   N calls of one request per row (default 8000)
#
# redis-server (Debian's, /usr/bin/redis-server) runs alone under callgrind
# on a free loopback port, without persistence, `hz 1` (its cron's work,
# counted with everything else, stays small). Our library is loaded as
# nginx-rl loads it (FUNCTION LOAD of rl-core's function_library()), and the
# FCALLs are those nginx-rl sends, keys and arguments written by rl-core's
# own write_state_key and write_args (rl-core/examples/redis_calls.rs): the
# admit path of bench/conf/rlredis.conf, 1,000 clients, Redis' clock, a
# deadline. The peer's script is the text of rlpeer.lua's FIXED, called by
# EVALSHA with its arguments, as `make bench` calls it. Up to 1,000 keys,
# each HITS times in a row (below).
#
# A small client (python3, one connection) sends each row's calls one at a
# time, each after the reply to the one before, as a worker whose requests
# come one at a time does. Each row runs once to warm up (its keys exist,
# as in the bench's steady state; its calls named apart, so that the
# measured ones are not repeats answered from the script's memo), then
# again between `callgrind_control -z` and `-d`; the row's cost is the dump's total less that of as many
# PINGs sent the same way (the request's read, dispatch and reply that any
# command costs), divided by the requests.

set -Eeuo pipefail
export LC_ALL=C
BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
ROOT=$(dirname "$BENCH")
REDIS_SERVER=${REDIS_SERVER:-/usr/bin/redis-server}
PYTHON=${PYTHON:-/usr/bin/python3}
CARGO=${CARGO:-cargo}
N=${1:-8000}
CLIENTS=1000
# Each client's key HITS calls in a row: as the bench's 1,000-client rows
# hit each key about 8 times a second (7,000 to 9,000 req/s), so that about
# one write in 8 sets a key's expiry (the peer's PEXPIRE on a window's first
# hit, our SET ... PX about once a second), the others only update the value
# (INCR; SETRANGE), however slowly callgrind runs the calls.
HITS=8
OUT=${REDIS_PROFILE_OUT:-$BENCH/REDIS_PROFILE.md}

callgrind_workspace redis_profile
[[ -x $REDIS_SERVER ]] || die "no $REDIS_SERVER (apt-get install redis-server)"

log "building rl-core/examples/redis_calls"
(cd "$ROOT" && "$CARGO" build -q -p rl-core --release --example redis_calls) || die "cargo build failed"
CALLS=$(cd "$ROOT" && "$CARGO" metadata --format-version 1 --no-deps 2>/dev/null |
    sed 's/.*"target_directory":"\([^"]*\)".*/\1/')/release/examples/redis_calls
[[ -x $CALLS ]] || die "no $CALLS"

# The client: `client.py PORT FILE...` sends each file's commands (a command
# a line, its words separated by tabs), each after the reply to the one
# before, and fails on an error reply; `client.py PORT -ping N` sends N PINGs.
cat >"$TMP/client.py" <<'EOF'
import socket, sys

def command(words):
    out = [b"*%d\r\n" % len(words)]
    for w in words:
        w = w.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(w), w))
    return b"".join(out)

class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
    def line(self):
        while b"\r\n" not in self.buf:
            got = self.s.recv(65536)
            if not got:
                raise SystemExit("connection closed")
            self.buf += got
        l, self.buf = self.buf.split(b"\r\n", 1)
        return l
    def bulk(self, n):
        while len(self.buf) < n + 2:
            self.buf += self.s.recv(65536)
        b, self.buf = self.buf[:n], self.buf[n + 2:]
        return b
    def reply(self):
        l = self.line()
        t, rest = l[:1], l[1:]
        if t == b"-":
            raise SystemExit("error reply: " + rest.decode())
        if t == b"*":
            return [self.reply() for _ in range(int(rest))]
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self.bulk(n)
        if t == b":":
            return int(rest)
        return rest
    def call(self, words):
        self.s.sendall(command(words))
        return self.reply()

c = Conn(int(sys.argv[1]))
args = sys.argv[2:]
# -warm: the warm-up run, whose calls are named apart (a memo key, ":c:",
# gets a suffix), so that the measured run's calls are not repeats of them
# (the script answers a repeat from its memo, writing nothing).
warm = args[:1] == ["-warm"]
if warm:
    args = args[1:]
if args[0] == "-ping":
    for _ in range(int(args[1])):
        c.call(["PING"])
else:
    for f in args:
        with open(f) as fh:
            for l in fh:
                words = l.rstrip("\n").split("\t")
                if warm:
                    words = [w + "w" if ":c:" in w else w for w in words]
                c.call(words)
EOF

# The peer's fixed window: the text between rlpeer.lua's `local FIXED = [[`
# and `]]` (Lua drops the newline right after `[[`).
sed -n '/^local FIXED = \[\[$/,/^\]\]$/p' "$BENCH/lua/rlpeer.lua" | sed '1d;$d' >"$TMP/peer.lua"
[[ -s $TMP/peer.lua ]] || die "no FIXED script in bench/lua/rlpeer.lua"
PEER_SHA=$(sha1sum "$TMP/peer.lua" | cut -d' ' -f1)

"$CALLS" library >"$TMP/library.lua"
# Floors: the same FCALLs (keys and arguments) of a function that does
# nothing, and of a throwaway one that does only what the fixed row needs
# (TIME, GET, the window, SETRANGE, the reply; no checks of the stored state,
# no expiry, no shared keys), on keys of their own.
cat >"$TMP/floor.lua" <<'LUA'
#!lua name=rl_floor
local pack, unpack_
redis.register_function('rl_floor_call', function(keys, args) return 1 end)
redis.register_function('rl_floor_fixed', function(keys, args)
  if not pack then pack, unpack_ = struct.pack, struct.unpack end
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local v = redis.call('GET', keys[1])
  local s1, s2, x = 0, 0, 0
  if v and #v == 33 then
    local m
    m, s1, s2, x = unpack_('<Bddd', v)
  end
  local W = 656
  local k = now / W
  k = k - k % 1
  local used = 0
  if s1 >= 1 and s1 - 1 >= k then used = s2 end
  redis.call('SETRANGE', keys[1], '0', pack('<Bddd', 0, k + 1, used + 1, x))
  return { now, 65536 - used - 1, (k + 1) * W - now, -2, 0, 0 }
end)
LUA
# The calls: ours with one request (fixed, gcra), with 64 (fixed, gcra); the
# peer's EVALSHA (its arguments as bench/conf/lua.conf gives them).
"$CALLS" fcall fixed 1 "$CLIENTS" "$N" "$HITS" >"$TMP/fixed_1.txt"
"$CALLS" fcall gcra 1 "$CLIENTS" "$N" "$HITS" >"$TMP/gcra_1.txt"
B=$((N / 64 < 64 ? 64 : N / 64))
"$CALLS" fcall fixed 64 "$CLIENTS" "$B" "$HITS" >"$TMP/fixed_64.txt"
"$CALLS" fcall gcra 64 "$CLIENTS" "$B" "$HITS" >"$TMP/gcra_64.txt"
FN=$(sed -n 's/^#!lua name=//p' "$TMP/library.lua")
for f in call fixed; do
    sed "s/^FCALL\t$FN\t/FCALL\trl_floor_$f\t/; s/\trl:{/\tfl:{/" "$TMP/fixed_1.txt" >"$TMP/floor_$f.txt"
done
awk -v n="$N" -v k="$CLIENTS" -v h="$HITS" -v sha="$PEER_SHA" \
    'BEGIN { for (i = 0; i < n; i++) printf "EVALSHA\t%s\t1\trlpeer:fw:user-%d\t1000000000000\t1000\n", sha, int(i / h) % k }' >"$TMP/peer.txt"

PORT=$(free_port)
log "starting redis-server under callgrind on 127.0.0.1:$PORT"
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/cg.%p" \
    "$REDIS_SERVER" --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --hz 1 \
    --dir "$TMP" --logfile "$TMP/redis.log" 2>"$TMP/valgrind.log" &
VPID=$!
PIDS+=("$VPID")
for _ in $(seq 300); do
    redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
    kill -0 "$VPID" 2>/dev/null || { cat "$TMP/valgrind.log" >&2; die "redis-server under valgrind exited"; }
    sleep 0.1
done
redis-cli -p "$PORT" ping >/dev/null 2>&1 || die "redis-server under valgrind does not answer"
redis-cli -p "$PORT" -x function load replace <"$TMP/library.lua" >/dev/null || die "FUNCTION LOAD failed"
redis-cli -p "$PORT" -x function load replace <"$TMP/floor.lua" >/dev/null || die "FUNCTION LOAD of the floors failed"
[[ $(redis-cli -p "$PORT" -x script load <"$TMP/peer.lua") == "$PEER_SHA" ]] || die "SCRIPT LOAD of the peer's script"

# measure ID CALLS ARGS...: "ID<TAB>calls<TAB>total instructions" of the
# client run with ARGS, after one run of warm-up.
measure() {
    local id=$1 calls=$2 f total
    shift 2
    callgrind_control -i on "$VPID" >/dev/null 2>&1
    "$PYTHON" "$TMP/client.py" "$PORT" -warm "$@" || die "$id: warm-up failed"
    redis-cli -p "$PORT" config resetstat >/dev/null
    callgrind_control -z "$VPID" >/dev/null 2>&1
    "$PYTHON" "$TMP/client.py" "$PORT" "$@" || die "$id: the client failed"
    callgrind_control -d "$id" "$VPID" >/dev/null 2>&1
    callgrind_control -i off "$VPID" >/dev/null 2>&1
    # The commands the calls ran (the scripts' own), per call.
    redis-cli -p "$PORT" info commandstats | tr -d '\r' |
        awk -F'[_:=,]' -v n="$calls" '/^cmdstat_/ && $2 !~ /^config/ { printf "%s%s %.2f", s, toupper($2), $4 / n; s = ", " }' >"$TMP/$id.cmds"
    f=$(ls -t "$TMP"/cg.* | sed -n 1p)
    mv "$f" "$TMP/$id.cg"
    total=$(awk '/^(summary|totals):/ { print $2; exit }' "$TMP/$id.cg")
    [[ -n $total ]] || die "$id: no total in the dump"
    printf '%s\t%s\t%s\n' "$id" "$calls" "$total"
    log "$id: $((total / calls)) instructions a call"
}

: >"$TMP/ir.tsv"
measure ping "$N" -ping "$N" >>"$TMP/ir.tsv"
measure fixed_1 "$N" "$TMP/fixed_1.txt" >>"$TMP/ir.tsv"
measure gcra_1 "$N" "$TMP/gcra_1.txt" >>"$TMP/ir.tsv"
measure fixed_64 "$B" "$TMP/fixed_64.txt" >>"$TMP/ir.tsv"
measure gcra_64 "$B" "$TMP/gcra_64.txt" >>"$TMP/ir.tsv"
measure peer "$N" "$TMP/peer.txt" >>"$TMP/ir.tsv"
measure floor_call "$N" "$TMP/floor_call.txt" >>"$TMP/ir.tsv"
measure floor_fixed "$N" "$TMP/floor_fixed.txt" >>"$TMP/ir.tsv"

# The functions of a row by self cost per request, less the PING's.
functions() { # id requests-per-call
    local id=$1 per=$2
    { callgrind_annotate --auto=no --threshold=99 "$TMP/$id.cg" 2>/dev/null | sed 's/^/+ /'
      callgrind_annotate --auto=no --threshold=99 "$TMP/ping.cg" 2>/dev/null | sed 's/^/- /'; } |
        awk -v calls="$(awk -v i="$id" '$1 == i { print $2 }' "$TMP/ir.tsv")" -v pc="$(awk '$1 == "ping" { print $2 }' "$TMP/ir.tsv")" -v per="$per" '
        $2 ~ /^[0-9,]+$/ && NF >= 3 { x = $2; gsub(/,/, "", x); s = $1; $1 = ""; $2 = ""; sub(/^ *(\([ 0-9.]+%\))? */, "")
            v[$0] += (s == "+") ? x / calls / per : -x / pc / per }
        END { for (f in v) if (f != "PROGRAM TOTALS" && (v[f] >= 100 || v[f] <= -100)) printf "%.0f\t%s\n", v[f], f }' |
        sort -k1,1nr | awk 'NR <= 20'
}

{
    echo "# nginx-rl: what a Redis zone's script costs redis-server (callgrind)"
    echo
    echo "Generated by \`bench/redis_profile.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'): $("$REDIS_SERVER" --version | sed 's/ sha=.*//'),"
    echo "script $(sed -n 's/^#!lua name=//p' "$TMP/library.lua") (rl-core/src/redis/limit.lua at $(cd "$ROOT" && git log -1 --format=%h -- rl-core/src/redis/limit.lua rl-core/src/redis/lease.lua rl-core/src/redis.rs)$(cd "$ROOT" && git diff --quiet HEAD -- rl-core/src/redis/limit.lua rl-core/src/redis/lease.lua rl-core/src/redis.rs || echo ', modified')). One redis-server under"
    echo "valgrind's callgrind, \`hz 1\`, no persistence; each row's calls sent one at a time by one client, after a warm-up"
    echo "run of the same calls; up to $CLIENTS clients, each client's key $HITS calls in a row (as the 1,000-client rows of"
    echo "\`make bench\` hit each about 8 times a second: the rare writes that set an expiry as rare as there). Instructions per request, less those of a PING sent the"
    echo "same way (reading, dispatching and answering any command). Instruction counts are deterministic, unlike"
    echo "CPU time on a shared machine; they do not count cache misses."
    echo
    echo "Ours: FCALL of the function library, as nginx-rl sends it (rl-core's write_args: Redis' clock, a deadline,"
    echo "committing), the admit path of bench/conf/rlredis.conf (\`rate=100000000r/s burst=65536\`). Peer:"
    echo "EVALSHA of bench/lua/rlpeer.lua's fixed window (INCR, PEXPIRE on a window's first hit). Floors: \`fixed_1\`'s"
    echo "FCALLs (the same keys and arguments) of a function that returns at once (\`floor_call\`: what FCALL and its"
    echo "arguments cost), and of a throwaway one that does only what the \`fixed\` row needs (\`floor_fixed\`: TIME, GET,"
    echo "the window, SETRANGE, the same reply; no checks of the stored state, no expiry, no shared keys)."
    echo
    echo "| row | calls | requests a call | instructions a call | less a PING | per request | commands a call |"
    echo "|---|--:|--:|--:|--:|--:|---|"
    while IFS=$'\t' read -r id _; do printf '%s\t%s\n' "$id" "$(cat "$TMP/$id.cmds")"; done <"$TMP/ir.tsv" >"$TMP/cmds.tsv"
    awk -F'\t' 'FNR == NR { cmds[$1] = $2; next } $1 == "ping" { p = $3 / $2 } { id[++n] = $1; c[n] = $2; t[n] = $3 }
        END { for (i = 1; i <= n; i++) { per = (id[i] ~ /_64$/) ? 64 : 1; a = t[i] / c[i]; d = (id[i] == "ping") ? a : a - p
            printf "| `%s` | %d | %d | %.0f | %.0f | %.0f | %s |\n", id[i], c[i], per, a, d, d / per, cmds[id[i]] } }' "$TMP/cmds.tsv" "$TMP/ir.tsv"
    echo
    echo "Goal (issue #37): \`fixed_1\` per request no more than \`peer\`; \`fixed_64\` per request no more than before."
    for r in "fixed_1 1" "fixed_64 64" "peer 1"; do
        read -r id per <<<"$r"
        echo
        echo "## \`$id\`: self cost per request by function, less a PING's"
        echo
        echo '```'
        functions "$id" "$per"
        echo '```'
    done
} >"$OUT"
cat "$OUT"
log "wrote $OUT"
