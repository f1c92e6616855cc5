# Helpers of the shell tests (tests/rebuild.sh, tests/make_run.sh): the
# tests that run make itself, which a cargo test cannot do (cargo test may
# hold the build directory's lock while its tests run, and make builds).

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=/usr/bin/python3
PASSED=0
FAILED=0
SKIPPED=0
FAILURES=()

# A loopback port nobody listens on now, below the kernel's ephemeral range
# (one taken from that range may go to an outgoing connection before nginx
# binds it; tests/common/mod.rs's free_port says more).
free_port() {
    $PY -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    port = random.randrange(10000, max(low, 11000))
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        print(port)
        break
    except OSError:
        pass
    finally:
        s.close()
'
}

# The status of GET http://127.0.0.1:$1$2 ("000" when nothing answered).
status_of() {
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$1$2" || true
}

# Records a failed assertion of the running test.
fail() {
    FAILURES+=("$CURRENT: $*")
    echo "FAILED: $*"
}

# Marks the running test skipped, saying why.
skip() {
    SKIP=1
    echo "skipped: $*"
}

# Runs a test function, counted once: passed unless it called fail or skip.
run_test() {
    local before=${#FAILURES[@]}
    CURRENT="$*"
    SKIP=0
    echo "--- $*"
    "$@"
    if ((${#FAILURES[@]} == before && SKIP)); then
        SKIPPED=$((SKIPPED + 1))
    elif ((${#FAILURES[@]} == before)); then
        PASSED=$((PASSED + 1))
        echo "ok: $*"
    else
        FAILED=$((FAILED + 1))
    fi
    return 0
}

# The closing line, read as a test runner's: N passed, N failed.
summary() {
    local f
    for f in "${FAILURES[@]}"; do echo "failure: $f"; done
    echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
    ((FAILED == 0))
}
