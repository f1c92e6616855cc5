//! Integration-test harness: starts a real nginx with the built module in a
//! throw-away prefix, and talks HTTP/1.1 to it over plain TCP.
//!
//! Environment:
//! - `RL_NGINX`: the nginx binary (default `/usr/sbin/nginx`);
//! - `RL_MODULE`: the built `ngx_http_rl_module.so` (default
//!   `<repo>/build/debian/ngx_http_rl_module.so`).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Worker processes of every test server (the reload wait depends on it).
pub const WORKERS: usize = 2;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Debian's Python (`/usr/bin/python3`, with Debian's Python packages:
/// `python3` may be another build) running `script` on `input`: what it
/// printed, or its standard error when it fails.
pub fn python(script: &str, input: &str) -> Result<String, String> {
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run /usr/bin/python3: {e}"))?;
    let fed = child.stdin.take().map(|mut stdin| stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().map_err(|e| format!("/usr/bin/python3: {e}"))?;
    match (out.status.success(), fed) {
        (true, Some(Ok(()))) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        _ => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// `promtool check metrics` on a scrape: accepted without a word (skipped,
/// said so, where Debian's `prometheus` package is not installed).
pub fn promtool_check_metrics(text: &str) {
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("promtool is not installed (Debian package prometheus): the text is not linted");
        return;
    };
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics:\n{said}\n{text}");
}

pub fn nginx_bin() -> PathBuf {
    std::env::var_os("RL_NGINX").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/sbin/nginx"))
}

pub fn module_path() -> PathBuf {
    let p = std::env::var_os("RL_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("build/debian/ngx_http_rl_module.so"));
    assert!(p.is_file(), "module {} not found: run `make build-debian` or set RL_MODULE", p.display());
    fs::canonicalize(&p).unwrap_or(p)
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// Waits, if need be, until the `fixed` window of `window_s` seconds that
/// the clock is in has `need_s` seconds left, so that a test's requests all
/// fall in one window: the module aligns fixed windows to the Unix epoch,
/// and nginx's clock is this one (no fake clock reaches a running nginx).
/// Waits at most `need_s` seconds, and only when the end is that near.
pub fn clear_of_window_end(window_s: u64, need_s: u64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let window = Duration::from_secs(window_s);
    let into = Duration::from_nanos((now.as_nanos() % window.as_nanos()) as u64);
    let left = window - into;
    if left < Duration::from_secs(need_s) {
        thread::sleep(left + Duration::from_millis(50));
    }
}

/// Files every prefix gets (relative to the prefix), on top of the test's own.
const DEFAULT_FILES: &[(&str, &str)] = &[
    ("html/index.html", "index\n"),
    ("html/a.html", "page a\n"),
    ("html/b.html", "page b\n"),
    ("html/dir/index.html", "dir index\n"),
    ("html/limited.html", "custom limited page\n"),
    ("html/404.html", "custom not found page\n"),
];

/// The first port of the kernel's ephemeral range (`ip_local_port_range`).
pub fn ephemeral_low() -> u16 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// A loopback port nobody listens on now, for a test server to listen on.
/// Taken below the kernel's ephemeral range: a port probed there (bind to
/// port 0) can be taken by any outgoing connection (nginx's to Redis, a
/// proxy's) before the server binds it, and nginx then logs `[emerg] bind()`
/// while it retries. Each test process walks the range from its own place
/// (from its pid), so concurrent test binaries seldom meet; the probe skips
/// what is taken.
pub fn free_port() -> u16 {
    const FIRST: u16 = 10_000;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let span = usize::from(ephemeral_low().max(FIRST + 1_000) - FIRST);
    let start = std::process::id() as usize * 7_919;
    loop {
        let port = FIRST + ((start + NEXT.fetch_add(1, Ordering::SeqCst)) % span) as u16;
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
}

fn make_prefix() -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("nginx-rl-it-{}-{}", std::process::id(), n));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("tmp")).unwrap();
    set_mode(&dir, 0o755);
    set_mode(&dir.join("tmp"), 0o755);
    dir
}

fn set_mode(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// Writes `rel` under `prefix`, world-readable, creating its directories 0755.
fn write_file(prefix: &Path, rel: &str, content: &str) {
    let path = prefix.join(rel);
    let mut dir = path.parent().unwrap().to_path_buf();
    fs::create_dir_all(&dir).unwrap();
    while dir.starts_with(prefix) && dir != prefix {
        set_mode(&dir, 0o755);
        dir = dir.parent().unwrap().to_path_buf();
    }
    fs::write(&path, content).unwrap();
    set_mode(&path, 0o644);
}

/// The whole nginx.conf around the test's `http {}` content.
fn render_conf(prefix: &Path, port: u16, http_block: &str) -> String {
    let p = prefix.display();
    let block = http_block.replace("{PORT}", &port.to_string()).replace("{ROOT}", &format!("{p}/html"));
    format!(
        "load_module {module};\n\
         worker_processes {WORKERS};\n\
         worker_rlimit_nofile 16384;\n\
         error_log {p}/error.log info;\n\
         pid {p}/nginx.pid;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         access_log off;\n\
         default_type text/html;\n\
         client_body_temp_path {p}/tmp/body;\n\
         proxy_temp_path {p}/tmp/proxy;\n\
         fastcgi_temp_path {p}/tmp/fastcgi;\n\
         uwsgi_temp_path {p}/tmp/uwsgi;\n\
         scgi_temp_path {p}/tmp/scgi;\n\
         {block}\n\
         }}\n",
        module = module_path().display(),
    )
}

/// Runs `nginx -t` on a configuration with `http_block` inside `http {}`.
/// Returns whether nginx accepted it, and its output (stdout + stderr).
pub fn nginx_t(http_block: &str) -> (bool, String) {
    let run = nginx_t_run(http_block, Duration::from_secs(60));
    assert!(!run.timed_out, "nginx -t did not finish in 60 s:\n{}", run.output);
    (run.ok, run.output)
}

/// What one `nginx -t` did.
#[derive(Debug)]
pub struct ConfTest {
    /// It exited with status 0.
    pub ok: bool,
    /// The signal that ended it, if one did (a crash).
    pub signal: Option<i32>,
    /// It ran longer than the time allowed and was killed.
    pub timed_out: bool,
    /// Its stdout and stderr.
    pub output: String,
}

/// Runs `nginx -t` as [`nginx_t`] does, killing it after `limit`.
pub fn nginx_t_run(http_block: &str, limit: Duration) -> ConfTest {
    use std::os::unix::process::ExitStatusExt;
    let prefix = make_prefix();
    let conf = prefix.join("nginx.conf");
    fs::write(&conf, render_conf(&prefix, free_port(), http_block)).unwrap();
    fs::create_dir_all(prefix.join("html")).unwrap();
    // Output to files: a pipe nobody reads while we wait could block nginx.
    let (out_path, err_path) = (prefix.join("t.out"), prefix.join("t.err"));
    let mut child = Command::new(nginx_bin())
        .arg("-t")
        .arg("-p")
        .arg(format!("{}/", prefix.display()))
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(prefix.join("error.log"))
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("cannot run nginx -t");
    let deadline = Instant::now() + limit;
    let (status, timed_out) = loop {
        if let Some(status) = child.try_wait().expect("cannot wait for nginx -t") {
            break (Some(status), false);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        thread::sleep(Duration::from_millis(2));
    };
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&fs::read(&out_path).unwrap_or_default()),
        String::from_utf8_lossy(&fs::read(&err_path).unwrap_or_default())
    );
    let _ = fs::remove_dir_all(&prefix);
    ConfTest { ok: status.is_some_and(|s| s.success()), signal: status.and_then(|s| s.signal()), timed_out, output }
}

/// The line number, in the nginx.conf that [`nginx_t`] and [`Nginx`] write,
/// of the first line of `http_block` that contains `needle`.
pub fn conf_line_of(http_block: &str, needle: &str) -> Option<usize> {
    let conf = render_conf(Path::new("/prefix"), 1, http_block);
    conf.lines().position(|l| l.contains(needle)).map(|i| i + 1)
}

/// Builds a prefix with extra files before starting nginx.
pub struct Setup {
    http_block: String,
    files: Vec<(String, String)>,
}

impl Setup {
    /// Adds (or replaces) a file, path relative to the prefix (e.g. `html/x/y.html`).
    pub fn file(mut self, rel: &str, content: &str) -> Setup {
        self.files.push((rel.to_string(), content.to_string()));
        self
    }

    pub fn start(self) -> Nginx {
        Nginx::start_with(&self.http_block, &self.files)
    }
}

/// A running nginx (master + workers) in its own prefix; stopped on drop.
pub struct Nginx {
    pub port: u16,
    pub prefix: PathBuf,
    http_block: String,
    master: Option<u32>,
}

impl Nginx {
    pub fn setup(http_block: &str) -> Setup {
        Setup { http_block: http_block.to_string(), files: Vec::new() }
    }

    /// Starts nginx with `http_block` inside `http {}` and the default files.
    pub fn start(http_block: &str) -> Nginx {
        Nginx::start_with(http_block, &[])
    }

    fn start_with(http_block: &str, files: &[(String, String)]) -> Nginx {
        let prefix = make_prefix();
        for (rel, content) in DEFAULT_FILES {
            write_file(&prefix, rel, content);
        }
        for (rel, content) in files {
            write_file(&prefix, rel, content);
        }
        let mut last_err = String::new();
        // The free port may be taken between probing and nginx's bind: retry.
        for _ in 0..5 {
            let port = free_port();
            let mut ngx = Nginx { port, prefix: prefix.clone(), http_block: http_block.to_string(), master: None };
            ngx.write_conf(http_block);
            let startup = prefix.join("startup.log");
            let status = Command::new(nginx_bin())
                .args(ngx.base_args())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(&startup).unwrap())
                .status()
                .expect("cannot run nginx");
            if !status.success() {
                last_err = format!(
                    "{}{}",
                    fs::read_to_string(&startup).unwrap_or_default(),
                    fs::read_to_string(prefix.join("error.log")).unwrap_or_default()
                );
                if last_err.contains("Address already in use") {
                    continue;
                }
                break;
            }
            ngx.master = Some(ngx.wait_pid());
            ngx.wait_listening();
            ngx.wait_workers();
            return ngx;
        }
        panic!("nginx did not start (prefix {}):\n{}", prefix.display(), last_err);
    }

    fn conf_path(&self) -> PathBuf {
        self.prefix.join("nginx.conf")
    }

    fn write_conf(&self, http_block: &str) {
        fs::write(self.conf_path(), render_conf(&self.prefix, self.port, http_block)).unwrap();
        set_mode(&self.conf_path(), 0o644);
    }

    fn base_args(&self) -> Vec<String> {
        vec![
            "-p".into(),
            format!("{}/", self.prefix.display()),
            "-c".into(),
            self.conf_path().display().to_string(),
            "-e".into(),
            self.prefix.join("error.log").display().to_string(),
        ]
    }

    fn wait_pid(&self) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(s) = fs::read_to_string(self.prefix.join("nginx.pid")) {
                if let Ok(pid) = s.trim().parse() {
                    return pid;
                }
            }
            assert!(Instant::now() < deadline, "no pid file in {}:\n{}", self.prefix.display(), self.error_log());
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits (5 s at most, without failing: a test may start workers that
    /// exit) until the master has its [`WORKERS`] workers: the socket
    /// listens before the master has forked them all, and a test that
    /// notes the workers then would miss one (tests/conn.rs
    /// a_draining_workers_slots_come_back_with_the_next_worker took an old
    /// worker forked late for a new one, and killed it).
    fn wait_workers(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.worker_pids().len() < WORKERS && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "nginx not listening on {}:\n{}", self.port, self.error_log());
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The error log so far.
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.prefix.join("error.log")).unwrap_or_default()
    }

    /// The error log from byte `offset` on (read from there: under load the
    /// log grows fast, and reading it whole on every poll would not scale).
    pub fn error_log_since(&self, offset: usize) -> String {
        use std::io::Seek;
        let mut out = Vec::new();
        if let Ok(mut f) = fs::File::open(self.prefix.join("error.log")) {
            if f.seek(io::SeekFrom::Start(offset as u64)).is_ok() {
                let _ = f.read_to_end(&mut out);
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `nginx -s reload` with the same configuration.
    pub fn reload(&mut self) {
        let block = self.http_block.clone();
        self.reload_with(&block);
    }

    /// Rewrites the configuration with `http_block`, reloads, and waits
    /// until the old workers have exited (so only new workers serve).
    pub fn reload_with(&mut self, http_block: &str) {
        let before = self.send_reload(http_block);
        self.http_block = http_block.to_string();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let new = self.error_log_since(before);
            let new = new.as_str();
            assert!(!new.contains("[emerg]"), "reload refused the configuration:\n{new}");
            let exited = new.lines().filter(|l| l.contains("worker process") && l.contains("exited")).count();
            let started = new.lines().filter(|l| l.contains("start worker process")).count();
            if new.contains("reconfiguring") && started >= WORKERS && exited >= WORKERS {
                break;
            }
            assert!(Instant::now() < deadline, "reload did not finish; error log since reload:\n{new}");
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `nginx -s reload` with the same configuration and returns at
    /// once, the old workers perhaps still draining; returns the error log's
    /// length before, where what the reload logs starts.
    pub fn reload_now(&self) -> usize {
        self.send_reload(&self.http_block)
    }

    /// Rewrites the nginx.conf running through `edit` (the harness writes
    /// `http {}`'s content: this reaches the rest, `events {}` or the main
    /// context) and reloads by `SIGHUP`, as `nginx -s reload` does; returns
    /// once only workers started with it are left (10 s at most), and the
    /// error log's length before. A later reload that writes the
    /// configuration afresh ([`Nginx::reload_now`]) drops the edit.
    pub fn reload_edited(&self, edit: impl FnOnce(&str) -> String) -> usize {
        let path = self.prefix.join("nginx.conf");
        let conf = fs::read_to_string(&path).unwrap();
        fs::write(&path, edit(&conf)).unwrap();
        let from = self.error_log().len();
        let old = self.worker_pids();
        let master = fs::read_to_string(self.prefix.join("nginx.pid")).unwrap();
        Command::new("kill").args(["-HUP", master.trim()]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.worker_pids();
            if now.len() == WORKERS && now.iter().all(|p| !old.contains(p)) {
                break;
            }
            assert!(Instant::now() < deadline, "reload: {old:?} -> {now:?}\n{}", self.error_log_since(from));
            thread::sleep(Duration::from_millis(20));
        }
        assert!(!self.error_log_since(from).contains("[emerg]"), "{}", self.error_log_since(from));
        from
    }

    /// Sends `nginx -s reload` with the same configuration and returns once
    /// the new workers have started (10 s at most), the old ones perhaps
    /// still draining.
    pub fn reload_started(&self) {
        let from = self.reload_now();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.error_log_since(from).matches("start worker process").count() < WORKERS {
            assert!(Instant::now() < deadline, "no new workers:\n{}", self.error_log_since(from));
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Writes the configuration and sends `nginx -s reload`; returns the
    /// error log's length before, where what the reload logs starts.
    fn send_reload(&self, http_block: &str) -> usize {
        let before = fs::metadata(self.prefix.join("error.log")).map_or(0, |m| m.len() as usize);
        self.write_conf(http_block);
        let out = Command::new(nginx_bin())
            .args(self.base_args())
            .args(["-s", "reload"])
            .stdin(Stdio::null())
            .output()
            .expect("cannot run nginx -s reload");
        assert!(
            out.status.success(),
            "nginx -s reload failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        before
    }

    /// Rewrites the configuration with `http_block` and reloads, expecting
    /// the master to refuse it: waits for the `[emerg]`, puts the running
    /// configuration's file back, and returns what the reload logged.
    pub fn reload_refused(&mut self, http_block: &str) -> String {
        let before = self.send_reload(http_block);
        let deadline = Instant::now() + Duration::from_secs(15);
        let new = loop {
            let new = self.error_log_since(before);
            if new.contains("[emerg]") {
                break new;
            }
            assert!(Instant::now() < deadline, "the reload was not refused; error log since reload:\n{new}");
            thread::sleep(Duration::from_millis(20));
        };
        let running = self.http_block.clone();
        self.write_conf(&running);
        new
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        get(self.port, path, headers)
    }

    pub fn concurrent(&self, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<Response> {
        concurrent(self.port, n, path, headers)
    }

    /// The master's children that are alive (the workers, old and new).
    pub fn worker_pids(&self) -> Vec<u32> {
        let Some(master) = self.master else { return Vec::new() };
        let mut pids = Vec::new();
        for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            // "pid (comm) S ppid ...": the fields after the last ')'.
            let mut rest = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace()).into_iter().flatten();
            let (state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse::<u32>().ok()));
            if ppid == Some(master) && !matches!(state, Some("Z") | Some("X")) {
                pids.push(pid);
            }
        }
        pids
    }

    fn stop(&mut self) {
        let Some(pid) = self.master.take() else { return };
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            if Instant::now() > deadline {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Kills an nginx, master and workers, with SIGKILL: what it holds is gone
/// with it. The whole process group at once (the master leads it): a
/// worker killed alone would be started again by its master.
pub fn kill_nginx(n: &Nginx) {
    let master = std::fs::read_to_string(n.prefix.join("nginx.pid")).expect("no pid file");
    let master = master.trim().to_string();
    let workers = n.worker_pids();
    let ok =
        std::process::Command::new("kill").args(["-KILL", "--", &format!("-{master}")]).status().unwrap().success();
    assert!(ok, "kill -KILL -- -{master}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let pids: Vec<u32> = workers.into_iter().chain(master.parse().ok()).collect();
    while pids.iter().any(|&p| alive(p)) {
        assert!(Instant::now() < deadline, "nginx {pids:?} still running 5 s after SIGKILL");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `pid` still runs (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // "pid (comm) S ...": the state follows the last ')'.
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start()).and_then(|r| r.chars().next());
            !matches!(state, Some('Z') | Some('X'))
        }
        Err(_) => false,
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.stop();
        if thread::panicking() {
            eprintln!("nginx prefix kept for inspection: {}", self.prefix.display());
            let log = self.error_log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("last error log lines:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        } else {
            let _ = fs::remove_dir_all(&self.prefix);
        }
    }
}

/// An HTTP response.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    /// Names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// Whether any header starts with `prefix` (case-insensitive).
    pub fn has_header_prefix(&self, prefix: &str) -> bool {
        let prefix = prefix.to_ascii_lowercase();
        self.headers.iter().any(|(n, _)| n.starts_with(&prefix))
    }

    /// A header parsed as an integer; panics with the response if missing or malformed.
    pub fn num(&self, name: &str) -> u64 {
        self.header(name)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no numeric {name} header in {self:?}"))
    }
}

fn request_text(path: &str, headers: &[(&str, &str)]) -> String {
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req
}

fn connect(port: u16) -> io::Result<TcpStream> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut last = None;
    for i in 0..50 {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(30)))?;
                s.set_write_timeout(Some(Duration::from_secs(30)))?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
        thread::sleep(Duration::from_millis(5 * (i + 1)));
    }
    Err(last.unwrap())
}

fn exchange(mut s: TcpStream, req: &str) -> io::Result<Response> {
    s.write_all(req.as_bytes())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    parse_response(&buf)
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn parse_response(buf: &[u8]) -> io::Result<Response> {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad(format!("incomplete response: {:?}", String::from_utf8_lossy(buf))))?;
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let raw = &buf[end + 4..];
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked { dechunk(raw)? } else { raw.to_vec() };
    Ok(Response { status, headers, body: String::from_utf8_lossy(&body).into_owned() })
}

fn dechunk(mut raw: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = raw.windows(2).position(|w| w == b"\r\n").ok_or_else(|| bad("bad chunk".into()))?;
        let size_txt = String::from_utf8_lossy(&raw[..eol]);
        let size = usize::from_str_radix(size_txt.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad(format!("bad chunk size {size_txt:?}")))?;
        raw = &raw[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if raw.len() < size {
            return Err(bad("truncated chunk".into()));
        }
        out.extend_from_slice(&raw[..size]);
        raw = raw.get(size + 2..).unwrap_or(&[]);
    }
}

/// One GET on a fresh connection (`Connection: close`, read to EOF).
pub fn try_get(port: u16, path: &str, headers: &[(&str, &str)]) -> io::Result<Response> {
    exchange(connect(port)?, &request_text(path, headers))
}

pub fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> Response {
    try_get(port, path, headers).unwrap_or_else(|e| panic!("GET {path} on port {port} failed: {e}"))
}

/// `n` GETs on `n` simultaneous connections: all connections are opened
/// first, then every request is sent at once (a barrier).
pub fn concurrent(port: u16, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<Response> {
    concurrent_timed(port, n, path, headers).into_iter().map(|(r, _)| r).collect()
}

/// As [`concurrent`], with the time each response took, from the moment
/// every request was sent (the barrier) to its last byte.
pub fn concurrent_timed(port: u16, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<(Response, Duration)> {
    let req = Arc::new(request_text(path, headers));
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (req, barrier) = (req.clone(), barrier.clone());
            thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    let s = connect(port);
                    barrier.wait();
                    let t0 = Instant::now();
                    exchange(s?, &req).map(|r| (r, t0.elapsed()))
                })
                .expect("cannot spawn a client thread")
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join().expect("client thread panicked").unwrap_or_else(|e| panic!("concurrent GET {path} failed: {e}"))
        })
        .collect()
}

/// A request sent on a connection of its own and not read: the client
/// waits (or goes away, when the stream is dropped).
pub fn send_only(port: u16, path: &str) -> TcpStream {
    let mut s = connect(port).unwrap_or_else(|e| panic!("connect to {port}: {e}"));
    s.write_all(request_text(path, &[]).as_bytes()).unwrap_or_else(|e| panic!("send {path}: {e}"));
    s
}

impl Nginx {
    /// As [`concurrent_timed`] on this nginx.
    pub fn concurrent_timed(&self, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<(Response, Duration)> {
        concurrent_timed(self.port, n, path, headers)
    }
}

/// How many responses had each status.
pub fn statuses(rs: &[Response]) -> BTreeMap<u16, usize> {
    let mut m = BTreeMap::new();
    for r in rs {
        *m.entry(r.status).or_insert(0) += 1;
    }
    m
}

/// The items of a structured-field list such as
/// `"z";r=9;t=60, "z-2";r=4;t=10` as (name, {param: value}).
pub fn sf_items(value: &str) -> Vec<(String, BTreeMap<String, String>)> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim().trim_matches('"').to_string();
            let params = parts
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .collect();
            (name, params)
        })
        .collect()
}

/// Parameter `param` of item `item` in the structured header `header` of `r`, as a number.
pub fn sf_param(r: &Response, header: &str, item: &str, param: &str) -> u64 {
    let v = r.header(header).unwrap_or_else(|| panic!("no {header} header in {r:?}"));
    sf_items(v)
        .into_iter()
        .find(|(n, _)| n == item)
        .and_then(|(_, p)| p.get(param).and_then(|x| x.parse().ok()))
        .unwrap_or_else(|| panic!("no item {item:?} with numeric {param} in {header}: {v}"))
}

pub mod conf_nginx;
pub mod cutting_proxy;
pub mod held;
pub mod lease;
pub mod memcached;
pub mod redis;

// Shared by the test files.

/// An `http {}` body: `zones`, then one server on {PORT} with `body` inside.
pub fn server(zones: &str, body: &str) -> String {
    format!("{zones}\nserver {{\n listen 127.0.0.1:{{PORT}};\n root {{ROOT}};\n{body}\n}}\n")
}
/// `nginx_rl_requests_total` of zone `zone` and verdict `result` in an
/// `rl_metrics` text: of its line `line`, or summed over its lines; 0 where
/// there is no such series.
pub fn requests_total(metrics: &str, zone: &str, line: Option<&str>, result: &str) -> u64 {
    let head = match line {
        Some(line) => format!("nginx_rl_requests_total{{zone=\"{zone}\",line=\"{line}\","),
        None => format!("nginx_rl_requests_total{{zone=\"{zone}\","),
    };
    let tail = format!("result=\"{result}\"}} ");
    metrics
        .lines()
        .filter(|l| l.starts_with(&head) && l.contains(&tail))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

pub fn counts(pairs: &[(u16, usize)]) -> BTreeMap<u16, usize> {
    pairs.iter().copied().filter(|(_, n)| *n > 0).collect()
}

/// Error-log lines of Redis failures of zone `zone`.
pub fn failed_lines(log: &str, zone: &str) -> Vec<String> {
    let tag = format!("rl_zone \"{zone}\" redis ");
    log.lines().filter(|l| l.contains(&tag) && l.contains(" failed")).map(String::from).collect()
}

/// Lines that show a crashed worker or a fatal error.
pub fn crash_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("exited on signal") || l.contains("[alert]") || l.contains("[emerg]")).collect()
}
