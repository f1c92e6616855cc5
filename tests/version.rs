//! The module says which build is running: one `notice` line with its
//! version when nginx starts, as nginx logs its own (`nginx/1.22.1`), and
//! none for a reload, `nginx -s` or `nginx -t`.

mod common;

use std::process::{Command, Stdio};

use common::*;

/// The error-log lines that carry the module's version.
fn version_lines(log: &str) -> Vec<&str> {
    let tail = format!(": nginx-rl/{}", env!("CARGO_PKG_VERSION"));
    log.lines().filter(|l| l.ends_with(&tail)).collect()
}

#[test]
fn version_logged_once_at_start() {
    let mut ngx = Nginx::start(&server("rl_zone z size=1m;", "location / { rl_limit zone=z rate=1r/m; }"));
    let start = ngx.error_log();
    let lines = version_lines(&start);
    assert_eq!(lines.len(), 1, "version lines at start:\n{start}");
    assert!(lines[0].contains(" [notice] "), "not a notice: {}", lines[0]);

    // `nginx -s reload` (a signaller process) and the master's new cycle.
    ngx.reload();
    // `nginx -t` on the running configuration, logging to the same file.
    let out = Command::new(nginx_bin())
        .arg("-t")
        .arg("-p")
        .arg(format!("{}/", ngx.prefix.display()))
        .arg("-c")
        .arg(ngx.prefix.join("nginx.conf"))
        .arg("-e")
        .arg(ngx.prefix.join("error.log"))
        .stdin(Stdio::null())
        .output()
        .expect("cannot run nginx -t");
    assert!(out.status.success(), "nginx -t failed: {}", String::from_utf8_lossy(&out.stderr));
    let log = ngx.error_log();
    assert_eq!(version_lines(&log).len(), 1, "version lines after a reload and nginx -t:\n{log}");
    assert_eq!(ngx.get("/index.html", &[]).status, 200);
}
