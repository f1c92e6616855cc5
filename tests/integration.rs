//! End-to-end tests: a real nginx with the module, real HTTP requests.
//!
//! Limited resources are static files (the limiter runs in the access
//! phase, after `return` would already have answered).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::*;

// ---------------------------------------------------------------------------
// 1. Exact admission under concurrency, for every algorithm.
// ---------------------------------------------------------------------------

/// 300 simultaneous requests against burst=50: exactly 50 pass. The rate is
/// slow (50 an hour) so that nothing refills and no fixed window ends
/// while the requests are being served.
fn exact_burst_under_concurrency(alg: &str) {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        &format!("location / {{ rl_limit zone=z rate=50r/h burst=50 algorithm={alg}; }}"),
    ));
    let rs = ngx.concurrent(300, "/index.html", &[]);
    assert_eq!(statuses(&rs), counts(&[(200, 50), (429, 250)]), "algorithm={alg}");
    for r in rs.iter().filter(|r| r.status == 200) {
        assert_eq!(r.body, "index\n");
    }
    // One "limiting requests, excess: ... by zone" line per rejected request.
    let logged = ngx.error_log().matches(" by zone \"z\", client: ").count();
    assert_eq!(logged, 250, "rejections logged for algorithm={alg}");
}

macro_rules! burst_tests {
    ($($name:ident => $alg:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            exact_burst_under_concurrency($alg);
        }
    )*};
}

burst_tests! {
    burst_exact_fixed => "fixed",
    burst_exact_sliding => "sliding",
    burst_exact_sliding_log => "sliding_log",
    burst_exact_token_bucket => "token_bucket",
    burst_exact_leaky_bucket => "leaky_bucket",
    burst_exact_gcra => "gcra",
}

// ---------------------------------------------------------------------------
// 2. Refill.
// ---------------------------------------------------------------------------

/// rate=10r/s burst=5: 5 of 6 simultaneous requests pass, the 6th is a 429
/// with `Retry-After: 1` (every algorithm's wait is below a second here);
/// right after, still 429; after waiting (Retry-After, or `wait` if given)
/// one request passes.
fn refill(alg: &str, wait: Option<Duration>) {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        &format!("location / {{ rl_limit zone=z key=$http_x_k rate=10r/s burst=5 algorithm={alg}; }}"),
    ));
    for attempt in 0..3 {
        let key = format!("key{attempt}");
        let h = [("X-K", key.as_str())];
        let rs = ngx.concurrent(6, "/index.html", &h);
        let st = statuses(&rs);
        // Six passing is legitimate only if a window ended (or a token
        // refilled) during the burst: try again with a new key.
        if st == counts(&[(200, 6)]) && attempt < 2 {
            eprintln!("{alg}: burst straddled a refill, retrying with a new key");
            continue;
        }
        assert_eq!(st, counts(&[(200, 5), (429, 1)]), "algorithm={alg}");
        let rejected = rs.iter().find(|r| r.status == 429).unwrap();
        let retry_after = rejected.num("Retry-After");
        assert_eq!(retry_after, 1, "Retry-After of algorithm={alg} (10r/s burst=5): {rejected:?}");

        let again = ngx.get("/index.html", &h);
        assert_eq!(again.status, 429, "algorithm={alg}: passed right after the burst: {again:?}");

        thread::sleep(wait.unwrap_or(Duration::from_secs(retry_after)) + Duration::from_millis(30));
        let after = ngx.get("/index.html", &h);
        assert_eq!(after.status, 200, "algorithm={alg}: still limited after waiting: {after:?}");
        return;
    }
}

#[test]
fn refill_token_bucket() {
    refill("token_bucket", None);
}

#[test]
fn refill_gcra() {
    refill("gcra", None);
}

#[test]
fn refill_sliding() {
    refill("sliding", None);
}

#[test]
fn refill_sliding_log() {
    refill("sliding_log", None);
}

#[test]
fn refill_leaky_bucket() {
    refill("leaky_bucket", None);
}

/// Fixed windows of 0.5 s (10r/s burst=5): a short sleep past the window
/// end (less than Retry-After's whole second) is enough.
#[test]
fn refill_fixed_window_short_sleep() {
    refill("fixed", Some(Duration::from_millis(550)));
}

// ---------------------------------------------------------------------------
// 3. Response headers, rl_status, error_page.
// ---------------------------------------------------------------------------

const RL_HEADERS: [&str; 6] =
    ["x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit", "ratelimit-policy", "retry-after"];

fn assert_no_rl_headers(r: &Response, what: &str) {
    for h in &RL_HEADERS {
        assert!(r.header(h).is_none(), "{what}: unexpected {h} in {r:?}");
    }
}

#[test]
fn headers_legacy_by_default() {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        "location = /a.html { rl_limit zone=z key=$http_x_k rate=10r/m burst=10 algorithm=fixed; }\n\
         location = /b.html { rl_limit zone=z key=$http_x_k rate=10r/m burst=10; }",
    ));
    let h = [("X-K", "alice")];
    // The fixed window's eleven requests in one minute (a window ending
    // between two of them failed CI once).
    clear_of_window_end(60, 5);
    let now = unix_now();
    let first = ngx.get("/a.html", &h);
    assert_eq!(first.status, 200);
    assert_eq!(first.header("X-RateLimit-Limit"), Some("10"), "{first:?}");
    assert_eq!(first.header("X-RateLimit-Remaining"), Some("9"), "{first:?}");
    let reset = first.num("X-RateLimit-Reset");
    assert!((now..=now + 60 + 2).contains(&reset), "X-RateLimit-Reset {reset} not in [{now}, {now}+62]");
    assert!(first.header("RateLimit").is_none() && first.header("RateLimit-Policy").is_none(), "{first:?}");
    assert!(first.header("Retry-After").is_none(), "Retry-After on an admitted request: {first:?}");

    for remaining in (0..9).rev() {
        let r = ngx.get("/a.html", &h);
        assert_eq!(r.status, 200);
        assert_eq!(r.num("X-RateLimit-Remaining"), remaining, "{r:?}");
    }
    let now = unix_now();
    let rejected = ngx.get("/a.html", &h);
    assert_eq!(rejected.status, 429);
    let retry_after = rejected.num("Retry-After");
    assert!((1..=61).contains(&retry_after), "Retry-After {retry_after} (fixed window of 60 s)");
    assert_eq!(rejected.header("X-RateLimit-Limit"), Some("10"), "{rejected:?}");
    assert_eq!(rejected.header("X-RateLimit-Remaining"), Some("0"), "{rejected:?}");
    let reset = rejected.num("X-RateLimit-Reset");
    assert!((now..=now + 62).contains(&reset), "X-RateLimit-Reset {reset} of a 429 not in [{now}, {now}+62]");

    // Default algorithm (sliding): a request weighs in until the end of the
    // next window, so the reset is within two windows.
    let now = unix_now();
    let r = ngx.get("/b.html", &h);
    assert_eq!(
        (r.status, r.header("X-RateLimit-Limit"), r.header("X-RateLimit-Remaining")),
        (200, Some("10"), Some("9"))
    );
    let reset = r.num("X-RateLimit-Reset");
    assert!((now..=now + 2 * 60 + 2).contains(&reset), "sliding X-RateLimit-Reset {reset} not in [{now}, {now}+122]");
}

/// The legacy fields are added however full the response's field list is:
/// nginx keeps it in parts of 20, and the three fields are written in one
/// step where the last part has room for them, else one by one. The
/// upstream's fields (1 to 24 of them) fill the list to every boundary.
#[test]
fn headers_legacy_after_many_upstream_fields() {
    let backend: String = (1..=24)
        .map(|i| {
            let fields: String = (1..=i).map(|j| format!("add_header X-F{j} v{j};")).collect();
            format!("location = /backend/{i} {{ {fields} return 200 ok; }}\n")
        })
        .collect();
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        &format!(
            "location /p/ {{ rl_limit zone=z key=$uri rate=10r/m burst=10; \
             proxy_pass http://127.0.0.1:{{PORT}}/backend/; }}\n{backend}"
        ),
    ));
    for i in 1..=24 {
        let r = ngx.get(&format!("/p/{i}"), &[]);
        assert_eq!(r.status, 200, "{r:?}");
        let last = format!("X-F{i}");
        assert_eq!(r.header(&last), Some(format!("v{i}").as_str()), "{i} upstream fields: {r:?}");
        assert_eq!(
            (r.header("X-RateLimit-Limit"), r.header("X-RateLimit-Remaining")),
            (Some("10"), Some("9")),
            "{i} upstream fields: {r:?}"
        );
        let reset = r.num("X-RateLimit-Reset");
        assert!(reset >= unix_now(), "{i} upstream fields: X-RateLimit-Reset {reset}: {r:?}");
    }
}

/// The legacy fields' numbers in decimal, whatever their digits: from one to
/// ten, with zeros inside and at the end.
#[test]
fn headers_legacy_numbers() {
    let bursts: [u64; 9] = [1, 10, 100, 1000, 10_000, 10_001, 65_536, 100_000_000, 1_000_000_007];
    let locs: String = bursts
        .iter()
        .map(|b| {
            format!("location = /n/{b}.html {{ rl_limit zone=z key=$http_x_k rate=1r/s burst={b} algorithm=gcra; }}\n")
        })
        .collect();
    let mut setup = Nginx::setup(&server(
        "rl_zone z size=1m;",
        &(locs + "location = /day.html { rl_limit zone=z key=$http_x_k rate=1r/d burst=1 algorithm=gcra; }"),
    ))
    .file("html/day.html", "day\n");
    for b in bursts {
        setup = setup.file(&format!("html/n/{b}.html"), "n\n");
    }
    let ngx = setup.start();
    let h = [("X-K", "carol")];
    for b in bursts {
        let now = unix_now();
        let r = ngx.get(&format!("/n/{b}.html"), &h);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("X-RateLimit-Limit"), Some(b.to_string().as_str()), "{r:?}");
        assert_eq!(r.header("X-RateLimit-Remaining"), Some((b - 1).to_string().as_str()), "{r:?}");
        // One request at 1r/s is gone after a second.
        let reset = r.header("X-RateLimit-Reset").unwrap_or_else(|| panic!("no X-RateLimit-Reset in {r:?}"));
        let n: u64 = reset.parse().unwrap_or_else(|_| panic!("X-RateLimit-Reset {reset:?}"));
        assert!((now..=now + 2).contains(&n) && !reset.starts_with('0'), "X-RateLimit-Reset {reset} for {now}");
    }
    // Far in the future: a second request a day, a reset of whole days.
    let now = unix_now();
    assert_eq!(ngx.get("/day.html", &h).status, 200);
    let r = ngx.get("/day.html", &h);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("Retry-After"), Some("86400"), "{r:?}");
    let reset = r.num("X-RateLimit-Reset");
    assert!((now + 86_400..=now + 86_402).contains(&reset), "X-RateLimit-Reset {reset} for {now} + 1 day");
}

#[test]
fn headers_modes_draft_off_both() {
    // One line per location (the key holds the URI): the same line in all three would be one budget.
    let loc = |name: &str, mode: &str| {
        format!(
            "location = /{name}.html {{ rl_limit zone=z key=$http_x_k$uri rate=10r/m burst=10 algorithm=fixed; rl_headers {mode}; }}\n"
        )
    };
    let ngx = Nginx::setup(&server(
        "rl_zone z size=1m;",
        &(loc("draft", "draft") + &loc("off", "off") + &loc("both", "both")),
    ))
    .file("html/draft.html", "draft\n")
    .file("html/off.html", "off\n")
    .file("html/both.html", "both\n")
    .start();
    let h = [("X-K", "bob")];
    clear_of_window_end(60, 5);

    // draft
    let r = ngx.get("/draft.html", &h);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("RateLimit-Policy"), Some("\"z\";q=10;w=60"), "{r:?}");
    let state = r.header("RateLimit").unwrap_or_else(|| panic!("no RateLimit in {r:?}"));
    assert!(state.starts_with("\"z\";r=9;t="), "RateLimit: {state}");
    let t = sf_param(&r, "RateLimit", "z", "t");
    assert!((1..=60).contains(&t), "RateLimit t={t}");
    assert!(!r.has_header_prefix("x-ratelimit"), "draft sent X-RateLimit-*: {r:?}");
    for _ in 0..9 {
        assert_eq!(ngx.get("/draft.html", &h).status, 200);
    }
    let r = ngx.get("/draft.html", &h);
    assert_eq!(r.status, 429);
    assert_eq!(sf_param(&r, "RateLimit", "z", "r"), 0, "{r:?}");
    assert_eq!(r.header("RateLimit-Policy"), Some("\"z\";q=10;w=60"), "{r:?}");
    assert!(!r.has_header_prefix("x-ratelimit"), "draft sent X-RateLimit-* on a 429: {r:?}");

    // off: limited, but no rate-limit fields
    for i in 0..10 {
        let r = ngx.get("/off.html", &h);
        assert_eq!(r.status, 200, "request {i}");
        assert_no_rl_headers(&r, "rl_headers off");
    }
    let r = ngx.get("/off.html", &h);
    assert_eq!(r.status, 429, "rl_headers off must still limit");
    assert_no_rl_headers(&r, "rl_headers off (429)");

    // both
    let r = ngx.get("/both.html", &h);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("X-RateLimit-Limit"), Some("10"), "{r:?}");
    assert_eq!(r.header("X-RateLimit-Remaining"), Some("9"), "{r:?}");
    assert!(r.header("X-RateLimit-Reset").is_some(), "{r:?}");
    assert_eq!(r.header("RateLimit-Policy"), Some("\"z\";q=10;w=60"), "{r:?}");
    assert_eq!(sf_param(&r, "RateLimit", "z", "r"), 9);
}

/// Several values on one `rl_headers` line send the fields of each:
/// `legacy draft` is `both`, `legacy draft-6` adds draft 6's
/// `RateLimit-Limit` / `-Remaining` / `-Reset` (delta seconds) and its
/// `RateLimit-Policy`; with `draft`, one `RateLimit-Policy`, draft 10's. A
/// value given twice is a warning, as in nginx's bitmask directives.
#[test]
fn headers_values_combine() {
    fn names(r: &Response) -> Vec<&str> {
        let ours = |n: &&str| RL_HEADERS.contains(n) || n.starts_with("ratelimit-");
        r.headers.iter().map(|(n, _)| n.as_str()).filter(ours).collect()
    }
    let loc = |name: &str, mode: &str| {
        format!(
            "location = /{name}.html {{ rl_limit zone=z key=$uri rate=10r/m burst=10 algorithm=fixed; rl_headers {mode}; }}\n"
        )
    };
    let body = loc("ld", "legacy draft") + &loc("l6", "legacy draft-6") + &loc("d6", "draft-6 draft");
    let ngx = Nginx::setup(&server("rl_zone z size=1m;", &body))
        .file("html/ld.html", "ld\n")
        .file("html/l6.html", "l6\n")
        .file("html/d6.html", "d6\n")
        .start();
    let r = ngx.get("/ld.html", &[]);
    assert_eq!(
        names(&r),
        ["x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit-policy", "ratelimit"],
        "{r:?}"
    );
    assert_eq!(r.header("RateLimit-Policy"), Some("\"z\";q=10;w=60"), "{r:?}");

    let r = ngx.get("/l6.html", &[]);
    assert_eq!(
        names(&r),
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "ratelimit-limit",
            "ratelimit-remaining",
            "ratelimit-reset",
            "ratelimit-policy"
        ],
        "{r:?}"
    );
    assert_eq!((r.num("RateLimit-Limit"), r.num("RateLimit-Remaining")), (10, 9), "{r:?}");
    // The delta to the same instant X-RateLimit-Reset gives as Unix time.
    let reset = r.num("RateLimit-Reset");
    assert!((1..=60).contains(&reset) && r.num("X-RateLimit-Reset").abs_diff(unix_now() + reset) <= 2, "{r:?}");
    assert_eq!(r.header("RateLimit-Policy"), Some("10;w=60"), "{r:?}");

    let r = ngx.get("/d6.html", &[]);
    assert_eq!(
        names(&r),
        ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "ratelimit-policy", "ratelimit"],
        "{r:?}"
    );
    assert_eq!(r.header("RateLimit-Policy"), Some("\"z\";q=10;w=60"), "{r:?}");
    assert_eq!(sf_param(&r, "RateLimit", "z", "r"), r.num("RateLimit-Remaining"), "{r:?}");
    assert_eq!(sf_param(&r, "RateLimit", "z", "t"), r.num("RateLimit-Reset"), "{r:?}");

    let (ok, out) = nginx_t(&server("rl_zone z size=1m;", "rl_headers both legacy;"));
    assert!(
        ok && out.contains("[warn]") && out.contains("duplicate value \"legacy\" in \"rl_headers\" directive"),
        "{out}"
    );
}

#[test]
fn rl_status_changes_rejection_status() {
    let ngx =
        Nginx::start(&server("rl_zone z size=1m;", "location / { rl_limit zone=z rate=2r/h burst=2; rl_status 503; }"));
    let got: Vec<u16> = (0..4).map(|_| ngx.get("/index.html", &[]).status).collect();
    assert_eq!(got, [200, 200, 503, 503]);
    let r = ngx.get("/index.html", &[]);
    assert_eq!(r.status, 503);
    assert!(r.num("Retry-After") >= 1);
    assert_eq!(r.header("X-RateLimit-Remaining"), Some("0"), "{r:?}");
}

/// `error_page 429` serves the custom page with status 429; error pages
/// (429 and 404) are internal redirects back through the access phase,
/// and every request is still counted exactly once.
#[test]
fn error_page_served_and_counted_once() {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        " rl_limit zone=z key=$http_x_k rate=5r/h burst=5;\n\
          error_page 429 /limited.html;\n\
          error_page 404 /404.html;\n\
          location / { }",
    ));
    let h = [("X-K", "carol")];
    for remaining in [4, 3] {
        let r = ngx.get("/missing.html", &h);
        assert_eq!((r.status, r.body.as_str()), (404, "custom not found page\n"));
        assert_eq!(r.num("X-RateLimit-Remaining"), remaining, "404 through error_page: {r:?}");
    }
    for remaining in [2, 1, 0] {
        let r = ngx.get("/index.html", &h);
        assert_eq!(r.status, 200);
        assert_eq!(r.num("X-RateLimit-Remaining"), remaining, "{r:?}");
    }
    for _ in 0..2 {
        let r = ngx.get("/a.html", &h);
        assert_eq!(r.status, 429, "{r:?}");
        assert_eq!(r.body, "custom limited page\n", "error_page 429 not served: {r:?}");
        assert_eq!(r.header("X-RateLimit-Limit"), Some("5"), "{r:?}");
        assert_eq!(r.header("X-RateLimit-Remaining"), Some("0"), "{r:?}");
        assert!(r.num("Retry-After") >= 1);
    }
    let logged = ngx.error_log().matches(" by zone \"z\", client: ").count();
    assert_eq!(logged, 2, "each rejected request logged once");
    // Another key has its own, untouched budget.
    let r = ngx.get("/missing.html", &[("X-K", "dave")]);
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (404, 4));
}

// ---------------------------------------------------------------------------
// 4. Several lines: all or nothing.
// ---------------------------------------------------------------------------

/// A: per `X-A` key, burst 3. B: per client address, burst 8. A request is
/// charged on both lines or on neither.
#[test]
fn multiple_lines_all_or_nothing() {
    let ngx = Nginx::start(&server(
        "rl_zone za size=1m;\nrl_zone zb size=1m;",
        "location / {\n\
           rl_limit zone=za key=$http_x_a rate=3r/h burst=3;\n\
           rl_limit zone=zb rate=8r/h burst=8;\n\
           rl_headers draft;\n\
         }",
    ));
    let req = |k: &str| ngx.get("/index.html", &[("X-A", k)]);
    let mut admitted = 0;
    let mut b_remaining = 8;
    for a_remaining in [2, 1, 0] {
        let r = req("k1");
        assert_eq!(r.status, 200);
        admitted += 1;
        b_remaining -= 1;
        assert_eq!(sf_param(&r, "RateLimit", "za", "r"), a_remaining, "{r:?}");
        assert_eq!(sf_param(&r, "RateLimit", "zb", "r"), b_remaining, "{r:?}");
    }
    // A rejects: B must not be charged. Retry-After is sent without the
    // legacy fields: `sliding`'s wait, at most W + W / burst (an hour and
    // 20 minutes here, by the time into the window).
    for _ in 0..3 {
        let r = req("k1");
        assert_eq!(r.status, 429, "{r:?}");
        assert_eq!(sf_param(&r, "RateLimit", "za", "r"), 0, "{r:?}");
        assert!((1..=4800).contains(&r.num("Retry-After")), "{r:?}");
        assert!(r.header("X-RateLimit-Limit").is_none(), "{r:?}");
    }
    // Other A keys: B's remaining counts only the admitted requests.
    for k in ["k2", "k3"] {
        for _ in 0..(if k == "k2" { 3 } else { 2 }) {
            let r = req(k);
            assert_eq!(r.status, 200, "{k}: {r:?}");
            admitted += 1;
            b_remaining -= 1;
            assert_eq!(
                sf_param(&r, "RateLimit", "zb", "r"),
                b_remaining,
                "B charged for requests A rejected ({admitted} admitted so far): {r:?}"
            );
        }
    }
    assert_eq!((admitted, b_remaining), (8, 0));
    // B rejects: A must not be charged for the fresh key k4, and reports
    // its whole burst (3) as remaining every time: nothing was taken.
    for _ in 0..3 {
        let r = req("k4");
        assert_eq!(r.status, 429, "{r:?}");
        assert_eq!(sf_param(&r, "RateLimit", "zb", "r"), 0, "{r:?}");
        assert_eq!(sf_param(&r, "RateLimit", "za", "r"), 3, "A charged for a request B rejected: {r:?}");
    }
}

// ---------------------------------------------------------------------------
// 5–7. Keys.
// ---------------------------------------------------------------------------

#[test]
fn empty_key_is_not_limited() {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        "location / { rl_limit zone=z key=$http_x_api_key rate=5r/h burst=5; }",
    ));
    let rs = ngx.concurrent(100, "/index.html", &[]);
    assert_eq!(statuses(&rs), counts(&[(200, 100)]), "requests without a key");
    for r in &rs {
        assert!(!r.has_header_prefix("x-ratelimit") && r.header("RateLimit").is_none(), "{r:?}");
    }
    let rs = ngx.concurrent(20, "/index.html", &[("X-Api-Key", "secret")]);
    assert_eq!(statuses(&rs), counts(&[(200, 5), (429, 15)]), "requests with a key");
    let r = ngx.get("/index.html", &[("X-Api-Key", "other")]);
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, 4));
    assert_eq!(ngx.get("/index.html", &[]).status, 200, "keyless request after the key is exhausted");
}

#[test]
fn composite_keys() {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        "location / { rl_limit zone=z key=$http_x_user:$uri rate=3r/h burst=3; }",
    ));
    let u1 = [("X-User", "u1")];
    let got: Vec<u16> = (0..4).map(|_| ngx.get("/a.html", &u1).status).collect();
    assert_eq!(got, [200, 200, 200, 429]);
    let r = ngx.get("/b.html", &u1);
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, 2), "same user, other URI: {r:?}");
    let r = ngx.get("/a.html", &[("X-User", "u2")]);
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, 2), "other user, same URI: {r:?}");
    assert_eq!(ngx.get("/a.html", &u1).status, 429);
}

/// At debug level (nginx built `--with-debug`), one line per limit and
/// request says the verdict; the key shows as its hash, never as sent.
#[test]
fn debug_log_shows_each_verdict() {
    let version = std::process::Command::new(nginx_bin()).arg("-V").output().expect("nginx -V");
    if !String::from_utf8_lossy(&version.stderr).contains("--with-debug") {
        eprintln!("skipped: {} is not built --with-debug", nginx_bin().display());
        return;
    }
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        "location = /a.html { error_log debug.log debug; rl_limit zone=z key=$http_x_k rate=1r/h burst=1; }",
    ));
    let h = [("X-K", "dave")];
    assert_eq!(ngx.get("/a.html", &h).status, 200);
    assert_eq!(ngx.get("/a.html", &h).status, 429);
    let log = std::fs::read_to_string(ngx.prefix.join("debug.log")).expect("debug.log");
    let verdicts: Vec<&str> = log.lines().filter(|l| l.contains("rl: zone \"z\" line \"z\" key ")).collect();
    assert_eq!(verdicts.len(), 2, "{verdicts:#?}");
    assert!(verdicts[0].contains(": admitted, remaining 0, reset "), "{}", verdicts[0]);
    assert!(verdicts[0].ends_with("charged true"), "{}", verdicts[0]);
    assert!(verdicts[1].contains(": rejected, remaining 0, reset "), "{}", verdicts[1]);
    assert!(verdicts[1].ends_with("charged false"), "{}", verdicts[1]);
    assert!(verdicts.iter().all(|l| !l.contains("dave")), "a key in clear: {verdicts:#?}");
}

/// A key that is one variable, `$name` or `${name}`, is read as the
/// variable's value itself; anything else (`$1`, a regex capture) goes
/// through the complex value. Both count the same keys.
#[test]
fn keys_of_one_variable_braces_and_captures() {
    let ngx = Nginx::setup(&server(
        "rl_zone z size=1m;",
        "location /brace/ { rl_limit zone=z key=${http_x_k} rate=2r/h burst=2; }\n\
         location ~ ^/cap/(\\w+)\\.html$ { rl_limit zone=z key=$1 rate=2r/h burst=2; }",
    ))
    .file("html/brace/x.html", "x\n")
    .file("html/cap/alice.html", "alice\n")
    .file("html/cap/bob.html", "bob\n")
    .start();
    let alice = [("X-K", "alice")];
    let got: Vec<u16> = (0..3).map(|_| ngx.get("/brace/x.html", &alice).status).collect();
    assert_eq!(got, [200, 200, 429], "key=${{http_x_k}}");
    let r = ngx.get("/brace/x.html", &[("X-K", "bob")]);
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, 1), "another value of the variable: {r:?}");
    let r = ngx.get("/brace/x.html", &[]);
    assert_eq!(r.status, 200, "variable not found: not limited");
    assert_no_rl_headers(&r, "key=${http_x_k} without the header");

    let got: Vec<u16> = (0..3).map(|_| ngx.get("/cap/alice.html", &[]).status).collect();
    assert_eq!(got, [200, 200, 429], "key=$1");
    let r = ngx.get("/cap/bob.html", &[]);
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, 1), "another capture: {r:?}");
}

/// Lines sharing a zone (same key) keep separate states.
#[test]
fn lines_sharing_a_zone_are_independent() {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        "location = /a.html {\n\
           rl_limit zone=z key=$http_x_k rate=2r/h burst=2;\n\
           rl_limit zone=z key=$http_x_k rate=5r/h burst=5;\n\
           rl_headers draft;\n\
         }\n\
         location = /b.html { rl_limit zone=z key=$http_x_k rate=3r/h burst=3; }",
    ));
    let h = [("X-K", "same")];
    let r = ngx.get("/a.html", &h);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("RateLimit-Policy"), Some("\"z\";q=2;w=3600, \"z-2\";q=5;w=3600"), "{r:?}");
    assert_eq!((sf_param(&r, "RateLimit", "z", "r"), sf_param(&r, "RateLimit", "z-2", "r")), (1, 4), "{r:?}");
    let r = ngx.get("/a.html", &h);
    assert_eq!(r.status, 200);
    assert_eq!((sf_param(&r, "RateLimit", "z", "r"), sf_param(&r, "RateLimit", "z-2", "r")), (0, 3), "{r:?}");
    let r = ngx.get("/a.html", &h);
    assert_eq!(r.status, 429);
    assert_eq!(sf_param(&r, "RateLimit", "z", "r"), 0, "{r:?}");
    // The line of /b.html has its own count for the same key.
    for remaining in [2, 1, 0] {
        let r = ngx.get("/b.html", &h);
        assert_eq!(
            (r.status, r.num("X-RateLimit-Limit"), r.num("X-RateLimit-Remaining")),
            (200, 3, remaining),
            "{r:?}"
        );
    }
    assert_eq!(ngx.get("/b.html", &h).status, 429);
}

/// Lines are inherited from the enclosing level only if the current level
/// has none; `cost=` charges several units.
#[test]
fn inheritance_and_cost() {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        " rl_limit zone=z key=$http_x_k rate=2r/h burst=2;\n\
          location = /a.html { }\n\
          location = /b.html { rl_limit zone=z key=$http_x_k rate=5r/h burst=5 cost=2; }",
    ));
    let h = [("X-K", "gina")];
    let a: Vec<(u16, Option<String>)> = (0..3)
        .map(|_| ngx.get("/a.html", &h))
        .map(|r| (r.status, r.header("X-RateLimit-Remaining").map(String::from)))
        .collect();
    assert_eq!(
        a,
        [(200, Some("1".into())), (200, Some("0".into())), (429, Some("0".into()))],
        "server-level line inherited"
    );
    // /b.html has its own line (cost 2 of burst 5), not the server's.
    let b: Vec<(u16, Option<String>)> = (0..3)
        .map(|_| ngx.get("/b.html", &h))
        .map(|r| (r.status, r.header("X-RateLimit-Remaining").map(String::from)))
        .collect();
    assert_eq!(b, [(200, Some("3".into())), (200, Some("1".into())), (429, Some("1".into()))], "cost=2, burst=5");
}

// ---------------------------------------------------------------------------
// 8. Internal redirects.
// ---------------------------------------------------------------------------

#[test]
fn internal_redirect_counted_once() {
    let ngx = Nginx::setup(&server(
        "rl_zone z size=1m;",
        "location /dir/ { rl_limit zone=z rate=5r/h burst=5; index index.html; }\n\
         location /tf/ { rl_limit zone=z rate=4r/h burst=4; try_files $uri /tf/real.html; }",
    ))
    .file("html/tf/real.html", "real\n")
    .start();
    let rs: Vec<Response> = (0..10).map(|_| ngx.get("/dir/", &[])).collect();
    assert_eq!(statuses(&rs), counts(&[(200, 5), (429, 5)]), "index redirect");
    assert_eq!(rs[0].body, "dir index\n");
    let rem: Vec<u64> = rs[..5].iter().map(|r| r.num("X-RateLimit-Remaining")).collect();
    assert_eq!(rem, [4, 3, 2, 1, 0]);

    let rs: Vec<Response> = (0..10).map(|_| ngx.get("/tf/nothing-here", &[])).collect();
    assert_eq!(statuses(&rs), counts(&[(200, 4), (429, 6)]), "try_files redirect");
    assert_eq!(rs[0].body, "real\n");
    let rem: Vec<u64> = rs[..4].iter().map(|r| r.num("X-RateLimit-Remaining")).collect();
    assert_eq!(rem, [3, 2, 1, 0]);
}

// ---------------------------------------------------------------------------
// 9. Reload.
// ---------------------------------------------------------------------------

#[test]
fn state_kept_across_reload() {
    let conf = server("rl_zone z size=1m;", "location / { rl_limit zone=z key=$http_x_k rate=5r/h burst=5; }");
    let mut ngx = Nginx::start(&conf);
    let h = [("X-K", "erin")];
    let got: Vec<u16> = (0..6).map(|_| ngx.get("/index.html", &h).status).collect();
    assert_eq!(got, [200, 200, 200, 200, 200, 429]);
    let r = ngx.get("/index.html", &[("X-K", "frank")]);
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, 4));

    ngx.reload();
    let r = ngx.get("/index.html", &h);
    assert_eq!(r.status, 429, "exhausted key admitted after reload: {r:?}");
    let r = ngx.get("/index.html", &[("X-K", "frank")]);
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, 3), "count of another key after reload: {r:?}");

    // Reload with an unrelated change: the line is the same, so is its state.
    let conf2 = server(
        "rl_zone z size=1m;",
        "location / { rl_limit zone=z key=$http_x_k rate=5r/h burst=5; }\nlocation = /other.html { }",
    );
    ngx.reload_with(&conf2);
    assert_eq!(ngx.get("/index.html", &h).status, 429, "exhausted key admitted after second reload");
    let r = ngx.get("/index.html", &[("X-K", "frank")]);
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, 2));
}

/// A reload that adds the first `sliding_log` line to a zone laid out
/// without room for its logs is refused, as limit_req refuses a zone whose
/// key changed: the running configuration goes on limiting (it used to reset
/// the zone under the draining workers, which then skipped it), and a new
/// size lays the zone out anew.
#[test]
fn reload_that_cannot_reuse_a_zone_is_refused() {
    let line = "rl_limit zone=chg key=$http_x_key rate=1r/m burst=1;";
    let conf = server("rl_zone chg size=1m;", &format!("location / {{ {line} }}"));
    let mut ngx = Nginx::start(&conf);
    let h = [("X-Key", "k")];
    assert_eq!(ngx.get("/index.html", &h).status, 200);
    assert_eq!(ngx.get("/index.html", &h).status, 429);

    let log_line = "rl_limit zone=chg key=$http_x_key rate=1r/m burst=100 algorithm=sliding_log;";
    let refused = ngx.reload_refused(&server("rl_zone chg size=1m;", &format!("location / {{ {line} {log_line} }}")));
    assert!(
        refused.contains("[emerg]")
            && refused.contains(
                "rl_zone \"chg\" was laid out without room for sliding_log states; change its size to lay it out anew"
            ),
        "{refused}"
    );
    for _ in 0..20 {
        assert_eq!(ngx.get("/index.html", &h).status, 429, "the running configuration stopped limiting");
    }
    let log = ngx.error_log();
    assert!(!log.contains("is not initialised"), "{log}");

    // A new size: a new zone, fresh states, the sliding_log line at work.
    ngx.reload_with(&server("rl_zone chg size=2m;", &format!("location / {{ {line} {log_line} }}")));
    assert_eq!(ngx.get("/index.html", &h).status, 200);
    assert_eq!(ngx.get("/index.html", &h).status, 429);
    let log = ngx.error_log();
    let bad: Vec<&str> = log.lines().filter(|l| l.contains("exited on signal") || l.contains("[alert]")).collect();
    assert!(bad.is_empty(), "{bad:?}");
}

// ---------------------------------------------------------------------------
// 10. Zone full.
// ---------------------------------------------------------------------------

/// 5,000 distinct keys through a 32k zone: every one passes, and the only
/// trace of the full zone is its own warning, at most once per 10 s (no
/// `[crit]` from the slab allocator for each failed allocation, as a full
/// `sliding_log` zone used to print).
fn zone_full(alg: &str, rate: &str) {
    let ngx = Nginx::start(&server(
        "rl_zone small size=32k;",
        &format!("location / {{ rl_limit zone=small key=$http_x_user rate={rate} burst=10 algorithm={alg}; }}"),
    ));
    const USERS: usize = 5000;
    const THREADS: usize = 8;
    let port = ngx.port;
    let started = std::time::Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let next = next.clone();
            thread::spawn(move || {
                let mut st = BTreeMap::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= USERS {
                        return st;
                    }
                    let user = format!("user-{i}");
                    let r = get(port, "/index.html", &[("X-User", &user)]);
                    *st.entry(r.status).or_insert(0usize) += 1;
                }
            })
        })
        .collect();
    let mut st = BTreeMap::new();
    for h in handles {
        for (k, v) in h.join().unwrap() {
            *st.entry(k).or_insert(0) += v;
        }
    }
    let elapsed = started.elapsed().as_secs();
    assert_eq!(st, counts(&[(200, USERS)]), "algorithm={alg}: every distinct key must pass");
    let log = ngx.error_log();
    let full: Vec<&str> = log.lines().filter(|l| l.contains("rl_zone \"small\" is full")).collect();
    assert!(!full.is_empty(), "algorithm={alg}: no \"is full\" message in the error log:\n{log}");
    assert!(
        full.iter().all(|l| l.contains("[warn]") && l.contains(" evicted so far, ") && l.contains(" still limiting)")),
        "algorithm={alg}: {full:?}"
    );
    // At most one every 10 s: the time of the last one is kept in the zone, under its lock.
    assert!(full.len() as u64 <= 1 + elapsed / 10, "algorithm={alg}: {} lines in {elapsed} s", full.len());
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("[alert]") || l.contains("[emerg]") || l.contains("[crit]"))
        .take(5)
        .collect();
    assert!(bad.is_empty(), "algorithm={alg}: {bad:?}");
}

#[test]
fn zone_full_evicts_and_admits() {
    zone_full("fixed", "10r/h");
}

#[test]
fn zone_full_evicts_and_admits_sliding_log() {
    zone_full("sliding_log", "10r/h");
}

/// States that recover within a second are idle when dropped: the zone is
/// full all the same, and says so.
#[test]
fn zone_full_of_idle_states_warns() {
    zone_full("sliding_log", "100r/s");
}

// ---------------------------------------------------------------------------
// 11. nginx -t.
// ---------------------------------------------------------------------------

#[test]
fn config_test_messages() {
    let srv = |zones: &str, loc: &str| server(zones, &format!("location / {{ {loc} }}"));
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "unknown algorithm",
            srv("rl_zone z size=1m;", "rl_limit zone=z rate=1r/s algorithm=foo;"),
            vec!["\"rl_limit\"", "\"foo\""],
        ),
        ("zero rate", srv("rl_zone z size=1m;", "rl_limit zone=z rate=0r/s;"), vec!["\"rl_limit\"", "0r/s"]),
        ("malformed rate", srv("rl_zone z size=1m;", "rl_limit zone=z rate=abc;"), vec!["\"rl_limit\"", "\"abc\""]),
        (
            "zero burst",
            srv("rl_zone z size=1m;", "rl_limit zone=z rate=1r/s burst=0;"),
            vec!["\"rl_limit\"", "burst", "\"0\""],
        ),
        ("unknown zone", srv("rl_zone z size=1m;", "rl_limit zone=nope rate=1r/s;"), vec!["\"rl_limit\"", "\"nope\""]),
        ("missing zone", srv("rl_zone z size=1m;", "rl_limit rate=1r/s;"), vec!["\"rl_limit\"", "zone"]),
        (
            "duplicate zone",
            srv("rl_zone a size=1m;\nrl_zone a size=1m;", ""),
            vec!["\"rl_zone\"", "duplicate", "\"a\""],
        ),
        ("zone too small", srv("rl_zone a size=1k;", ""), vec!["\"rl_zone\"", "1k"]),
        ("bad rl_headers", srv("rl_zone z size=1m;", "rl_headers bogus;"), vec!["\"rl_headers\"", "\"bogus\""]),
        ("bad rl_status", srv("rl_zone z size=1m;", "rl_status 200;"), vec!["\"rl_status\"", "\"200\""]),
    ];
    let mut failures = Vec::new();
    for (what, conf, needles) in &cases {
        let (ok, out) = nginx_t(conf);
        let missing: Vec<&&str> = needles.iter().filter(|n| !out.contains(**n)).collect();
        // Every message points at the configuration line.
        if ok || !out.contains("[emerg]") || !out.contains("nginx.conf:") || !missing.is_empty() {
            failures.push(format!("{what}: accepted={ok}, missing {missing:?} in:\n{out}"));
        }
    }
    let (ok, out) = nginx_t(
        &(srv(
            "rl_zone z size=1m;",
            "rl_limit zone=z rate=10r/s burst=20 algorithm=gcra; rl_limit zone=z key=$http_x_k rate=100r/m; \
         rl_limit zone=later key=$http_x_k:$uri rate=5r/d cost=2 algorithm=sliding_log; \
         rl_headers both; rl_status 503;",
        ) + "rl_zone later size=64k;\n"),
    );
    if !ok || !out.contains("syntax is ok") || !out.contains("test is successful") {
        failures.push(format!("good configuration refused:\n{out}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n----\n"));
}

// ---------------------------------------------------------------------------
// 12. Windows on the wall clock's.
// ---------------------------------------------------------------------------

/// A daily `fixed` line's window ends at midnight UTC: windows are aligned to
/// the Unix epoch, on shared memory (nginx's monotonic clock, moved to the
/// epoch) as on Redis (its `TIME`). The reset the headers give is a
/// multiple of a day, within the rounding to whole seconds.
fn daily_window_ends_at_midnight_utc(zone: &str) {
    let ngx = Nginx::start(&server(zone, "location / { rl_limit zone=z rate=1000r/d algorithm=fixed; }"));
    let r = ngx.get("/index.html", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    let reset = r.num("X-RateLimit-Reset");
    let past = reset % 86_400;
    assert!(past <= 1 || past >= 86_399, "the window ends {past} s past midnight UTC: {r:?}");
}

#[test]
fn daily_window_ends_at_midnight_utc_shm() {
    daily_window_ends_at_midnight_utc("rl_zone z size=1m;");
}

#[test]
fn daily_window_ends_at_midnight_utc_redis() {
    let redis = common::redis::Redis::start();
    daily_window_ends_at_midnight_utc(&format!("rl_zone z redis={} timeout=1s;", redis.url()));
}

// ---------------------------------------------------------------------------
// The harness itself.
// ---------------------------------------------------------------------------

/// Test servers (nginx, Redis) listen below the kernel's ephemeral range,
/// where no outgoing connection can take their port between its probe and
/// their bind: a CI run failed on nginx's `[emerg] bind() ... Address
/// already in use` when the ports came from that range.
#[test]
fn test_servers_listen_below_the_ephemeral_range() {
    let ngx = Nginx::start(&server("rl_zone z size=1m;", "location / { rl_limit zone=z rate=1r/m; }"));
    let redis = common::redis::Redis::start();
    assert!(ngx.port < ephemeral_low(), "nginx on {}", ngx.port);
    assert!(redis.port < ephemeral_low(), "Redis on {}", redis.port);
    assert_eq!(ngx.get("/index.html", &[]).status, 200);
}
