//! The rate-limit fields of every `rl_headers` dialect, read by the client
//! libraries that read that dialect, not by our own parsing: the numbers a
//! client gets are the ones the module decided (`$rl_limit`,
//! `$rl_remaining`, `$rl_reset`, sent beside them by `add_header`), on an
//! admitted and on a rejected response.
//!
//! - `legacy`, `draft-6`, `legacy draft-6`: express-rate-limit's
//!   `ratelimit-header-parser` (npm), which reads `RateLimit-Limit` /
//!   `-Remaining` / `-Reset` (delta seconds) and `X-RateLimit-*` (a reset
//!   above 10^9 read as Unix time);
//! - `draft`, `both`, `draft draft-6`: RFC 9651 parsers, `structured-headers`
//!   (npm) and `http-sf` (PyPI), of `RateLimit` and `RateLimit-Policy`, an
//!   item per line; and `ratelimit-header-parser` on them, which reads any
//!   `RateLimit` field as draft 7's `limit=, remaining=, reset=` dictionary
//!   and gets NaN (what the README's table says: it does not read these).
//!
//! The parsers are installed once, pinned, under `target/header-clients`
//! (npm `--prefix`, pip `--target` with Debian's /usr/bin/python3). Where one
//! cannot be installed (no node or network), the tests that need it say so
//! on stderr, uncaptured, and stop there.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use common::*;
use serde_json::Value;

const NPM_PACKAGES: [&str; 2] = ["ratelimit-header-parser@0.1.0", "structured-headers@2.1.0"];
const PY_PACKAGE: &str = "http-sf==1.5.0";

/// Reads the fields a response's headers (a JSON object, lowercase names)
/// as the clients do.
const NODE_READER: &str = r#"
const { parseRateLimit } = require("ratelimit-header-parser");
const sh = require("structured-headers");
let input = "";
process.stdin.on("data", (d) => (input += d)).on("end", () => {
  const h = JSON.parse(input);
  const p = parseRateLimit(h);
  const num = (x) => (typeof x === "number" && Number.isFinite(x) ? x : null);
  const list = (v) =>
    v === undefined ? null : sh.parseList(v).map(([item, params]) => [typeof item === "number" ? item : String(item), Object.fromEntries(params)]);
  const out = {
    parser: p === undefined ? null : {
      limit: num(p.limit),
      remaining: num(p.remaining),
      reset_ms: p.reset instanceof Date && !Number.isNaN(p.reset.getTime()) ? p.reset.getTime() : null,
    },
    now_ms: Date.now(),
    ratelimit: list(h["ratelimit"]),
    policy: list(h["ratelimit-policy"]),
  };
  console.log(JSON.stringify(out));
});
"#;

const PY_READER: &str = r#"
import json, sys
import http_sf
h = json.load(sys.stdin)
def items(v):
    if v is None:
        return None
    return [[n if isinstance(n, (str, int)) else str(n), dict(p)] for n, p in http_sf.parse(v.encode(), tltype="list")]
print(json.dumps({"ratelimit": items(h.get("ratelimit")), "policy": items(h.get("ratelimit-policy"))}))
"#;

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/header-clients")
}

/// Says, on stderr (not captured by the test harness, so shown for a test
/// that passes), that `what` is not tested, and why.
fn skipped(what: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED: {what} not tested: {why}");
}

fn run_quiet(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{cmd:?}: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!("{cmd:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr))),
    }
}

/// The npm packages, installed once for the test binary: `Err` says why not.
fn npm_clients() -> Result<&'static Path, String> {
    static DONE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let done = DONE.get_or_init(|| {
        let dir = clients_dir();
        let installed = NPM_PACKAGES
            .iter()
            .all(|p| dir.join("node_modules").join(p.rsplit_once('@').map_or(*p, |(n, _)| n)).is_dir());
        if !installed {
            fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            run_quiet(
                Command::new("timeout")
                    .args(["300", "npm", "install", "--no-audit", "--no-fund", "--fetch-retries=1", "--prefix"])
                    .arg(&dir)
                    .args(NPM_PACKAGES),
            )?;
        }
        fs::write(dir.join("read.js"), NODE_READER).map_err(|e| e.to_string())?;
        Ok(dir)
    });
    done.as_deref().map_err(Clone::clone)
}

/// `http-sf` for Debian's python, installed once: `Err` says why not.
fn py_clients() -> Result<&'static Path, String> {
    static DONE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let done = DONE.get_or_init(|| {
        let dir = clients_dir().join("py");
        if !dir.join("http_sf").is_dir() {
            fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            run_quiet(
                Command::new("timeout")
                    .args(["300", "/usr/bin/python3", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                    .args(["--retries", "1", "--target"])
                    .arg(&dir)
                    .arg(PY_PACKAGE),
            )?;
        }
        fs::write(dir.join("read.py"), PY_READER).map_err(|e| e.to_string())?;
        Ok(dir)
    });
    done.as_deref().map_err(Clone::clone)
}

/// The response's headers as a JSON object (a field sent twice joined by
/// ", ", as HTTP combines them).
fn headers_json(r: &Response) -> String {
    let mut m: BTreeMap<&str, String> = BTreeMap::new();
    for (n, v) in &r.headers {
        m.entry(n.as_str()).and_modify(|x| *x = format!("{x}, {v}")).or_insert_with(|| v.clone());
    }
    serde_json::to_string(&m).unwrap()
}

fn run_reader(cmd: &mut Command, input: &str) -> Value {
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("cannot run the reader");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "reader failed on {input}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// What the node clients read of `r`.
fn node_read(dir: &Path, r: &Response) -> Value {
    run_reader(
        Command::new("node").arg(dir.join("read.js")).env("NODE_PATH", dir.join("node_modules")),
        &headers_json(r),
    )
}

/// What `http-sf` reads of `r`.
fn py_read(dir: &Path, r: &Response) -> Value {
    run_reader(Command::new("/usr/bin/python3").arg(dir.join("read.py")).env("PYTHONPATH", dir), &headers_json(r))
}

/// What the module decided for the line behind `$rl_status`: its limit,
/// remaining and reset (seconds), from the variables.
fn decided(r: &Response) -> (u64, u64, u64) {
    let v = r.header("X-Decided").unwrap_or_else(|| panic!("no X-Decided in {r:?}"));
    let n: Vec<u64> = v.split(' ').map(|x| x.parse().unwrap_or_else(|_| panic!("X-Decided {v:?}"))).collect();
    (n[0], n[1], n[2])
}

fn count(r: &Response, name: &str) -> usize {
    r.headers.iter().filter(|(n, _)| n == name).count()
}

/// A location of `lines` (the key holds the URI: one budget per location)
/// with `rl_headers mode`, and the decision in `X-Decided`.
fn loc(path: &str, mode: &str, lines: &str) -> String {
    format!(
        "location = /{path}.html {{ {lines} rl_headers {mode};\n\
         add_header X-Decided \"$rl_limit $rl_remaining $rl_reset\" always; }}\n"
    )
}

/// gcra 10r/m burst=3: one unit comes back every 6 s; a fresh key's first
/// request leaves 2, full in 6 s; the fourth in a row is rejected, 0 left,
/// full in 18 s, Retry-After 6.
const ONE: &str = "rl_limit zone=z key=$http_x_k$uri rate=10r/m burst=3 algorithm=gcra name=api;";
/// Two lines: `wide` (gcra 60r/m burst=20, w=20) and `narrow` (as ONE): the
/// narrow one is behind `$rl_status` on both responses.
const TWO: &str = "rl_limit zone=z key=$http_x_k$uri rate=60r/m burst=20 algorithm=gcra name=wide;\n\
                   rl_limit zone=z key=$http_x_k$uri rate=10r/m burst=3 algorithm=gcra name=narrow;";

fn start() -> Nginx {
    let mut body = String::new();
    let mut setup_files = Vec::new();
    for (path, mode, lines) in [
        ("legacy", "legacy", ONE),
        ("d6", "draft-6", ONE),
        ("ld6", "legacy draft-6", ONE),
        ("d6multi", "draft-6", TWO),
        ("draft", "draft", TWO),
        ("both", "both", TWO),
        ("dd6", "draft draft-6", TWO),
    ] {
        body.push_str(&loc(path, mode, lines));
        setup_files.push(format!("html/{path}.html"));
    }
    let mut setup = Nginx::setup(&server("rl_zone z size=1m;", &body));
    for f in &setup_files {
        setup = setup.file(f, "ok\n");
    }
    setup.start()
}

/// An admitted response (a fresh key's first request) and a rejected one
/// (its fourth) of `path`.
fn admitted_and_rejected(ngx: &Nginx, path: &str, key: &str) -> (Response, Response) {
    let h = [("X-K", key)];
    let first = ngx.get(path, &h);
    assert_eq!(first.status, 200, "{first:?}");
    for i in 0..2 {
        assert_eq!(ngx.get(path, &h).status, 200, "request {i} of {path}");
    }
    let rejected = ngx.get(path, &h);
    assert_eq!(rejected.status, 429, "{rejected:?}");
    (first, rejected)
}

/// The parser's limit, remaining and reset (ms since the epoch) equal the
/// module's decision: a reset in delta seconds (`draft-6`) is read as that
/// many seconds from when it was parsed, a Unix time (`legacy`) as itself.
fn assert_parser_reads(read: &Value, r: &Response, unix_reset: Option<u64>) {
    let p = &read["parser"];
    let (limit, remaining, reset) = decided(r);
    assert_eq!((p["limit"].as_u64(), p["remaining"].as_u64()), (Some(limit), Some(remaining)), "{read} for {r:?}");
    let reset_ms = p["reset_ms"].as_u64().unwrap_or_else(|| panic!("no reset in {read} for {r:?}"));
    match unix_reset {
        Some(at) => assert_eq!(reset_ms, at * 1000, "{read} for {r:?}"),
        None => {
            let now_ms = read["now_ms"].as_u64().unwrap();
            assert!(reset_ms.abs_diff(now_ms + reset * 1000) < 1000, "reset {reset} s, read {read} for {r:?}");
        }
    }
}

/// A structured-field list as the readers give it: (name or number, {param: number}).
fn sf(v: &Value) -> Vec<(String, BTreeMap<String, u64>)> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|item| {
            let name = match &item[0] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let params = item[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or_else(|| panic!("{k}={v}"))))
                .collect();
            (name, params)
        })
        .collect()
}

fn params(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn legacy_and_draft6_read_by_ratelimit_header_parser() {
    let dir = match npm_clients() {
        Ok(dir) => dir,
        Err(e) => return skipped("rl_headers legacy / draft-6 with ratelimit-header-parser", &e),
    };
    let ngx = start();

    // legacy: X-RateLimit-*, the reset a Unix time.
    let (ok, rejected) = admitted_and_rejected(&ngx, "/legacy.html", "l");
    assert_eq!((decided(&ok), decided(&rejected)), ((3, 2, 6), (3, 0, 18)));
    for r in [&ok, &rejected] {
        assert!(!r.has_header_prefix("ratelimit"), "{r:?}");
        assert_parser_reads(&node_read(dir, r), r, Some(r.num("X-RateLimit-Reset")));
        assert!(r.num("X-RateLimit-Reset").abs_diff(unix_now() + decided(r).2) <= 2, "{r:?}");
    }

    // draft-6: RateLimit-Limit / -Remaining / -Reset (delta seconds), and its policy.
    let (ok, rejected) = admitted_and_rejected(&ngx, "/d6.html", "d");
    assert_eq!((decided(&ok), decided(&rejected)), ((3, 2, 6), (3, 0, 18)));
    for r in [&ok, &rejected] {
        assert!(!r.has_header_prefix("x-ratelimit") && r.header("RateLimit").is_none(), "{r:?}");
        let read = node_read(dir, r);
        assert_parser_reads(&read, r, None);
        assert_eq!(sf(&read["policy"]), [("3".to_string(), params(&[("w", 18)]))], "{r:?}");
    }
    assert_eq!(rejected.header("Retry-After"), Some("6"), "{rejected:?}");

    // legacy draft-6: both sets; the parser prefers RateLimit-*, and reads X-RateLimit-* alike.
    let (ok, rejected) = admitted_and_rejected(&ngx, "/ld6.html", "ld");
    for r in [&ok, &rejected] {
        assert_parser_reads(&node_read(dir, r), r, None);
        let legacy_only = Response {
            headers: r.headers.iter().filter(|(n, _)| !n.starts_with("ratelimit")).cloned().collect(),
            ..r.clone()
        };
        assert_parser_reads(&node_read(dir, &legacy_only), r, Some(r.num("X-RateLimit-Reset")));
    }

    // Several lines: the single-valued fields describe the line behind $rl_status (narrow), the
    // policy lists every line.
    let (ok, rejected) = admitted_and_rejected(&ngx, "/d6multi.html", "m");
    assert_eq!((decided(&ok), decided(&rejected)), ((3, 2, 6), (3, 0, 18)));
    for r in [&ok, &rejected] {
        let read = node_read(dir, r);
        assert_parser_reads(&read, r, None);
        assert_eq!(
            sf(&read["policy"]),
            [("20".to_string(), params(&[("w", 20)])), ("3".to_string(), params(&[("w", 18)]))],
            "{r:?}"
        );
    }
}

/// The draft 10/11 fields of `r` (the TWO lines), as one reader read them:
/// each line's policy and state.
fn assert_draft_reads(read: &Value, r: &Response, rejected: bool, who: &str) {
    // `t` is the wait for one more unit (draft 11: "the time until additional quota is made
    // available"), one of narrow's every 6 s and of wide's every second; the time until the line
    // is full (18 s for a spent narrow) is the reset the single-valued fields give.
    let (narrow, narrow_reset) = if rejected { ([("r", 0), ("t", 6)], 18) } else { ([("r", 2), ("t", 6)], 6) };
    // wide: charged with the request unless it was rejected; then it reports what it has left
    // (the three narrow admitted took 3).
    let wide = if rejected { [("r", 17), ("t", 1)] } else { [("r", 19), ("t", 1)] };
    assert_eq!(
        sf(&read["policy"]),
        [("wide".to_string(), params(&[("q", 20), ("w", 20)])), ("narrow".to_string(), params(&[("q", 3), ("w", 18)]))],
        "{who}: {r:?}"
    );
    assert_eq!(
        sf(&read["ratelimit"]),
        [("wide".to_string(), params(&wide)), ("narrow".to_string(), params(&narrow))],
        "{who}: {r:?}"
    );
    // The line behind $rl_status is narrow.
    let (limit, remaining, reset) = decided(r);
    assert_eq!((limit, remaining, reset), (3, narrow[0].1, narrow_reset), "{r:?}");
}

#[test]
fn draft_read_by_structured_field_parsers() {
    let npm = npm_clients();
    let py = py_clients();
    if let Err(e) = &npm {
        skipped("rl_headers draft with structured-headers (npm)", e);
    }
    if let Err(e) = &py {
        skipped("rl_headers draft with http-sf (PyPI)", e);
    }
    if npm.is_err() && py.is_err() {
        return;
    }
    let ngx = start();
    for (path, legacy, draft6) in
        [("/draft.html", false, false), ("/both.html", true, false), ("/dd6.html", false, true)]
    {
        let (ok, rejected) = admitted_and_rejected(&ngx, path, "s");
        for (r, was_rejected) in [(&ok, false), (&rejected, true)] {
            // One RateLimit-Policy, draft 10's, whatever else is sent.
            assert_eq!((count(r, "ratelimit-policy"), count(r, "ratelimit")), (1, 1), "{path}: {r:?}");
            assert_eq!(r.has_header_prefix("x-ratelimit"), legacy, "{path}: {r:?}");
            assert_eq!(r.header("RateLimit-Limit").is_some(), draft6, "{path}: {r:?}");
            if let Ok(dir) = &py {
                assert_draft_reads(&py_read(dir, r), r, was_rejected, &format!("http-sf, {path}"));
            }
            if let Ok(dir) = &npm {
                let read = node_read(dir, r);
                assert_draft_reads(&read, r, was_rejected, &format!("structured-headers, {path}"));
                // ratelimit-header-parser reads any RateLimit field as draft 7's dictionary
                // (`limit=, remaining=, reset=`), and nothing else: NaN (null here), Invalid Date.
                let p = &read["parser"];
                assert!(p["limit"].is_null() && p["remaining"].is_null() && p["reset_ms"].is_null(), "{read}");
            }
        }
        if draft6 {
            // draft 6's fields beside them describe narrow, as the variables do.
            for r in [&ok, &rejected] {
                let (limit, remaining, reset) = decided(r);
                assert_eq!(
                    (r.num("RateLimit-Limit"), r.num("RateLimit-Remaining"), r.num("RateLimit-Reset")),
                    (limit, remaining, reset),
                    "{r:?}"
                );
            }
        }
    }
}
