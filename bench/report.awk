# Writes bench/RESULTS.md from the files bench/run.sh collected (POSIX awk:
# Debian's default mawk is enough).
#
#   awk -f report.awk -v failed=0|1 [-v prof=PROFILE.md] [-v scrape=SECTION.md] META SCENARIOS RAW MEM
#
# META: key<TAB>value lines. SCENARIOS: bench/scenarios.tsv. RAW: one line
# per wrk run: phase id secs requests duration_us p50_us p99_us n200 n429
# n5xx nother (-1: not counted) err_connect err_read err_write err_timeout
# err_status (400 and above) cpu_ns server_ns (redis-server's CPU; memcached's
# in the rlmemcached_* rows) status reason load client_busy (CPU 1's busy
# share, in thousandths) calls (redis-server's script calls; -: not counted,
# the memcached rows). MEM: zone zone_bytes nfill fill_codes held
# first_eviction nlong long_ok long_refused long_other. SECTION.md: the section
# bench/scrape.sh wrote (raw-scrape.md after a full run).

BEGIN { FS = "\t"; file = 0 }
FNR == 1 { file++ }

file == 1 { meta[$1] = $2; next }

file == 2 {
    if ($1 == "" || substr($1, 1, 1) == "#") next
    ns++; sid[ns] = $1; inst[$1] = $2; path[$1] = $3; nkeys[$1] = $4; expect[$1] = $5
    group[$1] = $6; ref[$1] = $7; rloc[$1] = $10; desc[$1] = $11
    # Connections: the column, or wrk's default for the run (BENCH_CONNS; 32 before the meta said).
    conns[$1] = ($9 == "-" || $9 == "") ? ((meta["conns"] != "") ? meta["conns"] : 32) : $9
    if ($10 == "client") gclient[$6] = 1
    if (!(($6) in gseen)) { gseen[$6] = 1; ng++; gname[ng] = $6 }
    next
}

file == 3 {
    id = $2
    if ($1 == "warm") {
        if ($19 != "ok") warmfail[id] = $20
        if ($8 >= 0) { w200[id] += $8; w429[id] += $9; w5xx[id] += $10; woth[id] += $11; wreq[id] += $4 }
        next
    }
    n = ++runs[id]
    rps[id, n] = $4 / ($5 / 1e6)
    p50[id, n] = $6
    p99[id, n] = $7
    cpu[id, n] = $17 / $4 / 1000
    # CPU 0's share the scenario used: the worker's, and redis-server's when it runs there too.
    busy[id, n] = 100 * ($17 + (rloc[id] == "client" ? 0 : $18)) / ($5 * 1000)
    rcpu[id, n] = $18 / $4 / 1000
    cbusy[id, n] = $22 / 10
    if ($8 >= 0) { s200[id] += $8; s429[id] += $9; s5xx[id] += $10; soth[id] += $11 }
    else { shigh[id] += $16; slow[id] += $4 - $16; uncounted[id] = 1 }
    sreq[id] += $4
    if ($23 == "-") nocalls[id] = 1; else scalls[id] += $23
    serr[id] += $13 + $14 + $15
    if ($19 != "ok") fail[id] = $20
    next
}

file == 4 {
    nm++; mz[nm] = $1; mbytes[$1] = $2; mfill[$1] = $3; mcodes[$1] = $4; mheld[$1] = $5
    mfirst[$1] = $6; mlong[$1] = $7; mok[$1] = $8; mrej[$1] = $9; moth[$1] = $10
    next
}

function median(arr, id, n,    i, j, t, v) {
    for (i = 1; i <= n; i++) v[i] = arr[id, i]
    for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
    if (n % 2) return v[(n + 1) / 2]
    return (v[n / 2] + v[n / 2 + 1]) / 2
}
function minof(arr, id, n,    i, m) { m = arr[id, 1]; for (i = 2; i <= n; i++) if (arr[id, i] < m) m = arr[id, i]; return m }
function maxof(arr, id, n,    i, m) { m = arr[id, 1]; for (i = 2; i <= n; i++) if (arr[id, i] > m) m = arr[id, i]; return m }
function commas(x,    s, r, neg) {
    x = sprintf("%.0f", x); neg = ""
    if (substr(x, 1, 1) == "-") { neg = "-"; x = substr(x, 2) }
    r = ""
    while (length(x) > 3) { r = "," substr(x, length(x) - 2) r; x = substr(x, 1, length(x) - 3) }
    return neg x r
}
function pct(a, b) {
    if (b <= 0) return "-"
    if (a == b) return "100%"
    if (a * 10000 < b) return commas(a) " of " commas(b)
    return sprintf("%.2f%%", 100 * a / b)
}
function mix(id,    s, t) {
    t = sreq[id]; s = ""
    if (uncounted[id]) {
        # Timed runs counted only statuses of 400 and above; the warm-up counted each.
        if (slow[id]) s = s sprintf("< 400: %s", pct(slow[id], t))
        if (shigh[id]) s = s (s ? ", " : "") sprintf(">= 400: %s", pct(shigh[id], t))
        if (wreq[id]) s = s sprintf(" (warm-up: %s)", counted(w200[id], w429[id], w5xx[id], woth[id], wreq[id]))
    } else
        s = counted(s200[id], s429[id], s5xx[id], soth[id], t)
    if (serr[id]) s = s (s ? ", " : "") sprintf("socket errors: %d", serr[id])
    return s
}
function counted(a, b, c, d, t,    s) {
    s = ""
    if (a) s = s sprintf("200: %s", pct(a, t))
    if (b) s = s (s ? ", " : "") sprintf("429: %s", pct(b, t))
    if (c) s = s (s ? ", " : "") sprintf("**5xx: %s**", commas(c))
    if (d) s = s (s ? ", " : "") sprintf("**other: %s**", commas(d))
    return s
}
function ms(us) { return sprintf("%.2f ms", us / 1000) }
function algof(id,    a) {
    if (id ~ /^limit_req/) return "limit_req"
    a = id; sub(/^rl(redis)?_/, "", a); sub(/_c[0-9]+$/, "", a); sub(/_(reject|k1k|k1m)$/, "", a)
    return a
}
function keysmb(id,    a) {
    a = algof(id)
    if (id ~ /^(lua|rlredis|rlmemcached)/ || !(a in mheld)) return "-"
    return commas(mheld[a] * 1048576 / mbytes[a])
}
function goal(text, measured, ok) {
    ngoal++
    if (ok) nmet++
    gl[ngoal] = sprintf("| %s | %s | %s |", text, measured, ok ? "met" : "**NOT met**")
}
# A req/s comparison means little when the server's CPU was not saturated
# (the machine's other load, not nginx, set the pace), or when the client's
# was and the server's less so (wrk set it).
function busynote(a, b) {
    if (B[a] < 90 || B[b] < 90)
        return sprintf(" (inconclusive: %s busy %.0f%% / %.0f%%)", (inst[a] ~ /^(lua|rlredis|rlmemcached)$/ && rloc[a] != "client") ? "CPU 0" : "worker", B[a], B[b])
    if ((K[a] >= 95 && B[a] < 95) || (K[b] >= 95 && B[b] < 95))
        return sprintf(" (inconclusive: client busy %.0f%% / %.0f%%, worker %.0f%% / %.0f%%)", K[a], K[b], B[a], B[b])
    return ""
}
# The reference of an nginx-rl row's goal: limit_req in the same nginx (its
# ref in scenarios.tsv) when that row ran, else stock nginx's.
function vs(id, stock,    r) {
    r = ref[id]
    return (r != "-" && (r in R)) ? r : stock
}
# "limit_req in the same nginx" or "limit_req", and beside the ratio, the
# ratio to stock nginx's limit_req when the goal is judged on the other.
function vsname(r) { return (r ~ /_rl$/) ? "limit_req in the same nginx" : "limit_req" }
function vswhere(r) { return (r ~ /_rl$/) ? ", in the same nginx" : "" }
function vsstock(id, r, stock) {
    return (r != stock && (stock in R)) ? sprintf(" (%.3fx stock nginx's)", R[id] / R[stock]) : ""
}
function refname(g) { return (g ~ /Lua peer/) ? "Lua peer" : (g ~ /lease/) ? "ref" : (g ~ /^redis/) ? "Lua peer" : "limit_req" }
# Script calls redis-server ran per 1,000 requests of the scenario's timed runs ("-": not counted).
function calls1k(id) { return (sreq[id] > 0 && scalls[id] != "" && !(id in nocalls)) ? sprintf("%.1f", 1000 * scalls[id] / sreq[id]) : "-" }
# The server CPU of a row of the Redis groups: redis-server's, or memcached's (named) in a Memcached zone row.
function srvcpu(id) { return sprintf("%.2f", RC[id]) (inst[id] == "rlmemcached" ? " memcached" : "") }
# The Redis zone against the Lua peer: every rlredis_* row whose ref is a peer
# row, by layout (redis-server beside nginx, or beside wrk), keys, connections.
function ralg(id,    a) { a = id; sub(/^rlredis_/, "", a); sub(/_k1k.*$/, "", a); return a }
function rkeys(id) { return (nkeys[id] + 0 > 0) ? (nkeys[id] == 1000 ? "1K keys" : commas(nkeys[id]) " keys") : "one key" }
function rwhere(id) { return (rloc[id] == "client") ? "redis-server beside wrk" : "redis-server beside nginx" }
function rlabel(id) { return rkeys(id) ", " conns[id] " connection" (conns[id] == 1 ? "" : "s") ", " rwhere(id) }
# req/s the Redis zone should reach, as a multiple of the peer's (issue #37):
# at least as much at 1 and 4 connections, 1.5x from 16 up.
function rgoal(id) { return (conns[id] + 0 >= 16) ? 1.5 : 1.0 }
# rpairs(): fills rp[1..nrp] with those rows, beside nginx first, then by keys and connections.
function rpairs(    i, j, t, id) {
    nrp = 0
    for (i = 1; i <= ns; i++) {
        id = sid[i]
        if (inst[id] == "rlredis" && ref[id] != "-" && inst[ref[id]] == "lua") { rp[++nrp] = id; rord[id] = i }
    }
    for (i = 2; i <= nrp; i++) {
        t = rp[i]
        for (j = i - 1; j >= 1 && rbefore(t, rp[j]); j--) rp[j + 1] = rp[j]
        rp[j + 1] = t
    }
}
function rbefore(a, b,    la, lb) {
    la = (rloc[a] == "client"); lb = (rloc[b] == "client")
    if (la != lb) return la < lb
    if (nkeys[a] + 0 != nkeys[b] + 0) return nkeys[a] + 0 < nkeys[b] + 0
    if (conns[a] + 0 != conns[b] + 0) return conns[a] + 0 < conns[b] + 0
    return rord[a] < rord[b]
}
function vv(a, b, fmt) { return sprintf(fmt, a) " / " sprintf(fmt, b) }
# The Memcached zone beside the Redis zone: its rlredis_* twin (the same name
# after the store's), the algorithm, and a value of each row of a triple
# ("-" for a row that did not run), arr[id] / div in fmt.
function mtwin(id,    t) { t = id; sub(/^rlmemcached_/, "rlredis_", t); return t }
function malg(id,    a) { a = id; sub(/^rlmemcached_/, "", a); sub(/_k1k.*$/, "", a); return a }
function v3(arr, a, b, c, div, fmt) { return v1(arr, a, div, fmt) " / " v1(arr, b, div, fmt) " / " v1(arr, c, div, fmt) }
function v1(arr, id, div, fmt) { return (id in R) ? sprintf(fmt, arr[id] / div) : "-" }
function mbefore(a, b) {
    if (nkeys[a] + 0 != nkeys[b] + 0) return nkeys[a] + 0 < nkeys[b] + 0
    if (conns[a] + 0 != conns[b] + 0) return conns[a] + 0 < conns[b] + 0
    return mord[a] < mord[b]
}

END {
    have = 0
    for (i = 1; i <= ns; i++) if (runs[sid[i]] > 0) have = 1
    for (i = 1; i <= ns; i++) {
        id = sid[i]; n = runs[id]
        if (!n) continue
        R[id] = median(rps, id, n); RMIN[id] = minof(rps, id, n); RMAX[id] = maxof(rps, id, n)
        P[id] = median(p99, id, n); P50[id] = median(p50, id, n); C[id] = median(cpu, id, n); RC[id] = median(rcpu, id, n)
        B[id] = median(busy, id, n); K[id] = median(cbusy, id, n)
    }
    base = ("baseline" in R) ? "baseline" : ""
    # The groups in which a Memcached zone row ran: their server CPU column names both servers.
    mcran = 0
    for (i = 1; i <= ns; i++) if (inst[sid[i]] == "rlmemcached" && (sid[i] in R)) { gmc[group[sid[i]]] = 1; mcran = 1 }

    print "# nginx-rl benchmark results"
    print ""
    if (meta["quick"] != "") {
        print "> **QUICK run** (`make bench QUICK=1`): one short round and small zones, a smoke test."
        print "> The numbers below are indicative only; `make bench` writes the real `bench/RESULTS.md`."
        print ""
    }
    print "Generated by `make bench` (`bench/run.sh`) on " meta["date"] " in " meta["elapsed"] "."
    print ""
    print "| | |"
    print "|---|---|"
    print "| machine | " meta["cpus"] " CPUs; " meta["os"] "; " meta["kernel"] " |"
    print "| nginx | " meta["nginx"] " (Debian's `/usr/sbin/nginx`) |"
    print "| module | " meta["module"] " |"
    print "| Lua peer | " meta["lua"] "; redis-server " meta["redis"] " |"
    if (mcran) print "| Memcached zone | memcached " meta["memcached"] " (`-U 0 -m 64 -t 1`); at the end: " meta["memcached_stats"] " |"
    print "| client | wrk " meta["wrk"] " |"
    print "| method | " meta["setup"] " |"
    print "| noise | " meta["load"] " (the machine is shared: medians over interleaved rounds) |"
    if (meta["wakeup"] != "" && meta["wakeup"] != "-") print "| wake-ups | " meta["wakeup"] " |"
    if (failed + 0) print "| **status** | **BROKEN: some scenario answered with the wrong status mix, see the tables** |"
    print ""

    # ---------------------------------------------------------------- throughput
    print "## Throughput and CPU per request"
    print ""
    print "req/s: median over the rounds (min - max). p99: median of the rounds' p99 latency."
    print "CPU: nginx worker CPU time (all its threads, from `/proc/PID/task/*/schedstat`) per completed request;"
    print "\"added\" is that minus the baseline's. worker busy: the worker's CPU time over the run's wall time (well below"
    print "100% means the worker was not the bottleneck: the client, Redis or other load on the machine was). In the Redis"
    print "groups redis-server shares CPU 0 with nginx, and CPU 0 busy counts both; in the groups `redis beside wrk` it"
    print "shares CPU 1 with wrk. client busy: CPU 1's busy share (wrk's core, from `/proc/stat`); near 100%, wrk set the"
    print "pace and req/s says more about the client than nginx. p50 (Redis groups): median of the rounds' p50 latency."
    print "Ratios are of median req/s. keys/MB: from the memory test below."
    if (mcran) {
        print "The `rlmemcached_*` rows, nginx-rl's Memcached zone, sit in the Redis groups beside the Redis zone's rows:"
        print "memcached runs where redis-server does (CPU 0), its CPU time is in the server CPU column (marked memcached)"
        print "and in CPU 0 busy, and their x Lua peer is against the same Lua + Redis peer row as the Redis zone's."
    }
    print ""
    for (g = 1; g <= ng; g++) {
        gn = gname[g]
        print "### " gn
        print ""
        if (gn ~ /^redis/)
            print "| scenario | req/s | min - max | p50 | p99 | nginx CPU us/req | " ((gn in gclient) ? "worker busy" : (gn in gmc) ? "CPU 0 busy (worker + redis-server or memcached)" : "CPU 0 busy (worker + redis-server)") " | " ((gn in gclient) ? "CPU 1 busy (wrk + redis-server)" : "client busy") " | " ((gn in gmc) ? "server CPU us/req (redis-server, or memcached)" : "redis-server CPU us/req") " | Redis calls / 1,000 req | x baseline | x " refname(gn) " | status mix |"
        else
            print "| scenario | req/s | min - max | p99 | CPU us/req | added | worker busy | client busy | x baseline | x " refname(gn) " | keys/MB | status mix |"
        if (gn ~ /^redis/) print "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"
        else print "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"
        for (i = 1; i <= ns; i++) {
            id = sid[i]
            if (group[id] != gn) continue
            name = "`" id "` " desc[id]
            if (!runs[id]) {
                why = (id ~ /^rlredis/ && meta["skip_redis"] != "") ? "skipped: the module rejects the Redis zone (`nginx -t`: " meta["skip_redis"] ")" : "not run"
                if (id ~ /^rlmemcached/ && meta["skip_memcached"] != "") why = "skipped: the module rejects the Memcached zone (`nginx -t`: " meta["skip_memcached"] ")"
                if (gn ~ /^redis/) printf "| %s | - | - | - | - | - | - | - | - | - | - | - | %s |\n", name, why
                else printf "| %s | - | - | - | - | - | - | - | - | - | - | %s |\n", name, why
                continue
            }
            xb = (base != "" && id != base) ? sprintf("%.3f", R[id] / R[base]) : "-"
            r = ref[id]
            xr = (r != "-" && (r in R)) ? sprintf("%.3f", R[id] / R[r]) : "-"
            st = mix(id)
            if (id in fail) st = "**FAIL: " fail[id] "** " st
            if (id in warmfail) st = "**FAIL (warm-up): " warmfail[id] "** " st
            if (gn ~ /^redis/)
                printf "| %s | %s | %s - %s | %s | %s | %.2f | %.0f%% | %.0f%% | %s | %s | %s | %s | %s |\n", name, commas(R[id]), commas(RMIN[id]), commas(RMAX[id]), ms(P50[id]), ms(P[id]), C[id], B[id], K[id], srvcpu(id), calls1k(id), xb, xr, st
            else {
                add = (base != "") ? sprintf("%+.2f", C[id] - C[base]) : "-"
                if (id == base) add = "-"
                printf "| %s | %s | %s - %s | %s | %.2f | %s | %.0f%% | %.0f%% | %s | %s | %s | %s |\n", name, commas(R[id]), commas(RMIN[id]), commas(RMAX[id]), ms(P[id]), C[id], add, B[id], K[id], xb, xr, keysmb(id), st
            }
        }
        print ""
    }

    # ---------------------------------------------------------------- Redis zone vs the Lua peer
    rpairs()
    nrun = 0
    for (i = 1; i <= nrp; i++) if ((rp[i] in R) && (ref[rp[i]] in R)) nrun++
    if (nrun > 0) {
        print "### Redis zone against the Lua peer, by connections"
        print ""
        print "Each nginx-rl Redis row beside its Lua + Redis peer row (the same keys, connections and layout), ours / the"
        print "peer's. p50, p99: medians of the rounds' percentiles (wrk's latency distribution). nginx CPU: the worker's,"
        print "all its threads; redis-server CPU: redis-server's, all its threads (`/proc/PID/task/*/schedstat` over each"
        print "run); both per completed request. busy: beside nginx, CPU 0 (the worker and redis-server); beside wrk, the"
        print "worker, and CPU 1 (wrk and redis-server). goal: the req/s ratio the Redis zone should reach (goals below)."
        print ""
        lastw = ""
        for (i = 1; i <= nrp; i++) {
            id = rp[i]; r = ref[id]
            if (!((id in R) && (r in R))) continue
            if (rwhere(id) != lastw) {
                if (lastw != "") print ""
                lastw = rwhere(id)
                print "#### " lastw (rloc[id] == "client" ? " (CPU 1)" : " (CPU 0)")
                print ""
                print "| keys | connections | nginx-rl / peer | req/s | x peer | goal | p50 ms | p99 ms | nginx CPU us/req | redis-server CPU us/req | " (rloc[id] == "client" ? "worker busy | CPU 1 busy |" : "CPU 0 busy |")
                print "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|" (rloc[id] == "client" ? "--:|" : "")
            }
            printf "| %s | %d | `%s` / `%s` | %s / %s | %.3f | %.1fx | %s | %s | %s | %s | %s |", rkeys(id), conns[id], id, r, commas(R[id]), commas(R[r]), R[id] / R[r], rgoal(id),
                vv(P50[id] / 1000, P50[r] / 1000, "%.2f"), vv(P[id] / 1000, P[r] / 1000, "%.2f"), vv(C[id], C[r], "%.2f"), vv(RC[id], RC[r], "%.2f"), vv(B[id], B[r], "%.0f%%")
            if (rloc[id] == "client") printf " %s |", vv(K[id], K[r], "%.0f%%")
            printf "\n"
        }
        print ""
    }

    # ---------------------------------------------------------------- Memcached zone vs the Redis zone
    # Every rlmemcached_* row that ran, beside its rlredis_* twin (the same
    # line, keys and connections on the Redis zone) and their Lua peer row.
    nmp = 0
    for (i = 1; i <= ns; i++) if (inst[sid[i]] == "rlmemcached" && (sid[i] in R)) { mp[++nmp] = sid[i]; mord[sid[i]] = i }
    for (i = 2; i <= nmp; i++) {
        t = mp[i]
        for (j = i - 1; j >= 1 && mbefore(t, mp[j]); j--) mp[j + 1] = mp[j]
        mp[j + 1] = t
    }
    if (nmp > 0) {
        print "### Memcached zone beside the Redis zone, by connections"
        print ""
        print "Each nginx-rl Memcached zone row beside the Redis zone's row of the same line, keys and connections, and"
        print "the Lua + Redis peer row both are compared with: memcached / Redis zone / peer (\"-\": not run). The server is"
        print "memcached for the first (one worker thread, `-t 1`), redis-server for the other two, each on CPU 0 beside"
        print "nginx. x peer: memcached's ratio / the Redis zone's. nginx CPU: the worker's, all its threads; server CPU:"
        print "the server's, all its threads (`/proc/PID/task/*/schedstat` over each run); both per completed request."
        print "CPU 0 busy: the worker and the server."
        print ""
        print "| keys | connections | algorithm | memcached / Redis zone / peer | req/s | x Redis zone | x peer | p50 ms | p99 ms | nginx CPU us/req | server CPU us/req | CPU 0 busy |"
        print "|---|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"
        for (i = 1; i <= nmp; i++) {
            id = mp[i]; rr = mtwin(id); r = ref[id]
            printf "| %s | %d | %s | `%s` / `%s` / `%s` | %s / %s / %s | %s | %s / %s | %s | %s | %s | %s | %s |\n", rkeys(id), conns[id], malg(id), id, rr, r,
                commas(R[id]), (rr in R) ? commas(R[rr]) : "-", (r in R) ? commas(R[r]) : "-",
                (rr in R) ? sprintf("%.3f", R[id] / R[rr]) : "-",
                (r in R) ? sprintf("%.3f", R[id] / R[r]) : "-", ((r in R) && (rr in R)) ? sprintf("%.3f", R[rr] / R[r]) : "-",
                v3(P50, id, rr, r, 1000, "%.2f"), v3(P, id, rr, r, 1000, "%.2f"), v3(C, id, rr, r, 1, "%.2f"), v3(RC, id, rr, r, 1, "%.2f"), v3(B, id, rr, r, 1, "%.0f%%")
        }
        print ""
    }

    # ---------------------------------------------------------------- memory
    if (nm > 0) {
        print "## Memory: keys per zone"
        print ""
        print "Each zone (" meta["memz"] ") is filled with " commas(mfill[mz[1]]) " distinct short keys (`s1`, `s2`, ..., one request each, in order,"
        print "over one connection); then the keys it still holds are counted (asked again from the newest down: a held key"
        print "answers 429, the first forgotten one 200). nginx-rl limits use `rate=10r/d burst=10 cost=10` (no state"
        print "becomes idle during the test; `sliding_log` then keeps 8 x (10 + 2) = 96 bytes of log per key), limit_req"
        print "`rate=1r/m`. Then " commas(mlong[mz[1]]) " new 100-byte keys go into the full zone: a new key answered 429 was refused for lack of memory."
        print ""
        print "| zone | keys held | keys per MB | first eviction logged after | fill answers | new long keys refused |"
        print "|---|--:|--:|--:|---|--:|"
        for (i = 1; i <= nm; i++) {
            z = mz[i]
            fe = (z == "limit_req") ? "- (not logged: limit_req drops its oldest node silently)" : (mfirst[z] == "-" ? "no eviction" : commas(mfirst[z]) " keys")
            ref_txt = commas(mrej[z]) " of " commas(mlong[z])
            if (moth[z] > 0) ref_txt = ref_txt ", **" moth[z] " errors**"
            held = commas(mheld[z]); if (mheld[z] >= mfill[z]) held = ">= " held
            printf "| %s | %s | %s | %s | %s | %s |\n", z, held, commas(mheld[z] * 1048576 / mbytes[z]), fe, mcodes[z], ref_txt
        }
        print ""
        if (meta["lr_nomem"] != "-" && meta["lr_nomem"] != "")
            print "limit_req logged `could not allocate node` " meta["lr_nomem"] " times (each such request got 429)."
        print ""
    }

    # ---------------------------------------------------------------- instructions
    nin = 0
    if (prof != "") {
        while ((getline line < prof) > 0) {
            # | id | instructions | [the same request without a limit | added | x limit_req's |] statuses |
            if (line !~ /^\| `[a-z0-9_]+` \|/) continue
            nf = split(line, f, "|")
            pid = f[2]; gsub(/[ `]/, "", pid); v = f[3]; gsub(/ /, "", v); pst = f[nf - 1]; gsub(/^ +| +$/, "", pst)
            nin++; iid[nin] = pid; INS[pid] = v + 0; IST[pid] = pst
            if (nf >= 8) { v = f[4]; gsub(/ /, "", v); TWIN[pid] = v + 0 }
            if (nf >= 9) { v = f[6]; gsub(/ /, "", v); MOD[pid] = v }
        }
        close(prof)
        # An older PROFILE.md: what each scenario adds over the baseline request.
        for (i = 1; i <= nin; i++) { pid = iid[i]; ADD[pid] = INS[pid] - ((pid in TWIN) ? TWIN[pid] : INS["baseline"]) }
    }
    if (nin > 0) {
        print "## Instructions per request (callgrind)"
        print ""
        print "The same configurations, one nginx process under valgrind's callgrind, 3,000 sequential requests per"
        print "scenario (`bench/profile.sh`, details and the functions behind the differences in [PROFILE.md](PROFILE.md)):"
        print "what a limit adds is counted against the same request to a server without limits in the same nginx."
        print "Instruction counts do not depend on the machine's other load (they vary by about +-1% from run to run),"
        print "but they do not see cache misses."
        print ""
        print "| scenario | instructions/request | added by the limit | of them in nginx-rl's code | x limit_req's addition | statuses |"
        print "|---|--:|--:|--:|--:|---|"
        for (i = 1; i <= nin; i++) {
            pid = iid[i]
            add = (pid == "baseline" && !(pid in TWIN)) ? "-" : sprintf("%+d", ADD[pid])
            r = "-"
            lref = (pid ~ /_k1m$/) ? "limit_req_k1m" : "limit_req"
            if (pid ~ /^rl_/ && pid !~ /_reject|^rl_loaded/ && (lref in ADD) && ADD[lref] > 0) r = sprintf("%.2f", ADD[pid] / ADD[lref])
            printf "| `%s` | %s | %s | %s | %s | %s |\n", pid, commas(INS[pid]), add, (pid in MOD) ? MOD[pid] : "-", r, IST[pid]
        }
        print ""
        print "`rl_loaded_no_limit`: a location without `rl_limit` in the nginx that loads the module, against `baseline`."
        print "`rl_*_no_headers`: with `rl_headers off`; the other nginx-rl rows send the legacy headers."
        print "Of them in nginx-rl's code: the self cost of the module's own functions (and of what they inline),"
        print "the part of the addition that the heap's layout does not move."
        print ""
    }

    # ---------------------------------------------------------------- scrape
    # bench/scrape.sh writes its section whole (tables and text): it goes in as it is.
    if (scrape != "") {
        while ((getline line < scrape) > 0) print line
        close(scrape)
    }

    # ---------------------------------------------------------------- goals
    ngoal = 0; nmet = 0
    split("fixed sliding sliding_log token_bucket leaky_bucket gcra", algs, " ")
    for (k = 1; k <= 6; k++) {
        a = algs[k]
        id = "rl_" a; r = vs(id, "limit_req")
        if ((id in R) && (r in R))
            goal("req/s >= 1.00x " vsname(r) ", one key, admit: `" a "`", sprintf("%.3fx", R[id] / R[r]) vsstock(id, r, "limit_req") busynote(id, r), R[id] >= R[r])
        id = "rl_" a "_reject"; r = vs(id, "limit_req_reject")
        if ((id in R) && (r in R))
            goal("req/s >= 1.00x " vsname(r) ", one key, reject: `" a "`", sprintf("%.3fx", R[id] / R[r]) vsstock(id, r, "limit_req_reject") busynote(id, r), R[id] >= R[r])
    }
    # The response limit_req sends: a rejection without the rate-limit fields.
    id = "rl_gcra_reject_noheaders"; r = vs(id, "limit_req_reject")
    if ((id in R) && (r in R))
        goal("req/s >= 1.00x " vsname(r) ", one key, reject, `rl_headers off` (limit_req's response): `gcra`", sprintf("%.3fx", R[id] / R[r]) vsstock(id, r, "limit_req_reject") busynote(id, r), R[id] >= R[r])
    split("sliding token_bucket gcra", many, " ")
    for (k = 1; k <= 3; k++) {
        id = "rl_" many[k] "_k1m"; r = vs(id, "limit_req_k1m")
        if ((id in R) && (r in R))
            goal("req/s >= 1.00x " vsname(r) ", 1M keys: `" many[k] "`", sprintf("%.3fx", R[id] / R[r]) vsstock(id, r, "limit_req_k1m") busynote(id, r), R[id] >= R[r])
    }
    # The baseline of the same nginx: the same request to a server without limits.
    rb = ("rl_baseline" in R) ? "rl_baseline" : base
    for (k = 1; k <= 6; k++) {
        id = "rl_" algs[k]
        if ((id in R) && rb != "")
            goal("req/s >= 0.95x baseline" (rb == base ? "" : ", in the same nginx") ", one key: `" algs[k] "`", sprintf("%.3fx", R[id] / R[rb]) busynote(id, rb), R[id] >= 0.95 * R[rb])
    }
    for (k = 1; k <= 6; k++) {
        id = "rl_" algs[k]; r = vs(id, "limit_req")
        if ((id in C) && rb != "" && (r in C))
            goal("CPU/request added over the baseline <= limit_req's" vswhere(r) ", one key: `" algs[k] "`",
                 sprintf("%+.2f us vs %+.2f us", C[id] - C[rb], C[r] - C[rb]), C[id] <= C[r])
    }
    for (k = 1; k <= 3; k++) {
        id = "rl_" many[k] "_k1m"; r = vs(id, "limit_req_k1m")
        if ((id in C) && rb != "" && (r in C))
            goal("CPU/request added over the baseline <= limit_req's" vswhere(r) ", 1M keys: `" many[k] "`",
                 sprintf("%+.2f us vs %+.2f us", C[id] - C[rb], C[r] - C[rb]), C[id] <= C[r])
    }
    if (nin > 0) {
        split("gcra sliding", noh, " ")
        for (k = 1; k <= 2; k++) {
            id = "rl_" noh[k] "_no_headers"
            if ((id in ADD) && ("limit_req" in ADD))
                goal("instructions/request added <= limit_req's, one key, `rl_headers off`: `" noh[k] "`",
                     sprintf("%+d vs %+d", ADD[id], ADD["limit_req"]), ADD[id] <= ADD["limit_req"])
        }
        for (k = 1; k <= 6; k++) {
            id = "rl_" algs[k]
            if ((id in ADD) && ("limit_req" in ADD))
                goal("instructions/request added <= 2x limit_req's, one key, legacy headers: `" algs[k] "`",
                     sprintf("%+d vs %+d", ADD[id], ADD["limit_req"]), ADD[id] <= 2 * ADD["limit_req"])
        }
        for (k = 1; k <= 3; k++) {
            id = "rl_" many[k] "_k1m"
            if ((id in ADD) && ("limit_req_k1m" in ADD))
                goal("instructions/request added <= 2x limit_req's, 1M keys, legacy headers: `" many[k] "`",
                     sprintf("%+d vs %+d", ADD[id], ADD["limit_req_k1m"]), ADD[id] <= 2 * ADD["limit_req_k1m"])
        }
    }
    # The Redis zone against the Lua peer, every pair in both layouts. At 1 and 4
    # connections the rows are bound by latency (wake-ups), not by a saturated
    # CPU: no busy rule there.
    for (i = 1; i <= nrp; i++) {
        id = rp[i]; r = ref[id]; a = ralg(id); g = rgoal(id)
        if ((id in R) && (r in R)) {
            goal(sprintf("Redis zone req/s >= %.1fx the Lua peer (`%s`), %s: `%s`", g, r, rlabel(id), a),
                 sprintf("%.3fx", R[id] / R[r]) (conns[id] + 0 >= 16 ? busynote(id, r) : ""), R[id] >= g * R[r])
            goal("Redis zone p50 <= the Lua peer's (`" r "`), " rlabel(id) ": `" a "`", ms(P50[id]) " vs " ms(P50[r]), P50[id] <= P50[r])
            goal("Redis zone p99 <= the Lua peer's (`" r "`), " rlabel(id) ": `" a "`", ms(P[id]) " vs " ms(P[r]), P[id] <= P[r])
        } else if ((r in R) && meta["skip_redis"] != "") {
            # The peer ran and ours could not: the module rejects the Redis zone.
            why = "not measured: the module has no Redis zone yet"
            goal(sprintf("Redis zone req/s >= %.1fx the Lua peer (`%s`), %s: `%s`", g, r, rlabel(id), a), why, 0)
            goal("Redis zone p50 <= the Lua peer's (`" r "`), " rlabel(id) ": `" a "`", why, 0)
            goal("Redis zone p99 <= the Lua peer's (`" r "`), " rlabel(id) ": `" a "`", why, 0)
        }
    }
    split("fixed sliding token_bucket leaky_bucket gcra", o1, " ")
    for (k = 1; k <= 5; k++) {
        z = o1[k]
        if (z in mheld)
            goal(">= 16,000 keys per MB: `" z "`", commas(mheld[z] * 1048576 / mbytes[z]) " (limit_req: " (("limit_req" in mheld) ? commas(mheld["limit_req"] * 1048576 / mbytes["limit_req"]) : "-") ")",
                 mheld[z] * 1048576 / mbytes[z] >= 16000)
    }
    for (k = 1; k <= 6; k++) {
        z = algs[k]
        if (z in mheld) {
            nf = (mcodes[z] ~ /^[0-9]+ x 200$/) ? 0 : 1
            goal("no new key refused for lack of zone memory: `" z "`", sprintf("%d of %s long keys refused%s", mrej[z] + moth[z], commas(mlong[z]), nf ? "; fill: " mcodes[z] : ""), mrej[z] + moth[z] == 0 && !nf)
        }
    }
    if (ngoal > 0) {
        print "## Goals"
        print ""
        print nmet " of " ngoal " met. A req/s verdict marked inconclusive compares runs in which an nginx worker (in the"
        print "Redis rows beside nginx: CPU 0, the worker and redis-server) was less than 90% busy: the machine's other load"
        print "(or, beside wrk, CPU 1), not nginx, set the pace; or in which the client's CPU was 95% busy or more and the"
        print "worker's less: wrk set it. The CPU and instruction rows are the ones to trust then. The Redis rows of 1 and 4"
        print "connections are bound by latency (each request waits for its reply; both servers idle between requests), not"
        print "by a busy CPU: no such rule there."
        print ""
        print "| goal | measured | |"
        print "|---|---|---|"
        for (i = 1; i <= ngoal; i++) print gl[i]
        print ""
        if (("limit_req_rl" in R) && ("limit_req" in R)) {
            same = sprintf("`limit_req_rl` (the same limit_req, in the nginx that loads nginx-rl) ran at %.3fx `limit_req`", R["limit_req_rl"] / R["limit_req"])
            if (("rl_baseline" in R) && base != "") same = same sprintf(", and `rl_baseline` (the same file, no limit) at %.3fx `baseline`", R["rl_baseline"] / R[base])
            print "The req/s goals compare nginx-rl with limit_req in the same nginx process (`*_rl` rows), each row on a"
            print "server of its own answering the same request. Against stock nginx: " same ": two"
            print "processes running the same code, apart by what separates them (the heap glibc's malloc works in, shaped"
            print "by each configuration; the machine's other load while each ran), not by a limiter."
            print ""
        }
    }

    print "## How these numbers are made"
    print ""
    print "- Every nginx is Debian's `/usr/sbin/nginx`, one worker pinned to CPU 0 (`worker_cpu_affinity`), its own prefix"
    print "  and temp paths under a temporary directory, loopback ports picked free; `access_log off`, keep-alive"
    print "  (`keepalive_requests 1000000`), every location serves the same small static file. The baseline and"
    print "  limit_req run in an nginx without our module; nginx-rl in one that loads it; the Lua peer in one with"
    print "  lua-nginx-module. wrk runs pinned to CPU 1, with the same threads, connections and Lua script"
    print "  (`bench/wrk/load.lua`) for every scenario. The warm-up run counts each status; the timed runs count"
    print "  only statuses of 400 and above (wrk's own count): to count each, wrk copies every response's header fields"
    print "  and body into Lua, work that grows with the fields a response carries (with it, wrk was the bottleneck"
    print "  of the reject rows, at 98% of its CPU)."
    print "- Scenarios run in interleaved rounds, in a fresh random order each round, after a warm-up run of each;"
    print "  a lease row (`/lease*`) also runs untimed just before each of its timed runs (`BENCH_LEASE_WARM`, 2 s),"
    print "  so that its rounds time leases in a steady state, not the cold start the other rows' minute leaves."
    print "- Admit paths use limits no client reaches (limit_req `rate=100000000r/s burst=100000000 nodelay`; nginx-rl"
    print "  `rate=100000000r/s burst=65536`, the largest `sliding_log` allows); reject paths one request a minute"
    print "  (limit_req `rate=1r/m`, nginx-rl `rate=1r/m burst=1`). A run whose status mix is wrong (an admit path"
    print "  answering anything but 200, a reject path less than 99% 429, any 5xx; in a timed run, an admit path with"
    print "  any status of 400 or above, a reject path with less than 99% of them) fails the bench."
    print "- Logging: both modules log rejections at `error`; the bench sets `error_log ... crit`, so neither writes a"
    print "  line per rejection and the reject paths compare the limiters, not the log writes."
    print "- nginx-rl answers with its default `rl_headers legacy` (three `X-RateLimit-*` fields on every limited"
    print "  response); limit_req adds none. The Lua peer adds none either (it only decides, one EVALSHA per request,"
    print "  pooled connections via `set_keepalive`)."
    print "- Many keys: `X-User: u<random>` out of 1,000 or 1,000,000, zones of 256m (one per scenario)."
    if (meta["skip_redis"] != "") {
        print "- The Redis scenarios of nginx-rl were skipped: `nginx -t` rejects `bench/conf/rlredis.conf`"
        print "  (" meta["skip_redis"] "). They run as soon as the module accepts it."
    } else {
        print "- Redis: the Lua peer and nginx-rl's Redis zone (`rl_zone redis redis=redis://127.0.0.1:PORT/0`,"
        print "  `bench/conf/rlredis.conf`) use the same redis-server (`--save \"\"`, no AOF), admit path; one key, or `X-User`"
        print "  out of 1,000 (the peer keys on it too). nginx-rl sends the requests of one event-loop iteration in one script"
        print "  call, which reads and writes a key that several of them share once: the one-key scenarios show that best"
        print "  case, the 1K-keys ones the usual case of distinct clients."
        print "- Where redis-server runs, two layouts: beside nginx on CPU 0, the server side, so that the load generator"
        print "  has a CPU to itself and never sets the pace; req/s then measures what a rate-limited request costs the"
        print "  servers, nginx and Redis together. And beside wrk on CPU 1 (the groups `redis beside wrk`, the bench's"
        print "  layout until 2026-11-30): nginx's worker has CPU 0 to itself, and wrk (about 8 us a request) and"
        print "  redis-server share CPU 1, which can bind the rate when redis-server is busy. run.sh moves redis-server"
        print "  (all its threads, `taskset -a`) to the row's CPU before each run."
        print "- The 1K-keys scenarios run `fixed` against the peer's fixed window at 1, 4, 16, 32 and 128 connections, and"
        print "  `gcra` against its token bucket at 32 and 128, in both layouts. nginx-rl's batches grow with the requests"
        print "  in flight, so its cost per request (nginx and Redis) falls as the load rises. At low loads its worker idles"
        print "  between batches, and each request or reply that arrives then has to wake it: the `wake-ups` row above says"
        print "  what a wake-up costs on this machine. Where it costs tens of microseconds (a virtual machine whose idle CPUs"
        print "  halt), the rows of 1 and 4 connections measure mostly wake-ups."
        print "  nginx CPU counts every thread of the worker process; redis-server CPU (every thread of redis-server, from"
        print "  its `/proc/PID/task/*/schedstat` before and after each run) is shown apart, per completed request."
    }
    if (meta["skip_memcached"] != "") {
        print "- The Memcached scenarios of nginx-rl were skipped: `nginx -t` rejects `bench/conf/rlmemcached.conf`"
        print "  (" meta["skip_memcached"] ")."
    } else if (mcran) {
        print "- Memcached: nginx-rl's Memcached zone (`rl_zone memcached memcached=127.0.0.1:PORT on_error=deny`,"
        print "  `bench/conf/rlmemcached.conf`, an nginx of its own) on a memcached of its own (`-U 0 -m 64 -t 1`: one worker"
        print "  thread, as redis-server answers on one core), which run.sh starts and moves (`taskset -a`) as it does"
        print "  redis-server: the `rlmemcached_*` rows run the lines of the Redis zone rows beside them (`fixed` and"
        print "  `sliding`, `rate=100000000r/s burst=65536`, admit path; one key, or `X-User` out of 1,000 at 1, 4, 16, 32"
        print "  and 128 connections). Such a line's window is 655 us: nearly every request starts a counter, which"
        print "  memcached creates (its `ma` with autovivify) where Redis rewrites a key's state. `on_error=deny`: a request"
        print "  memcached fails or does not answer within the zone's timeout (50 ms) is answered 429, and fails its row."
        print "  memcached's CPU (every thread, `/proc/PID/task/*/schedstat`, as redis-server's) is in the server CPU"
        print "  column; it has no count of the round trips (\"Redis calls\": -)."
    }
}
