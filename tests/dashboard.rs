//! The Grafana dashboard (`contrib/grafana-nginx-rl.json`) against a real
//! Prometheus: Grafana only draws what its Prometheus queries return, and
//! Grafana itself is not installable here, so a real `prometheus` scrapes a
//! real nginx with the module (shared-memory, Redis, Sentinel and failing
//! Redis zones) while requests go through it, and then every query of the
//! dashboard (each panel's, each variable's) is run through Prometheus' HTTP
//! API with the variables as Grafana fills them in: each must succeed and
//! return series, some with values of the right kind. `promtool check
//! rules` checks the syntax of every query besides.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::redis::{Redis, Sentinel};
use common::*;

/// What Grafana puts for its interval variables, in seconds: a range that
/// covers the whole run however slow the machine (the counters must
/// increase within it). Grafana's own `$__rate_interval` is at least four
/// scrape intervals, and grows with the time range shown.
const RANGE_S: u64 = 300;

/// The job name of the scrape; the dashboard selects by `instance` only.
const JOB: &str = "nginx-rl";

/// One series of a query's result: its labels and value.
type Series = (BTreeMap<String, String>, f64);

/// A `prometheus` on 127.0.0.1 scraping `/metrics` of one target every
/// second, with its storage in a temporary directory; killed on drop.
struct Prometheus {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Prometheus {
    /// Whether prometheus is installed (said so if not).
    fn installed() -> bool {
        let found =
            Command::new("prometheus").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
        if !found {
            eprintln!("prometheus is not installed (Debian package prometheus): the dashboard's queries are not run");
        }
        found
    }

    fn start(target_port: u16) -> Prometheus {
        let dir = std::env::temp_dir().join(format!("nginx-rl-prometheus-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("prometheus.yml");
        fs::write(
            &conf,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: {JOB}\n    metrics_path: /metrics\n    \
                 static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
            ),
        )
        .unwrap();
        let mut last_log = String::new();
        // The probed port may be taken before prometheus binds it: retry.
        for attempt in 0..5 {
            let port = free_port();
            let log_path = dir.join(format!("prometheus-{attempt}.log"));
            let log = fs::File::create(&log_path).unwrap();
            let child = Command::new("prometheus")
                .arg(format!("--config.file={}", conf.display()))
                .arg(format!("--storage.tsdb.path={}", dir.join(format!("data-{attempt}")).display()))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("cannot run prometheus");
            let mut p = Prometheus { port, dir: dir.clone(), child: Some(child) };
            if p.wait_ready() {
                return p;
            }
            p.kill();
            last_log = fs::read_to_string(&log_path).unwrap_or_default();
            if !last_log.contains("address already in use") {
                break;
            }
        }
        panic!("prometheus did not start:\n{last_log}");
    }

    /// Waits (20 s at most) for `/-/ready`; false if it exited or timed out.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                return false;
            }
            if try_get(self.port, "/-/ready", &[]).is_ok_and(|r| r.status == 200) {
                return true;
            }
            thread::sleep(Duration::from_millis(50));
        }
        false
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// GET `path` of the HTTP API: its JSON `data`, or the error it reported.
    fn api(&self, path: &str) -> Result<Value, String> {
        let r = get(self.port, path, &[]);
        let v: Value =
            serde_json::from_str(&r.body).map_err(|e| format!("HTTP {} not JSON ({e}): {}", r.status, r.body))?;
        if r.status != 200 || v["status"] != "success" {
            return Err(format!("HTTP {}: {} {}", r.status, v["errorType"], v["error"]));
        }
        Ok(v["data"].clone())
    }

    /// An instant query at the present time: its series.
    fn query(&self, expr: &str) -> Result<Vec<Series>, String> {
        let data = self.api(&format!("/api/v1/query?query={}", url_encode(expr)))?;
        if data["resultType"] != "vector" {
            return Err(format!("a {} where a vector was expected", data["resultType"]));
        }
        let series = data["result"].as_array().ok_or("no result")?;
        series
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .ok_or("no metric")?
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect();
                let value = s["value"][1].as_str().and_then(|v| v.parse().ok()).ok_or("no value")?;
                Ok((labels, value))
            })
            .collect()
    }

    /// Polls `expr` until `done` holds of its series (`what` says what is
    /// awaited in the failure).
    fn wait_for(&self, expr: &str, what: &str, done: impl Fn(&[Series]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.query(expr);
            if got.as_deref().is_ok_and(&done) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {expr} gave {got:?} after 20 s");
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A label value as Grafana writes a single selected value of a variable
/// used in a regex matcher: regex metacharacters escaped, for a PromQL
/// string (its backslashes doubled).
fn grafana_regex_value(v: &str) -> String {
    v.chars().map(|c| if "\\^$.|?*+()[]{}".contains(c) { format!("\\\\{c}") } else { c.to_string() }).collect()
}

/// One query of the dashboard: where it is and its text.
struct Query {
    /// `panel title / refId`, or `variable NAME`.
    place: String,
    text: String,
}

/// Every panel target's `expr`, in panels nested in rows too; panics on a
/// panel (other than a row) without one.
fn panel_queries(dashboard: &Value) -> Vec<Query> {
    fn walk(panels: &Value, out: &mut Vec<Query>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?");
            if p["type"] == "row" {
                walk(&p["panels"], out);
                continue;
            }
            let before = out.len();
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap_or_else(|| panic!("panel {title:?}: a target without expr"));
                let place = format!("{title} / {}", t["refId"].as_str().unwrap_or("?"));
                out.push(Query { place, text: expr.to_string() });
            }
            assert!(out.len() > before, "panel {title:?} has no query");
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The dashboard's variables of type `query`: name and query text.
fn variable_queries(dashboard: &Value) -> Vec<Query> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let name = v["name"].as_str().unwrap_or("?");
            let text = v["query"]["query"].as_str().or(v["query"].as_str()).unwrap_or_default();
            Query { place: format!("variable {name}"), text: text.to_string() }
        })
        .collect()
}

/// `text` with the variables filled in as Grafana does: the dashboard's own
/// from `values` (by name), the interval ones with [`RANGE_S`]. Panics on a
/// variable it does not know, so that a new one is not sent as is.
fn substitute(text: &str, values: &BTreeMap<String, String>) -> String {
    let mut vars: Vec<(String, String)> = ["__rate_interval", "__interval", "__range"]
        .iter()
        .map(|n| (n.to_string(), format!("{RANGE_S}s")))
        .chain(values.iter().map(|(k, v)| (k.clone(), v.clone())))
        .collect();
    // Longest first: `$__interval` must not eat `$__interval_ms`.
    vars.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    let mut out = text.to_string();
    for (name, value) in &vars {
        out = out.replace(&format!("${{{name}}}"), value).replace(&format!("${name}"), value);
    }
    assert!(!out.contains('$'), "a variable this test does not fill in: {text}");
    out
}

/// `label_values(SELECTOR, LABEL)` as Grafana runs it: the label's values
/// over the series the selector matches.
fn label_values(prom: &Prometheus, text: &str) -> Result<Vec<String>, String> {
    let args = text
        .trim()
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("not a label_values(selector, label) query: {text}"))?;
    let (selector, label) = args.rsplit_once(',').ok_or_else(|| format!("no label in {text}"))?;
    let data =
        prom.api(&format!("/api/v1/label/{}/values?match%5B%5D={}", label.trim(), url_encode(selector.trim())))?;
    Ok(data.as_array().ok_or("not a list")?.iter().filter_map(|v| v.as_str().map(String::from)).collect())
}

/// `promtool check rules` on a rules file with every query (a recording
/// rule each): the syntax, as Prometheus' own parser sees it.
fn promtool_check(dir: &Path, queries: &[(String, String)]) {
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (place, expr))| json!({"record": format!("dashboard:query_{i}"), "expr": expr, "labels": {"place": place}}))
        .collect();
    // JSON is YAML.
    let file = dir.join("dashboard.rules.yml");
    fs::write(&file, json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string()).unwrap();
    let out = Command::new("promtool").args(["check", "rules"]).arg(&file).output().expect("cannot run promtool");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool check rules:\n{said}");
    assert!(said.contains(&format!("SUCCESS: {} rules found", queries.len())), "promtool check rules:\n{said}");
}

/// The value of the one series of `rs` whose labels include `want`.
fn value(rs: &[Series], want: &[(&str, &str)], place: &str) -> f64 {
    let found: Vec<f64> = rs
        .iter()
        .filter(|(l, _)| want.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(found.len(), 1, "{place}: one series with {want:?} expected in {rs:?}");
    found[0]
}

/// Checks that `v`, shown on a panel whose unit is per second, is the rate
/// of a counter that grew from zero by `total` within the range: over the
/// range, at least `total`, and less than three times that (`rate()`
/// extrapolates past the last sample by about a scrape interval, at most
/// the time from its first sample to its last). A count over the range would
/// be `RANGE_S` times too large.
fn per_second(v: f64, total: f64, place: &str) {
    let over_range = v * RANGE_S as f64;
    assert!(
        total > 0.0 && over_range >= total * 0.999 && over_range < total * 3.0,
        "{place}: {v}/s for {total} in {RANGE_S} s"
    );
}

const BODY: &str = "location /open/ { rl_limit zone=z rate=6000r/m burst=6000 name=open; }\n\
     location /tight/ { rl_limit zone=z rate=1r/h name=tight; }\n\
     location /shadow/ { rl_limit zone=z rate=1r/h name=shadow dry_run; }\n\
     location /redis/ { rl_limit zone=rr rate=6000r/m burst=6000 name=redis; }\n\
     location /sentinel/ { rl_limit zone=rs rate=6000r/m burst=6000 name=sentinel; }\n\
     location /dead/ { rl_limit zone=rdead rate=6000r/m burst=6000 name=dead; }\n\
     location /charged/ { rl_limit zone=rr rate=600000r/m burst=6000 name=charged algorithm=token_bucket \
         cost=$arg_cost charge=after; }\n\
     location = /metrics { rl_metrics; }";

/// Every request of one round: (path, how many at once, the status each gets
/// after the first round).
const ROUND: &[(&str, usize, u16)] = &[
    ("/open/", 4, 200),
    ("/tight/", 2, 429),
    ("/shadow/", 2, 200),
    ("/redis/", 4, 200),
    ("/sentinel/", 2, 200),
    ("/dead/", 2, 429),
    (CHARGED, 2, 200),
];

/// A `charge=after` request whose cost Redis refuses to charge: admitted,
/// and counted in `nginx_rl_charge_failures_total` once its charge is
/// refused, for its token bucket would leave the range the script computes
/// exactly (`sliding`, the default, would take it; so would this bucket at a
/// rate below about 7,400 a second, where the cost capped at a week's
/// refill fits in the range). The unreachable zone
/// cannot fail a charge: its line fails in the access phase already, and a
/// line that failed there is not charged (`on_error=deny` rejects the
/// request, `allow` leaves the line out of it).
const CHARGED: &str = "/charged/?cost=10000000000000";

#[test]
fn every_query_of_the_dashboard_returns_series() {
    if !Prometheus::installed() {
        return;
    }
    let t0 = Instant::now();
    let redis = Redis::start();
    let sentinel = Sentinel::start(redis.port);
    // A port nothing listens on: the zone's calls are refused.
    let dead = free_port();
    let zones = format!(
        "rl_zone z size=1m;\n\
         rl_zone rr redis={} timeout=1s;\n\
         rl_zone rs redis={} timeout=1s prefix=s:;\n\
         rl_zone rdead redis=redis://127.0.0.1:{dead} timeout=1s on_error=deny;",
        redis.url(),
        sentinel.url()
    );
    let setup = ["open", "tight", "shadow", "redis", "sentinel", "dead", "charged"]
        .iter()
        .fold(Nginx::setup(&server(&zones, BODY)), |s, d| s.file(&format!("html/{d}/index.html"), "x\n"));
    let ngx = setup.start();
    let prom = Prometheus::start(ngx.port);
    let instance = format!("127.0.0.1:{}", ngx.port);

    // A scrape before any request, so that every counter's increase lies
    // within the queries' range.
    prom.wait_for(&format!("up{{job=\"{JOB}\"}} == 1"), "a first scrape", |s| !s.is_empty());

    // Rounds of requests for about 2 s, while Prometheus scrapes.
    let mut sent = 0;
    let mut sent_to: BTreeMap<&str, usize> = BTreeMap::new();
    let mut admitted_tight = 0;
    let start = Instant::now();
    for round in 0..20 {
        if round >= 2 && start.elapsed() > Duration::from_secs(2) {
            break;
        }
        for &(path, n, status) in ROUND {
            let got = statuses(&ngx.concurrent(n, path, &[]));
            sent += n;
            *sent_to.entry(path).or_insert(0) += n;
            if path == "/tight/" && round == 0 {
                admitted_tight = got.get(&200).copied().unwrap_or(0);
                assert_eq!(got, counts(&[(200, 1), (429, n - 1)]), "{path}");
            } else {
                assert_eq!(got, counts(&[(status, n)]), "{path} in round {round}");
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(admitted_tight, 1);

    // Each request is one verdict of one line: wait until Prometheus has
    // scraped them all, and the Sentinel zone's master.
    prom.wait_for(&format!("sum(nginx_rl_requests_total{{job=\"{JOB}\"}})"), "every request scraped", |s| {
        s.first().is_some_and(|(_, v)| *v == sent as f64)
    });
    prom.wait_for("nginx_rl_redis_master", "the Sentinel zone's master scraped", |s| !s.is_empty());
    // The charges are refused after the responses, by the zone's calls.
    let charged = sent_to[CHARGED];
    prom.wait_for(
        &format!("sum(nginx_rl_charge_failures_total{{job=\"{JOB}\"}})"),
        "every refused charge scraped",
        |s| s.first().is_some_and(|(_, v)| *v == charged as f64),
    );

    let text = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/grafana-nginx-rl.json"))
        .expect("contrib/grafana-nginx-rl.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is not JSON");
    let panels = panel_queries(&dashboard);
    let variables = variable_queries(&dashboard);
    assert!(!panels.is_empty() && !variables.is_empty());

    // "All" selected, as the dashboard opens: each variable's allValue.
    let all: BTreeMap<String, String> = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["name"].as_str()?.to_string(), v["allValue"].as_str()?.to_string())))
        .collect();
    // This nginx selected in the instance variable.
    let mut one = all.clone();
    one.insert("instance".into(), grafana_regex_value(&instance));

    // The variables: instance is the scrape's target, zone and line list
    // every zone and line.
    let mut failures = Vec::new();
    let mut values = BTreeMap::new();
    for q in &variables {
        match label_values(&prom, &substitute(&q.text, &one)) {
            Ok(v) if !v.is_empty() => {
                values.insert(q.place.clone(), v);
            }
            got => failures.push(format!("{}: {} gave {got:?}", q.place, q.text)),
        }
    }
    let list = |name: &str| values.get(&format!("variable {name}")).cloned().unwrap_or_default();
    if failures.is_empty() {
        assert_eq!(list("instance"), [instance.as_str()]);
        assert_eq!(list("zone"), ["rdead", "rr", "rs", "z"]);
        assert_eq!(list("line"), ["charged", "dead", "open", "redis", "sentinel", "shadow", "tight"]);
    }

    // Every panel's query, with All selected and with this instance.
    let mut results: BTreeMap<String, Vec<Series>> = BTreeMap::new();
    let mut checked = Vec::new();
    for (selection, vars) in [("all", &all), ("instance", &one)] {
        for q in &panels {
            let expr = substitute(&q.text, vars);
            match prom.query(&expr) {
                Ok(rs) if !rs.is_empty() => {
                    if selection == "all" {
                        results.insert(q.place.clone(), rs);
                    }
                }
                got => failures.push(format!("{} ({selection} selected): {expr}\n  gave {got:?}", q.place)),
            }
            checked.push((format!("{} ({selection})", q.place), expr));
        }
    }
    assert!(failures.is_empty(), "queries of the dashboard that return nothing:\n{}", failures.join("\n"));
    promtool_check(&prom.dir, &checked);

    // Values of the right kind.
    let r = |place: &str| results.get(place).unwrap_or_else(|| panic!("no panel query {place:?}"));
    let verdicts = r("Requests by verdict (per second) / A");
    for (zone, line, result) in [
        ("z", "open", "passed"),
        ("z", "tight", "rejected"),
        ("rr", "redis", "passed"),
        ("rdead", "dead", "error_denied"),
    ] {
        let v = value(verdicts, &[("zone", zone), ("line", line), ("result", result)], "verdicts");
        assert!(v > 0.0, "{line} {result}: {v}/s");
    }
    let rejected = value(verdicts, &[("line", "tight"), ("result", "rejected")], "verdicts");
    per_second(rejected, (sent_to["/tight/"] - 1) as f64, "tight rejected");
    let denied = value(verdicts, &[("line", "dead"), ("result", "error_denied")], "verdicts");
    per_second(denied, sent_to["/dead/"] as f64, "dead error_denied");
    let share = r("Rejected share per line / A");
    assert_eq!(value(share, &[("line", "open")], "share"), 0.0);
    let tight = value(share, &[("line", "tight")], "share");
    assert!(tight > 0.5 && tight < 1.0, "tight: {tight}");
    assert_eq!(value(share, &[("line", "dead")], "share"), 1.0);
    // The admitted rate over one key's rate (6000r/m): the one client's
    // requests, in keys' worth of the rate.
    let keys = value(r("Admitted rate in keys' worth of the configured rate / A"), &[("line", "open")], "admitted");
    per_second(keys * 100.0, sent_to["/open/"] as f64, "open admitted");
    let shadow = r("Dry run: what shadow lines would reject / A");
    assert!(value(shadow, &[("line", "shadow"), ("result", "dry_run_rejected")], "dry run") > 0.0);
    let fill = value(r("Zone fill (keys / capacity) / A"), &[("zone", "z")], "fill");
    assert!(fill > 0.0 && fill < 0.01, "zone z: {fill}");
    assert_eq!(value(r("Evictions (per second) / A"), &[("zone", "z"), ("state", "limited")], "evictions"), 0.0);
    for zone in ["rr", "rs", "rdead"] {
        assert!(value(r("Script calls and requests per call / A"), &[("zone", zone)], "calls") > 0.0, "{zone}");
        assert!(value(r("Script calls and requests per call / B"), &[("zone", zone)], "per call") >= 1.0, "{zone}");
    }
    for place in ["Call latency / A", "Call latency / B"] {
        let v = value(r(place), &[("zone", "rr")], place);
        assert!(v > 0.0 && v <= 1.0, "{place}: {v} s");
    }
    let errors = r("Errors and on_error / A");
    assert!(value(errors, &[("zone", "rdead"), ("kind", "connection")], "errors") > 0.0);
    assert_eq!(value(errors, &[("zone", "rr"), ("kind", "connection")], "errors"), 0.0);
    let denied = value(r("Errors and on_error / B"), &[("zone", "rdead"), ("action", "denied")], "on_error");
    per_second(denied, sent_to["/dead/"] as f64, "on_error denied");
    // The panel's unit is per second: so are the connects drawn on it.
    let connects = prom.query("nginx_rl_redis_connects_total{zone=\"rr\"}").unwrap_or_default();
    let connects = value(&connects, &[("zone", "rr")], "connects_total");
    per_second(value(r("Errors and on_error / C"), &[("zone", "rr")], "connects"), connects, "connects");
    let failed = value(r("Errors and on_error / D"), &[("zone", "rr")], "charge failures");
    per_second(failed, charged as f64, "charge failures");
    let addr = format!("127.0.0.1:{}", redis.port);
    assert_eq!(value(r("Sentinel master / A"), &[("zone", "rs"), ("addr", &addr)], "master"), 1.0);

    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    eprintln!(
        "{} panel queries and {} variables checked against a real scrape in {:.1} s",
        panels.len(),
        variables.len(),
        t0.elapsed().as_secs_f64()
    );
}
