#!/usr/bin/env bash
# A rebuild while nginx runs the built module: nginx has the module's file
# mapped, so a build that wrote the new module into that same file (cp onto
# it) changed the code under the running workers, which then died on
# SIGSEGV or SIGBUS with every request. Each build target must put a new file
# in place (a new inode) instead; nginx keeps the old one until it reloads.
#
# Runs nginx (Debian's, and the vendored nginx 1.28 where it was built) on
# the built module, rebuilds, and checks that nginx still answers and that no
# worker exited on a signal. Leaves the tree as it found it (src/lib.rs is
# touched for a relink, and its time put back).
# Usage: bash tests/rebuild.sh (after make build-debian; make test-make runs it).

set -u
source "$(dirname "${BASH_SOURCE[0]}")/shlib.sh"

TMP=$(mktemp -d /tmp/nginx-rl-rebuild.XXXXXX)
MASTERS=()
LIB_TIME=$(stat -c %y "$ROOT/src/lib.rs")

cleanup() {
    local pid
    for pid in "${MASTERS[@]}"; do kill "$pid" 2>/dev/null; done
    touch -d "$LIB_TIME" "$ROOT/src/lib.rs"
    sleep 0.5
    rm -rf "$TMP"
}
trap cleanup EXIT

# start NAME NGINX MODULE: nginx with the module on a free port; sets PORT
# and PREFIX. The module's path is the one the build writes, as `make run`
# and the recipes load it.
start() {
    local name=$1 nginx=$2 module=$3 i
    PREFIX=$TMP/$name
    PORT=$(free_port)
    mkdir -p "$PREFIX/logs" "$PREFIX/tmp"
    cat > "$PREFIX/nginx.conf" <<EOF
load_module $module;
worker_processes 2;
pid nginx.pid;
error_log logs/error.log notice;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    rl_zone z size=1m;
    server {
        listen 127.0.0.1:$PORT;
        location / {
            rl_limit zone=z rate=1000r/s burst=1000;
            rl_headers both;
            return 200 "ok\n";
        }
    }
}
EOF
    if ! "$nginx" -p "$PREFIX/" -c "$PREFIX/nginx.conf" -e logs/error.log 2> "$PREFIX/startup.log"; then
        fail "$nginx did not start: $(cat "$PREFIX/startup.log")"
        return 1
    fi
    for i in $(seq 100); do
        [[ -s $PREFIX/nginx.pid && $(status_of "$PORT" /) == 200 ]] && break
        sleep 0.1
    done
    MASTERS+=("$(cat "$PREFIX/nginx.pid")")
    [[ $(status_of "$PORT" /) == 200 ]] || { fail "nginx on $PORT does not answer 200 before the rebuild"; return 1; }
}

# still_serving WHAT: nginx answers 200 to every one of 20 requests, and its
# error log has no worker that exited on a signal.
still_serving() {
    local what=$1 i s bad=0
    for i in $(seq 20); do
        s=$(status_of "$PORT" /)
        [[ $s == 200 ]] || bad=$((bad + 1))
    done
    ((bad == 0)) || fail "after $what: $bad of 20 requests not answered 200 (last: $s)"
    local died
    died=$(grep -c "exited on signal" "$PREFIX/logs/error.log")
    ((died == 0)) || fail "after $what: $died workers exited on a signal: $(grep -m1 "exited on signal" "$PREFIX/logs/error.log")"
}

# make TARGET..., its output kept in the prefix.
build() {
    if ! make -C "$ROOT" "$@" > "$PREFIX/make.log" 2>&1; then
        fail "make $* failed: $(tail -5 "$PREFIX/make.log")"
        return 1
    fi
}

debian_noop_rebuild() {
    start debian-noop /usr/sbin/nginx "$ROOT/build/debian/ngx_http_rl_module.so" || return
    build build-debian || return
    still_serving "a no-op make build-debian"
}

debian_relink() {
    start debian-relink /usr/sbin/nginx "$ROOT/build/debian/ngx_http_rl_module.so" || return
    touch "$ROOT/src/lib.rs"
    build build-debian || return
    grep -q "Compiling ngx-http-rl-module" "$PREFIX/make.log" || fail "touching src/lib.rs did not rebuild the module"
    still_serving "make build-debian with a changed source"
}

# build-vendored puts both the module and the nginx binary in place: a running
# binary cannot be written into either (cp fails: "Text file busy").
vendored_noop_rebuild() {
    if [[ ! -x $ROOT/build/vendored/nginx || ! -d $ROOT/target/vendored/release ]]; then
        skip "no vendored build here (make build-vendored makes one)"
        return
    fi
    start vendored-noop "$ROOT/build/vendored/nginx" "$ROOT/build/vendored/ngx_http_rl_module.so" || return
    build build-vendored || return
    still_serving "a no-op make build-vendored"
}

[[ -f $ROOT/build/debian/ngx_http_rl_module.so ]] || { echo "no build/debian/ngx_http_rl_module.so: make build-debian first"; exit 1; }
run_test debian_noop_rebuild
run_test debian_relink
run_test vendored_noop_rebuild
summary
