//! The Debian package (`make deb`) as an operator meets it: what it holds,
//! what lintian says of it, and installing it beside Debian's nginx (loaded
//! by the stock `/etc/nginx/nginx.conf` through `modules-enabled`), serving
//! a 429, then purging it and leaving the system as it was.
//!
//! Environment: `RL_DEB`, the `.deb` (`make test-package` builds it and sets
//! it). Installing needs root; no service is started, stopped or reloaded:
//! a `policy-rc.d` that denies is in place while the package is installed,
//! and nginx runs from a copy of the configuration, on its own prefix, pid
//! file and loopback port.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const PKG: &str = "libnginx-mod-http-rl";
const SO: &str = "/usr/lib/nginx/modules/ngx_http_rl_module.so";
const AVAILABLE: &str = "/usr/share/nginx/modules-available/mod-http-rl.conf";
const ENABLED: &str = "/etc/nginx/modules-enabled/50-mod-http-rl.conf";
const POLICY: &str = "/usr/sbin/policy-rc.d";
/// What nginx's packaged service would touch, were it started or reloaded.
const SERVICE_PID: &str = "/run/nginx.pid";

fn deb() -> PathBuf {
    let p = PathBuf::from(std::env::var_os("RL_DEB").expect("RL_DEB is not set: run `make test-package`"));
    assert!(p.is_file(), "{} not found: run `make deb`", p.display());
    p
}

fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd).args(args).stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"))
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `dpkg` with `args`, waiting (two minutes at most) while another dpkg or
/// apt run holds the lock: other tests and engineers share the machine.
fn dpkg(args: &[&str]) -> Output {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = run("dpkg", args);
        let locked = !out.status.success() && text(&out).contains("lock");
        if !locked || Instant::now() > deadline {
            return out;
        }
        thread::sleep(Duration::from_secs(2));
    }
}

/// The package's status as dpkg records it ("" when dpkg knows nothing of it).
fn status() -> String {
    String::from_utf8_lossy(&run("dpkg-query", &["-W", "-f=${Status}", PKG]).stdout).into_owned()
}

/// The nginx ABI Debian's nginx-dev declares, which the package must depend on.
fn nginx_abi() -> String {
    let vars = fs::read_to_string("/usr/share/nginx/src/debian/libnginx-mod.abisubstvars")
        .expect("nginx-dev's libnginx-mod.abisubstvars");
    vars.lines().find_map(|l| l.strip_prefix("nginx:abi=")).expect("no nginx:abi in abisubstvars").trim().to_string()
}

#[test]
fn package_holds_the_stripped_module_its_load_file_and_docs() {
    let deb = deb();
    let deb_s = deb.to_str().unwrap();
    let field = |name: &str| text(&run("dpkg-deb", &["--field", deb_s, name])).trim().to_string();
    assert_eq!(field("Package"), PKG);
    let version = field("Version");
    assert_eq!(version.rsplit_once('-').map(|(up, _)| up), Some(env!("CARGO_PKG_VERSION")), "Version {version}");
    assert_eq!(field("Section"), "httpd");
    let depends = field("Depends");
    let deps: Vec<&str> = depends.split(',').map(str::trim).collect();
    assert!(deps.contains(&nginx_abi().as_str()), "Depends lacks {}: {depends}", nginx_abi());
    assert!(deps.iter().any(|d| d.starts_with("libc6")), "Depends lacks libc6: {depends}");
    let info = text(&run("dpkg-deb", &["--info", deb_s]));
    for script in ["postinst", "prerm", "postrm"] {
        assert!(info.contains(script), "no {script} in:\n{info}");
    }

    let contents = text(&run("dpkg-deb", &["--contents", deb_s]));
    let entry = |path: &str| contents.lines().find(|l| l.ends_with(&format!(".{path}"))).map(str::to_string);
    let so = entry(SO).unwrap_or_else(|| panic!("no {SO} in:\n{contents}"));
    assert!(so.starts_with("-rw-r--r-- root/root"), "module's mode or owner: {so}");
    // dh_compress leaves files under 4 kB as they are: no .gz expected on those.
    for doc in ["copyright", "changelog.Debian.gz", "README.Debian", "README.md.gz", "crates.txt"] {
        let doc = format!("/usr/share/doc/{PKG}/{doc}");
        assert!(contents.lines().any(|l| l.contains(&format!(".{doc}"))), "no {doc} in:\n{contents}");
    }
    // The link into modules-enabled is the postinst's, as for Debian's own modules.
    assert!(entry(AVAILABLE).is_some(), "no {AVAILABLE} in:\n{contents}");
    assert!(!contents.contains("/etc/nginx"), "files under /etc/nginx:\n{contents}");

    let dir = std::env::temp_dir().join(format!("nginx-rl-deb-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let x = run("dpkg-deb", &["-x", deb_s, dir.to_str().unwrap()]);
    assert!(x.status.success(), "dpkg-deb -x: {}", text(&x));
    let load = fs::read_to_string(dir.join(&AVAILABLE[1..])).unwrap();
    assert_eq!(load, "load_module modules/ngx_http_rl_module.so;\n");
    let sections = text(&run("readelf", &["-S", "-W", dir.join(&SO[1..]).to_str().unwrap()]));
    assert!(sections.contains(".dynsym"), "readelf -S:\n{sections}");
    for unstripped in [".symtab", ".debug_info", ".debug_line"] {
        assert!(!sections.contains(unstripped), "{unstripped} left in the module:\n{sections}");
    }
    eprintln!(
        "{}: {} bytes; the module {} bytes",
        deb.display(),
        fs::metadata(&deb).unwrap().len(),
        fs::metadata(dir.join(&SO[1..])).unwrap().len()
    );
    let _ = fs::remove_dir_all(&dir);

    if run("sh", &["-c", "command -v lintian"]).status.success() {
        // Lintian refuses to run as root without --allow-root.
        let lint = run("lintian", &["--allow-root", "--fail-on", "error", "--tag-display-limit", "0", deb_s]);
        let out = text(&lint);
        eprintln!("lintian:\n{out}");
        assert!(lint.status.success(), "lintian reports errors:\n{out}");
        assert!(!out.lines().any(|l| l.starts_with("E: ")), "lintian reports errors:\n{out}");
    } else {
        eprintln!("lintian is not installed (make deps-deb installs it): not run");
    }
}

/// What a directory tree holds, by relative path: kind, mode, owner,
/// content or link target. Comparing two says whether anything changed.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(m) = fs::symlink_metadata(&p) else { continue };
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let what = if m.file_type().is_symlink() {
                format!("link {}", fs::read_link(&p).map(|t| t.display().to_string()).unwrap_or_default())
            } else if m.is_dir() {
                stack.push(p.clone());
                "dir".to_string()
            } else {
                format!("file {:?}", fs::read(&p).unwrap_or_default())
            };
            out.insert(rel, format!("{:o} {}:{} {what}", m.mode(), m.uid(), m.gid()));
        }
    }
    out
}

/// Asserts that `root` holds what `before` recorded, naming what differs.
fn same_tree(root: &str, before: &BTreeMap<PathBuf, String>) {
    let after = snapshot(Path::new(root));
    let changed: Vec<_> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| k.display().to_string())
        .collect();
    assert!(changed.is_empty(), "{root} differs after the purge: {changed:?}");
}

/// A file's content and mode, or None where there is none.
fn file_state(p: &str) -> Option<(Vec<u8>, u32)> {
    let m = fs::symlink_metadata(p).ok()?;
    Some((fs::read(p).unwrap_or_default(), m.mode()))
}

/// Puts the policy-rc.d that was there back (or none), and purges the
/// package if a failed test left it installed.
struct Restore {
    policy: Option<(Vec<u8>, u32)>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        if !matches!(status().as_str(), "" | "unknown ok not-installed") {
            let out = dpkg(&["--purge", PKG]);
            eprintln!("purged {PKG} after a failure: {}", text(&out));
        }
        match &self.policy {
            Some((content, mode)) => {
                let _ = fs::write(POLICY, content);
                let _ = fs::set_permissions(POLICY, fs::Permissions::from_mode(*mode));
            }
            None => {
                let _ = fs::remove_file(POLICY);
            }
        }
    }
}

/// `text` with `from` replaced by `to`, which must occur exactly once: if
/// Debian's nginx.conf changes, the copy fails here, not silently.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} in /etc/nginx/nginx.conf:\n{text}");
    text.replace(from, to)
}

#[test]
fn package_installs_loads_through_modules_enabled_and_purges() {
    let deb = deb();
    let st = status();
    if !matches!(st.as_str(), "" | "unknown ok not-installed") {
        eprintln!("skipped: {PKG} is already installed here ({st}); this test installs and purges it");
        return;
    }
    if Path::new(SO).exists() {
        let owner = text(&run("dpkg", &["-S", SO]));
        eprintln!("skipped: {SO} is already there, not from this package ({}); `make install`'s copy?", owner.trim());
        return;
    }
    let euid = String::from_utf8_lossy(&run("id", &["-u"]).stdout).trim().to_string();
    assert_eq!(euid, "0", "installing the package needs root");

    let etc = snapshot(Path::new("/etc/nginx"));
    let modules = snapshot(Path::new("/usr/lib/nginx/modules"));
    let available = snapshot(Path::new("/usr/share/nginx/modules-available"));
    let service_pid = file_state(SERVICE_PID);
    let nginx_status =
        String::from_utf8_lossy(&run("dpkg-query", &["-W", "-f=${Status}", "nginx"]).stdout).into_owned();
    let guard = Restore { policy: file_state(POLICY) };
    fs::write(POLICY, "#!/bin/sh\n# nginx-rl's package test: no service starts, stops or reloads\nexit 101\n").unwrap();
    fs::set_permissions(POLICY, fs::Permissions::from_mode(0o755)).unwrap();

    let out = dpkg(&["--install", deb.to_str().unwrap()]);
    assert!(out.status.success(), "dpkg --install:\n{}", text(&out));
    assert_eq!(status(), "install ok installed");
    // The nginx-reload trigger ran (nginx is not left "triggers-pending") and
    // the service was left alone.
    let now = String::from_utf8_lossy(&run("dpkg-query", &["-W", "-f=${Status}", "nginx"]).stdout).into_owned();
    assert_eq!(now, nginx_status, "nginx's package status after installing");
    assert_eq!(file_state(SERVICE_PID), service_pid, "{SERVICE_PID} changed: the service was started or reloaded");
    assert_eq!(fs::read_link(ENABLED).ok(), Some(PathBuf::from(AVAILABLE)), "{ENABLED}");
    assert!(text(&run("dpkg", &["-S", SO])).starts_with(&format!("{PKG}:")));

    // Debian's nginx.conf as it is: the module loads through modules-enabled.
    // nginx -t opens (creating if missing) the service's pid file and logs:
    // what it creates is removed again.
    let touched = [SERVICE_PID, "/var/log/nginx/error.log", "/var/log/nginx/access.log"];
    let existed: Vec<bool> = touched.iter().map(|p| Path::new(p).exists()).collect();
    let t = run("/usr/sbin/nginx", &["-t"]);
    for (p, existed) in touched.iter().zip(existed) {
        if !existed && fs::metadata(p).is_ok_and(|m| m.len() == 0) {
            let _ = fs::remove_file(p);
        }
    }
    let t_out = text(&t);
    assert!(t.status.success() && t_out.contains("test is successful"), "nginx -t:\n{t_out}");
    assert!(!t_out.contains("[emerg]") && !t_out.contains("[warn]"), "nginx -t:\n{t_out}");

    serve_429_from_a_copy_of_the_configuration();

    let out = dpkg(&["--purge", PKG]);
    assert!(out.status.success(), "dpkg --purge:\n{}", text(&out));
    assert!(matches!(status().as_str(), "" | "unknown ok not-installed"), "after purge: {}", status());
    drop(guard);
    same_tree("/etc/nginx", &etc);
    same_tree("/usr/lib/nginx/modules", &modules);
    same_tree("/usr/share/nginx/modules-available", &available);
    assert_eq!(file_state(SERVICE_PID), service_pid, "{SERVICE_PID} changed");
}

/// Debian's nginx.conf, copied into a temporary directory with its own pid
/// file, logs and loopback server (in place of sites-enabled), keeps
/// including `/etc/nginx/modules-enabled/*.conf`: the zone and the limit
/// are declared as README.Debian says, and the package's module answers.
fn serve_429_from_a_copy_of_the_configuration() {
    let prefix = std::env::temp_dir().join(format!("nginx-rl-deb-run-{}", std::process::id()));
    let _ = fs::remove_dir_all(&prefix);
    for d in ["html", "conf.d"] {
        fs::create_dir_all(prefix.join(d)).unwrap();
    }
    // The workers run as www-data: they read the site's files.
    for d in ["", "html", "conf.d"] {
        fs::set_permissions(prefix.join(d), fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::write(prefix.join("html/index.html"), "index\n").unwrap();
    fs::set_permissions(prefix.join("html/index.html"), fs::Permissions::from_mode(0o644)).unwrap();
    let p = prefix.display();
    let port = free_port();
    fs::write(prefix.join("conf.d/rl.conf"), "rl_zone pkg size=1m;\n").unwrap();
    fs::write(
        prefix.join("site.conf"),
        format!(
            "server {{\n listen 127.0.0.1:{port};\n root {p}/html;\n \
             location / {{ rl_limit zone=pkg rate=2r/h burst=2; }}\n}}\n"
        ),
    )
    .unwrap();
    let stock = fs::read_to_string("/etc/nginx/nginx.conf").unwrap();
    let mut conf = replace_once(&stock, "pid /run/nginx.pid;", &format!("pid {p}/nginx.pid;"));
    conf = replace_once(&conf, "error_log /var/log/nginx/error.log;", &format!("error_log {p}/error.log info;"));
    conf = replace_once(&conf, "access_log /var/log/nginx/access.log;", &format!("access_log {p}/access.log;"));
    conf = replace_once(&conf, "include /etc/nginx/conf.d/*.conf;", &format!("include {p}/conf.d/*.conf;"));
    conf = replace_once(&conf, "include /etc/nginx/sites-enabled/*;", &format!("include {p}/site.conf;"));
    assert!(conf.contains("include /etc/nginx/modules-enabled/*.conf;"), "{conf}");
    fs::write(prefix.join("nginx.conf"), &conf).unwrap();

    // Debian's prefix (/usr/share/nginx, whose modules/ links to
    // /usr/lib/nginx/modules): the load files name modules/*.so relative to it.
    let args = ["-c", &format!("{p}/nginx.conf"), "-e", &format!("{p}/error.log")];
    let t = run("/usr/sbin/nginx", &[&args[..], &["-t"]].concat());
    assert!(t.status.success(), "nginx -t on the copy:\n{}", text(&t));
    let start = run("/usr/sbin/nginx", &args);
    assert!(start.status.success(), "nginx on the copy:\n{}", text(&start));
    let master = wait_master(&prefix);
    let result = std::panic::catch_unwind(|| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            assert!(Instant::now() < deadline, "nginx is not listening on {port}");
            thread::sleep(Duration::from_millis(20));
        }
        let rs: Vec<Response> = (0..3).map(|_| get(port, "/index.html", &[])).collect();
        let got: Vec<u16> = rs.iter().map(|r| r.status).collect();
        assert_eq!(got, [200, 200, 429], "{rs:?}");
        assert_eq!(rs[2].header("X-RateLimit-Limit"), Some("2"), "{:?}", rs[2]);
        assert!(rs[2].header("Retry-After").is_some(), "{:?}", rs[2]);
        let log = fs::read_to_string(prefix.join("error.log")).unwrap_or_default();
        let version = format!(": nginx-rl/{}", env!("CARGO_PKG_VERSION"));
        assert!(log.lines().any(|l| l.contains("[notice]") && l.ends_with(&version)), "no version line:\n{log}");
        assert!(log.contains("limiting requests, excess: 2.000 by zone \"pkg\""), "{log}");
    });
    let _ = run("kill", &["-TERM", &master.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(master) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    if let Err(e) = result {
        eprintln!("prefix kept: {p}");
        std::panic::resume_unwind(e);
    }
    let _ = fs::remove_dir_all(&prefix);
}

/// Whether `pid` runs (a zombie does not).
fn running(pid: u32) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    state.is_some_and(|s| s != 'Z' && s != 'X')
}

fn wait_master(prefix: &Path) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = fs::read_to_string(prefix.join("nginx.pid")).ok().and_then(|s| s.trim().parse().ok()) {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid file in {}", prefix.display());
        thread::sleep(Duration::from_millis(20));
    }
}
