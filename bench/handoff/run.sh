#!/usr/bin/env bash
# How fast an rl_conn waiting line hands a freed slot to its next waiter:
# `rl_conn max=1 queue=1024` in front of an upstream that answers in 2 ms
# (bench/handoff/backend.py), 50 clients (bench/handoff/load.py); the
# ideal is one request per upstream answer. Modules given as arguments are
# run one after the other, each with 1 and 2 workers, 3 rounds of 300
# requests. Usage: bash bench/handoff/run.sh MODULE.so [MODULE.so...]
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d /tmp/nginx-rl-handoff.XXXXXX)
PY=/usr/bin/python3
trap 'kill $(cat "$TMP/nginx.pid" 2>/dev/null) 2>/dev/null; kill $BACKEND 2>/dev/null; rm -rf "$TMP"' EXIT
mkdir -p "$TMP/logs"
"$PY" "$HERE/backend.py" & BACKEND=$!
sleep 0.5
for so in "$@"; do
    for workers in 1 2; do
        install -m 0644 "$so" "$TMP/mod.so.new" && mv -f "$TMP/mod.so.new" "$TMP/mod.so"
        cat >"$TMP/nginx.conf" <<CONF
load_module $TMP/mod.so;
worker_processes $workers;
pid $TMP/nginx.pid;
error_log $TMP/logs/error.log notice;
events { worker_connections 4096; }
http {
    access_log off;
    rl_zone c size=1m;
    server {
        listen 127.0.0.1:18931;
        location / { rl_conn zone=c max=1 key=all queue=1024 timeout=20s; rl_headers off; proxy_pass http://127.0.0.1:18932; }
    }
}
CONF
        /usr/sbin/nginx -p "$TMP/" -c "$TMP/nginx.conf" -e "$TMP/logs/error.log"
        sleep 0.3
        echo "== $so, $workers worker(s)"
        for _ in 1 2 3; do "$PY" "$HERE/load.py" 300; done
        kill "$(cat "$TMP/nginx.pid")"
        sleep 0.5
    done
done
