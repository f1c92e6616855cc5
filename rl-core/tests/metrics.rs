//! The rendering of `rl_metrics`: the verdict each line counts, the
//! Prometheus text format (escaping, cumulative buckets, exact seconds) and
//! JSON with the same numbers.

use rl_core::metrics::*;

fn snapshot() -> Snapshot {
    Snapshot {
        lines: vec![LineSample {
            zone: "z".into(),
            line: "we\"ird\\na\nme".into(),
            results: [1, 2, 3, 4, 5, 6, 7],
            rate_per_s: Some(10.0 / 60.0),
            burst: Some(5),
            max: None,
            classes: Vec::new(),
        }],
        shm: vec![ShmZoneSample {
            zone: "z".into(),
            size_bytes: 1 << 20,
            keys: 3,
            capacity_keys: 17_000,
            bytes_used: 70_000,
            evicted_idle: 8,
            evicted_limited: 9,
            conn: None,
        }],
        redis: vec![RedisZoneSample {
            zone: "r".into(),
            calls: 3,
            call_requests: 7,
            latency: [1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            latency_sum_us: 2_000_750,
            errors: [1, 2, 3, 4],
            on_error_allowed: 5,
            on_error_denied: 6,
            connects: 2,
            charge_failures: 3,
            charge_unknown: 4,
            masters: vec!["127.0.0.1:6380".into()],
            conn: Some(ConnSample { in_flight: 2, reclaimed: 5, waiting: 0 }),
            memcached: false,
            counters_lost: 0,
        }],
        leases: vec![LeaseZoneSample {
            zone: "l\"e".into(),
            syncs: 12,
            sync_failures: 2,
            sync_latency_sum_us: 36_500,
            keys_synced: 30,
            leases_granted: 9,
            units_granted: 240,
            units_returned: 17,
            alone: 1,
            alone_now: 1,
            nodes: 4,
            keys: 3,
            capacity_keys: 7_000,
        }],
    }
}

#[test]
fn verdicts() {
    assert_eq!(verdict(true, false, 0), PASSED);
    assert_eq!(verdict(true, true, 0), PASSED);
    assert_eq!(verdict(true, false, 1), DELAYED);
    assert_eq!(verdict(true, true, 1), DRY_RUN_DELAYED);
    assert_eq!(verdict(false, false, 0), REJECTED);
    assert_eq!(verdict(false, true, 5), DRY_RUN_REJECTED);
    assert_eq!(error_verdict(true, false), ERROR_ALLOWED);
    assert_eq!(error_verdict(false, true), ERROR_ALLOWED);
    assert_eq!(error_verdict(false, false), ERROR_DENIED);
    assert_eq!(RESULTS[ERROR_DENIED], "error_denied");
}

#[test]
fn latency_buckets() {
    assert_eq!(latency_bucket(0), 0);
    assert_eq!(latency_bucket(250), 0);
    assert_eq!(latency_bucket(251), 1);
    assert_eq!(latency_bucket(1_000_000), LATENCY_BOUNDS_US.len() - 1);
    assert_eq!(latency_bucket(1_000_001), LATENCY_BUCKETS - 1);
}

#[test]
fn prometheus_text() {
    let mut out = String::new();
    prometheus(&snapshot(), &mut out);
    let line = r#"line="we\"ird\\na\nme""#;
    assert!(out.contains(&format!("nginx_rl_requests_total{{zone=\"z\",{line},result=\"passed\"}} 1\n")), "{out}");
    assert!(out.contains(&format!("nginx_rl_requests_total{{zone=\"z\",{line},result=\"error_denied\"}} 7\n")));
    assert!(out.contains(&format!("nginx_rl_limit{{zone=\"z\",{line},param=\"rate\"}} 0.16666666666666666\n")));
    assert!(out.contains(&format!("nginx_rl_limit{{zone=\"z\",{line},param=\"burst\"}} 5\n")));
    assert!(out.contains("# TYPE nginx_rl_requests_total counter\n"));
    assert!(out.contains("nginx_rl_charge_failures_total{zone=\"r\"} 3\n"), "{out}");
    assert!(out.contains("nginx_rl_charge_unknown_total{zone=\"r\"} 4\n"), "{out}");
    assert!(out.contains("nginx_rl_zone_evictions_total{zone=\"z\",state=\"limited\"} 9\n"));
    assert!(out.contains("nginx_rl_zone_capacity_keys{zone=\"z\"} 17000\n"));
    // Cumulative buckets, bounds in seconds, the sum exact.
    assert!(out.contains("nginx_rl_redis_call_duration_seconds_bucket{zone=\"r\",le=\"0.00025\"} 1\n"), "{out}");
    assert!(out.contains("nginx_rl_redis_call_duration_seconds_bucket{zone=\"r\",le=\"0.001\"} 2\n"));
    assert!(out.contains("nginx_rl_redis_call_duration_seconds_bucket{zone=\"r\",le=\"1\"} 2\n"));
    assert!(out.contains("nginx_rl_redis_call_duration_seconds_bucket{zone=\"r\",le=\"+Inf\"} 3\n"));
    assert!(out.contains("nginx_rl_redis_call_duration_seconds_sum{zone=\"r\"} 2.00075\n"));
    assert!(out.contains("nginx_rl_redis_call_duration_seconds_count{zone=\"r\"} 3\n"));
    assert!(out.contains("nginx_rl_redis_errors_total{zone=\"r\",kind=\"refused\"} 4\n"));
    assert!(out.contains("nginx_rl_redis_master{zone=\"r\",addr=\"127.0.0.1:6380\"} 1\n"));
    // A Redis zone's rl_conn lines, in the shared-memory zones' families.
    assert!(out.contains("nginx_rl_conn_in_flight{zone=\"r\"} 2\n"), "{out}");
    assert!(out.contains("nginx_rl_conn_reclaimed_total{zone=\"r\"} 5\n"), "{out}");
    // Every family has its HELP and TYPE, once.
    for l in out.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = l.split(' ').nth(2).unwrap_or("");
        assert_eq!(out.matches(&format!("# HELP {name} ")).count(), 1, "{name}");
        assert_eq!(out.matches(&format!("# TYPE {name} ")).count(), 1, "{name}");
    }
}

/// A Memcached zone beside a Redis zone: its numbers in families of its
/// own (`nginx_rl_memcached_*`, its errors of a reply as `reply`, its lost
/// counters), the charge families shared, each family once.
#[test]
fn memcached_zones_have_families_of_their_own() {
    let mut s = snapshot();
    let redis = s.redis[0].clone();
    s.redis.push(RedisZoneSample {
        zone: "m".into(),
        calls: 8,
        errors: [0, 1, 2, 0],
        charge_failures: 1,
        memcached: true,
        counters_lost: 3,
        masters: vec![],
        conn: None,
        ..redis
    });
    let mut out = String::new();
    prometheus(&s, &mut out);
    assert!(out.contains("nginx_rl_memcached_calls_total{zone=\"m\"} 8\n"), "{out}");
    assert!(!out.contains("nginx_rl_redis_calls_total{zone=\"m\"}"), "{out}");
    assert!(out.contains("nginx_rl_redis_calls_total{zone=\"r\"} 3\n"), "{out}");
    assert!(out.contains("nginx_rl_memcached_errors_total{zone=\"m\",kind=\"reply\"} 2\n"), "{out}");
    assert!(out.contains("nginx_rl_memcached_counters_lost_total{zone=\"m\"} 3\n"), "{out}");
    assert!(out.contains("nginx_rl_charge_failures_total{zone=\"m\"} 1\n"), "{out}");
    assert!(!out.contains("nginx_rl_memcached_master"), "{out}");
    for l in out.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = l.split(' ').nth(2).unwrap_or("");
        assert_eq!(out.matches(&format!("# TYPE {name} ")).count(), 1, "{name}");
    }
    let mut json_out = String::new();
    json(&s, &mut json_out);
    assert!(json_out.contains("{\"zone\":\"m\",\"store\":\"memcached\",\"counters_lost\":3,\"calls\":8"), "{json_out}");
}

/// A line of classes: its verdicts by class, in both formats; no class
/// family without one.
#[test]
fn classes() {
    let mut s = snapshot();
    let mut out = String::new();
    prometheus(&s, &mut out);
    assert!(!out.contains("nginx_rl_class_requests_total"), "{out}");
    s.lines[0].classes = vec![("premium".into(), [9, 0, 0, 0, 0, 0, 0]), ("standard".into(), [1, 2, 3, 0, 0, 0, 0])];
    out.clear();
    prometheus(&s, &mut out);
    let line = r#"line="we\"ird\\na\nme""#;
    let class = |c: &str, r: &str, n: u64| {
        format!("nginx_rl_class_requests_total{{zone=\"z\",{line},class=\"{c}\",result=\"{r}\"}} {n}\n")
    };
    assert!(out.contains(&class("premium", "passed", 9)), "{out}");
    assert!(out.contains(&class("standard", "rejected", 3)), "{out}");
    assert!(out.contains("# TYPE nginx_rl_class_requests_total counter\n"));
    out.clear();
    json(&s, &mut out);
    assert!(
        out.contains(r#""burst":5},"classes":{"premium":{"passed":9,"delayed":0,"rejected":0,"dry_run_delayed":0,"dry_run_rejected":0,"error_allowed":0,"error_denied":0},"standard":{"passed":1,"delayed":2,"rejected":3,"#),
        "{out}"
    );
}

#[test]
fn nothing_configured_renders_nothing() {
    let mut out = String::new();
    prometheus(&Snapshot::default(), &mut out);
    assert_eq!(out, "");
    json(&Snapshot::default(), &mut out);
    assert_eq!(out, "{\"lines\":[],\"zones\":[],\"redis\":[],\"leases\":[]}\n");
}

#[test]
fn json_has_the_same_numbers() {
    let mut out = String::new();
    json(&snapshot(), &mut out);
    assert!(out.contains(r#""line":"we\"ird\\na\u000ame""#), "{out}");
    assert!(out.contains(r#""requests":{"passed":1,"delayed":2,"rejected":3,"dry_run_delayed":4,"dry_run_rejected":5,"error_allowed":6,"error_denied":7}"#));
    assert!(out.contains(r#""limit":{"rate":0.16666666666666666,"burst":5}"#));
    assert!(out.contains(r#""evictions":{"idle":8,"limited":9}"#));
    assert!(out.contains(r#""0.001":2"#) && out.contains(r#""+Inf":3},"sum":2.00075,"count":3}"#), "{out}");
    assert!(out.contains(
        r#""on_error":{"allowed":5,"denied":6},"charge_failures":3,"charge_unknown":4,"connects":2,"masters":["127.0.0.1:6380"],"conn":{"in_flight":2,"reclaimed":5}}"#
    ));
}

/// A lease zone: its counters, the sync time as a summary (sum exact, count
/// the calls), its keys as gauges, the zone label escaped; JSON has the same
/// numbers. No lease family without a lease zone.
#[test]
fn lease_zones() {
    let mut out = String::new();
    prometheus(&snapshot(), &mut out);
    let z = r#"{zone="l\"e"}"#;
    for (name, kind, value) in [
        ("nginx_rl_lease_syncs_total", "counter", "12"),
        ("nginx_rl_lease_sync_failures_total", "counter", "2"),
        ("nginx_rl_lease_keys_synced_total", "counter", "30"),
        ("nginx_rl_leases_granted_total", "counter", "9"),
        ("nginx_rl_lease_units_granted_total", "counter", "240"),
        ("nginx_rl_lease_units_returned_total", "counter", "17"),
        ("nginx_rl_lease_alone_total", "counter", "1"),
        ("nginx_rl_lease_alone", "gauge", "1"),
        ("nginx_rl_lease_nodes", "gauge", "4"),
        ("nginx_rl_lease_keys", "gauge", "3"),
        ("nginx_rl_lease_capacity_keys", "gauge", "7000"),
    ] {
        assert!(out.contains(&format!("# TYPE {name} {kind}\n")), "{name}: {out}");
        assert!(out.contains(&format!("\n{name}{z} {value}\n")), "{name}: {out}");
    }
    assert!(out.contains("# TYPE nginx_rl_lease_sync_duration_seconds summary\n"), "{out}");
    assert!(out.contains(&format!("\nnginx_rl_lease_sync_duration_seconds_sum{z} 0.0365\n")), "{out}");
    assert!(out.contains(&format!("\nnginx_rl_lease_sync_duration_seconds_count{z} 12\n")), "{out}");
    // Every family has its HELP and TYPE, once, and its samples right after them.
    let families: Vec<&str> =
        out.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
    for name in &families {
        assert_eq!(out.matches(&format!("# HELP {name} ")).count(), 1, "{name}");
        assert_eq!(out.matches(&format!("# TYPE {name} ")).count(), 1, "{name}");
    }
    let mut current = "";
    for l in out.lines() {
        if let Some(t) = l.strip_prefix("# TYPE ") {
            current = t.split(' ').next().unwrap_or("");
        } else if !l.starts_with('#') {
            assert!(l.starts_with(current), "{l} after # TYPE {current}");
        }
    }

    let mut out = String::new();
    json(&snapshot(), &mut out);
    assert!(
        out.ends_with(
            r#"],"leases":[{"zone":"l\"e","syncs":12,"sync_failures":2,"sync_duration_seconds":{"sum":0.0365,"count":12},"keys_synced":30,"leases_granted":9,"units_granted":240,"units_returned":17,"alone":1,"alone_now":1,"nodes":4,"keys":3,"capacity_keys":7000}]}
"#
        ),
        "{out}"
    );

    // Without a lease zone: no lease family, an empty list.
    let s = Snapshot { leases: Vec::new(), ..snapshot() };
    let mut out = String::new();
    prometheus(&s, &mut out);
    assert!(!out.contains("lease"), "{out}");
    assert!(out.contains("nginx_rl_redis_calls_total"), "{out}");
    let mut out = String::new();
    json(&s, &mut out);
    assert!(out.ends_with("],\"leases\":[]}\n"), "{out}");
}

#[test]
fn label_values_are_escaped_only_where_needed() {
    let esc = |v: &str| {
        let mut out = String::new();
        escape_label(v, &mut out);
        out
    };
    assert_eq!(esc("api-v2_zone"), "api-v2_zone");
    assert_eq!(esc(""), "");
    assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    assert_eq!(esc("é\""), "é\\\"");
}
