#!/usr/bin/env bash
# `make run` and the recipes of nginx-conf/ started as their comments say:
# each recipe's documented `make run RUN_CONF=...` (with PORT= and a
# throw-away RUN_DIR=, never port 8080 nor the user's build/run) must pass
# nginx -t, serve on the port asked for and stop with `make stop`; its
# documented raw `nginx -p build/run/ -c ...` form must pass nginx -t from the
# repository root; and `make run` on a port that is taken must say so in one
# line, at once, without starting nginx. Debian's nginx only: that is the
# nginx `make run` starts.
# Usage: bash tests/make_run.sh (make test-make runs it).

set -u
source "$(dirname "${BASH_SOURCE[0]}")/shlib.sh"

TMP=$(mktemp -d /tmp/nginx-rl-make-run.XXXXXX)
HOLDER=

cleanup() {
    local d
    for d in "$TMP"/*/; do
        [[ -f $d/run/nginx.pid ]] && make -C "$ROOT" -s stop RUN_DIR="$d/run" >/dev/null 2>&1
    done
    [[ -n $HOLDER ]] && kill "$HOLDER" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

# The line of a recipe's header comment that starts with "#   $1".
documented() {
    sed -n "s|^#   \($1.*\)|\1|p" "$2" | head -1
}

# recipe FILE: the documented commands of nginx-conf/FILE.
recipe() {
    local file=$1 conf=$ROOT/nginx-conf/$1 dir=$TMP/${1%.conf} cmd raw port out master s
    mkdir -p "$dir"
    cmd=$(documented "make run " "$conf")
    raw=$(documented "nginx -p " "$conf")
    [[ $cmd == "make run RUN_CONF=nginx-conf/$file"* ]] || { fail "$file: no documented make run RUN_CONF=nginx-conf/$file (found: '$cmd')"; return; }
    [[ -n $raw ]] || { fail "$file: no documented nginx -p command"; return; }
    # The command as written, without its optional "[PORT=...]" part.
    cmd=${cmd%% \[*}
    port=$(free_port)
    out=$(cd "$ROOT" && eval "$cmd PORT=$port RUN_DIR=$dir/run" 2>&1) ||
        { fail "$file: '$cmd' failed: $(tail -3 <<< "$out")"; return; }
    grep -q "test is successful" <<< "$out" || fail "$file: no 'test is successful' from nginx -t: $out"
    grep -q "serving nginx-conf/$file on http://127.0.0.1:$port/" <<< "$out" || fail "$file: the message does not name the port: $out"
    master=$(cat "$dir/run/nginx.pid" 2>/dev/null)
    s=$(status_of "$port" /)
    [[ $s != 000 ]] || fail "$file: nothing answers on 127.0.0.1:$port"
    # The raw form, as written from the repository root, on the prefix make
    # run set up (nginx -t: the recipe as it is listens on 8080).
    raw=${raw//build\/run\//$dir/run/}
    raw=${raw/#nginx /\/usr\/sbin\/nginx -t }
    out=$(cd "$ROOT" && eval "$raw" 2>&1) || fail "$file: '$raw' failed: $out"
    make -C "$ROOT" -s stop RUN_DIR="$dir/run" >/dev/null 2>&1
    if [[ -n $master ]] && kill -0 "$master" 2>/dev/null; then
        fail "$file: nginx $master still runs after make stop"
    fi
    [[ $(status_of "$port" /) == 000 ]] || fail "$file: 127.0.0.1:$port still answers after make stop"
}

# A port held by another program: one line naming it, within seconds, and no
# nginx started.
port_taken() {
    local port dir=$TMP/taken start out rc elapsed
    port=$(free_port)
    $PY -c "import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $port)); s.listen(8); time.sleep(120)" &
    HOLDER=$!
    for _ in $(seq 50); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
    start=$(date +%s%N)
    out=$(cd "$ROOT" && make run RUN_CONF=nginx-conf/example.conf PORT=$port RUN_DIR="$dir/run" 2>&1)
    rc=$?
    elapsed=$((($(date +%s%N) - start) / 1000000))
    kill "$HOLDER" 2>/dev/null
    wait "$HOLDER" 2>/dev/null
    HOLDER=
    ((rc != 0)) || fail "make run on a taken port exited 0: $out"
    grep -qx "make run: 127.0.0.1:$port is in use; choose another port: make run PORT=$((port + 1))" <<< "$out" ||
        fail "no one-line error naming 127.0.0.1:$port: $out"
    ((elapsed < 15000)) || fail "the error took $elapsed ms"
    [[ ! -f $dir/run/nginx.pid ]] || fail "nginx was started: $(cat "$dir/run/nginx.pid")"
}

[[ -f $ROOT/build/debian/ngx_http_rl_module.so ]] || { echo "no build/debian/ngx_http_rl_module.so: make build-debian first"; exit 1; }
for conf in "$ROOT"/nginx-conf/*.conf; do
    run_test recipe "$(basename "$conf")"
done
run_test port_taken
summary
