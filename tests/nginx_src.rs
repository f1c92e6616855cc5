//! `make build NGINX_SRC=...`: the module built against an nginx source
//! tree configured with `--with-compat` alone loads into an nginx of the
//! same version configured as nginx.org's packages are, and nginx refuses
//! a module built for another version, with its own message.
//!
//! Environment (`make test-build-src` sets it): `RL_NGINX`, the nginx.org-like
//! binary; `RL_MODULE`, the module built for it; `RL_OTHER_NGINX` and
//! `RL_OTHER_MODULE`, Debian's nginx and the module built for it.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;

fn env_path(name: &str) -> PathBuf {
    let p =
        PathBuf::from(std::env::var_os(name).unwrap_or_else(|| panic!("{name} is not set: run `make test-build-src`")));
    assert!(p.is_file(), "{name}: {} not found", p.display());
    p
}

fn output(bin: &Path, args: &[&str]) -> (Output, String) {
    let out = Command::new(bin).args(args).stdin(Stdio::null()).output().expect("cannot run nginx");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, text)
}

/// `nginx_version` as nginx compares it with a module's: 1.28.3 is 1028003.
fn version_number(bin: &Path) -> u64 {
    let (_, v) = output(bin, &["-v"]);
    let ver = v.trim().rsplit('/').next().unwrap_or_default();
    let parts: Vec<u64> = ver.split('.').filter_map(|p| p.parse().ok()).collect();
    assert_eq!(parts.len(), 3, "nginx -v: {v}");
    parts[0] * 1_000_000 + parts[1] * 1_000 + parts[2]
}

#[test]
fn with_compat_module_loads_into_an_nginx_org_like_build() {
    let (_, v) = output(&nginx_bin(), &["-V"]);
    for arg in ["--with-compat", "--with-http_v3_module", "--with-stream", "--with-mail"] {
        assert!(v.contains(arg), "{arg} not in nginx -V:\n{v}");
    }
    let (ok, out) = nginx_t(&server("rl_zone z size=1m;", "location / { rl_limit zone=z rate=2r/h burst=2; }"));
    assert!(ok, "nginx -t:\n{out}");
    let ngx = Nginx::start(&server("rl_zone z size=1m;", "location / { rl_limit zone=z rate=2r/h burst=2; }"));
    let got: Vec<u16> = (0..3).map(|_| ngx.get("/index.html", &[]).status).collect();
    assert_eq!(got, [200, 200, 429]);
    let r = ngx.get("/index.html", &[]);
    assert_eq!((r.status, r.header("X-RateLimit-Remaining")), (429, Some("0")), "{r:?}");
    let log = ngx.error_log();
    let line = format!(": nginx-rl/{}", env!("CARGO_PKG_VERSION"));
    assert!(log.lines().any(|l| l.ends_with(&line)), "no version line:\n{log}");
    assert!(crash_lines(&log).is_empty(), "{log}");
}

/// `nginx -t` of `bin` loading `module`, built for nginx `module_version`:
/// refused with nginx's message, which is returned.
fn refused(bin: &Path, module: &Path, module_version: u64) -> String {
    let dir = std::env::temp_dir().join(format!("nginx-rl-src-{}-{}", std::process::id(), version_number(bin)));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("nginx.conf");
    fs::write(&conf, format!("load_module {};\npid {}/nginx.pid;\nevents {{}}\n", module.display(), dir.display()))
        .unwrap();
    let (out, text) = output(
        bin,
        &[
            "-t",
            "-p",
            &format!("{}/", dir.display()),
            "-c",
            conf.to_str().unwrap(),
            "-e",
            dir.join("error.log").to_str().unwrap(),
        ],
    );
    assert!(!out.status.success(), "nginx -t accepted {}:\n{text}", module.display());
    let expected = format!(
        "[emerg] module \"{}\" version {} instead of {} in {}:1",
        module.display(),
        module_version,
        version_number(bin),
        conf.display()
    );
    assert!(text.contains(&expected), "expected {expected:?} in:\n{text}");
    let _ = fs::remove_dir_all(&dir);
    text
}

#[test]
fn module_of_another_nginx_version_is_refused() {
    let (ours, other) = (version_number(&nginx_bin()), version_number(&env_path("RL_OTHER_NGINX")));
    assert_ne!(ours, other);
    // Debian's 1.22 build into the 1.28 binary, and the 1.28 build into Debian's nginx.
    eprintln!("{}", refused(&nginx_bin(), &env_path("RL_OTHER_MODULE"), other));
    eprintln!("{}", refused(&env_path("RL_OTHER_NGINX"), &module_path(), ours));
}
