//! Redis for the integration tests: throw-away `redis-server`s on loopback
//! ports (a single server, optionally password-protected, or a 3-master
//! cluster), spawned as children and killed on drop.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::{connect, exchange, free_port, request_text, Response};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh temporary directory for a server's files (cluster config, logs).
fn temp_dir(what: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("nginx-rl-{what}-{}-{}", std::process::id(), n));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn cli_output(port: u16, password: Option<&str>, args: &[&str]) -> Option<String> {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(pw) = password {
        cmd.args(["-a", pw, "--no-auth-warning"]);
    }
    let out = cmd.args(args).stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Spawns `redis-server` with `extra` arguments; waits until it answers PING.
/// `None` if it exited (e.g. the port was taken meanwhile).
fn spawn(port: u16, password: Option<&str>, dir: &PathBuf, extra: &[String]) -> Option<Child> {
    let log = fs::File::create(dir.join(format!("redis-{port}.log"))).unwrap();
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no", "--dir"])
        .arg(dir)
        .args(extra);
    if let Some(pw) = password {
        cmd.args(["--requirepass", pw]);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("cannot run redis-server (is the redis-server package installed?)");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        if cli_output(port, password, &["PING"]).as_deref() == Some("PONG") {
            return Some(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// One `redis-server` on 127.0.0.1, no persistence.
pub struct Redis {
    pub port: u16,
    password: Option<String>,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_with(None, Vec::new())
    }

    /// A server with `--requirepass pw`.
    pub fn with_password(pw: &str) -> Redis {
        Redis::start_with(Some(pw.to_string()), Vec::new())
    }

    /// A server that keeps its data in an append-only file, synced at every
    /// write: [`Redis::restart`] brings it back with what it held.
    pub fn with_aof() -> Redis {
        let extra = ["--appendonly", "yes", "--appendfsync", "always"];
        Redis::start_with(None, extra.iter().map(|a| a.to_string()).collect())
    }

    fn start_with(password: Option<String>, extra: Vec<String>) -> Redis {
        let dir = temp_dir("redis");
        for _ in 0..5 {
            let port = free_port();
            if let Some(child) = spawn(port, password.as_deref(), &dir, &extra) {
                return Redis { port, password, dir, extra, child: Some(child) };
            }
        }
        panic!("redis-server did not start; logs in {}", dir.display());
    }

    /// A server that also serves TLS on `tls_port`, with the certificates
    /// of `certs` (see [`TestCerts`]); clients must show a certificate the
    /// test CA signed. The plain port stays for the harness' `redis-cli`.
    pub fn with_tls(certs: &TestCerts) -> (Redis, u16) {
        let dir = temp_dir("redis");
        for _ in 0..5 {
            let tls_port = free_port();
            let mut extra = certs.server_args(tls_port);
            extra.extend(["--tls-auth-clients".into(), "yes".into()]);
            let port = free_port();
            if let Some(child) = spawn(port, None, &dir, &extra) {
                return (Redis { port, password: None, dir, extra, child: Some(child) }, tls_port);
            }
        }
        panic!("redis-server with TLS did not start");
    }

    /// `redis://127.0.0.1:PORT` (no password).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: no goodbye to its clients).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops it (if running) and starts a new, empty server on the same port.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(c) = spawn(self.port, self.password.as_deref(), &self.dir, &self.extra) {
                self.child = Some(c);
                return;
            }
            assert!(Instant::now() < deadline, "redis-server did not restart on port {}", self.port);
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends the server `sig` (`-STOP`, `-CONT`: `kill`'s form).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().map(Child::id).expect("redis-server is not running");
        let ok = Command::new("kill").args([sig, &pid.to_string()]).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    /// `redis-cli -p PORT args...` (authenticated if the server has a
    /// password): its output, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        cli_output(self.port, self.password.as_deref(), args).expect("cannot run redis-cli")
    }

    /// Every key matching `pattern` (`redis-cli --scan`), sorted.
    /// The state keys matching `pattern` (not the calls' memo keys: see
    /// [`Redis::memo_keys`]).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.all_keys(pattern).into_iter().filter(|k| !is_memo(k)).collect()
    }

    /// The memo keys (one per call that changed state, for a few seconds).
    pub fn memo_keys(&self, pattern: &str) -> Vec<String> {
        self.all_keys(pattern).into_iter().filter(|k| is_memo(k)).collect()
    }

    fn all_keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .cli(&["--scan", "--pattern", pattern])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        keys.sort();
        keys
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A test CA, a server certificate for 127.0.0.1 and a client certificate
/// it signed (PEM files `ca.pem`, `server.pem`, `server.key`, `client.pem`,
/// `client.key`), and a certificate of another CA (`other.pem`, `other.key`),
/// made with the `openssl` command.
pub struct TestCerts {
    pub dir: PathBuf,
}

impl TestCerts {
    pub fn make() -> TestCerts {
        let dir = temp_dir("certs");
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("cannot run openssl (is the openssl package installed?)");
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        for ca in ["ca", "other"] {
            run(&[
                &[
                    "req",
                    "-x509",
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN=nginx-rl test {ca}"),
                    "-keyout",
                    &format!("{ca}.key"),
                    "-out",
                    &format!("{ca}.pem"),
                ][..],
                &ec[..],
            ]
            .concat());
        }
        fs::write(dir.join("server.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for who in ["server", "client"] {
            run(&[
                &[
                    "req",
                    "-subj",
                    &format!("/CN=nginx-rl test {who}"),
                    "-keyout",
                    &format!("{who}.key"),
                    "-out",
                    &format!("{who}.csr"),
                ][..],
                &ec[..],
            ]
            .concat());
            run(&[
                "x509",
                "-req",
                "-days",
                "2",
                "-in",
                &format!("{who}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
            ]
            .iter()
            .copied()
            .chain(["-extfile", &format!("{who}.ext"), "-out", &format!("{who}.pem")])
            .collect::<Vec<&str>>());
        }
        TestCerts { dir }
    }

    /// `redis-server` arguments to serve TLS on `tls_port` with the server
    /// certificate, trusting the test CA.
    pub fn server_args(&self, tls_port: u16) -> Vec<String> {
        let mut args = vec!["--tls-port".to_string(), tls_port.to_string()];
        for (opt, file) in
            [("--tls-cert-file", "server.pem"), ("--tls-key-file", "server.key"), ("--tls-ca-cert-file", "ca.pem")]
        {
            args.push(opt.into());
            args.push(self.path(file));
        }
        args
    }

    /// The `rl_zone` parameters of a client of the test CA:
    /// `ssl_trusted_certificate=... ssl_certificate=... ssl_certificate_key=...`.
    pub fn zone_params(&self) -> String {
        format!(
            "ssl_trusted_certificate={} ssl_certificate={} ssl_certificate_key={}",
            self.path("ca.pem"),
            self.path("client.pem"),
            self.path("client.key")
        )
    }

    /// The absolute path of one of the files.
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Waits (20 s at most) until the replica on `port` (no password) has its
/// link to its master up and its first sync done.
fn until_synced(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cli_output(port, None, &["INFO", "replication"]).is_some_and(|s| s.contains("master_link_status:up")) {
        assert!(Instant::now() < deadline, "replica on port {port} never synced with its master");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A Redis Cluster of masters only, on 127.0.0.1.
pub struct Cluster {
    pub ports: Vec<u16>,
    /// With [`Cluster::start_replicated`]: the replicas' ports.
    pub replicas: Vec<u16>,
    /// Every node's port, in the order of `children`.
    node_ports: Vec<u16>,
    /// With [`Cluster::start_tls`]: each master's TLS port.
    pub tls_ports: Vec<u16>,
    dir: PathBuf,
    children: Vec<Child>,
}

impl Cluster {
    pub fn start(masters: usize) -> Cluster {
        Cluster::start_with(masters, None, 0)
    }

    /// A cluster of `masters` masters with a replica each, whose nodes take
    /// a master for failed after one second without an answer (a replica
    /// then takes its place): `ports` are the masters', `replicas` the
    /// others' (at the start).
    pub fn start_replicated(masters: usize) -> Cluster {
        let mut c = Cluster::start_with(masters * 2, None, 1);
        let (m, r): (Vec<usize>, Vec<usize>) = (0..c.ports.len())
            .partition(|&i| cli_output(c.ports[i], None, &["ROLE"]).is_some_and(|s| s.starts_with("master")));
        let pick = |v: &[u16], idx: &[usize]| idx.iter().map(|&i| v[i]).collect::<Vec<u16>>();
        c.replicas = pick(&c.ports, &r);
        c.tls_ports = pick(&c.tls_ports, &m);
        c.ports = pick(&c.ports, &m);
        for &p in &c.replicas {
            until_synced(p);
        }
        c
    }

    /// Kills the node on `port` (with SIGKILL: no goodbye to the cluster).
    pub fn kill(&mut self, port: u16) {
        if let Some(i) = self.node_ports.iter().position(|p| *p == port) {
            let _ = self.children[i].kill();
            let _ = self.children[i].wait();
        }
    }

    /// A cluster whose masters also serve TLS (`tls-cluster yes`: a client
    /// on TLS is redirected to TLS ports), with the certificates of `certs`
    /// (clients must show one the test CA signed). The plain ports stay
    /// for the harness' `redis-cli`.
    pub fn start_tls(masters: usize, certs: &TestCerts) -> Cluster {
        Cluster::start_with(masters, Some(certs), 0)
    }

    /// `nodes` nodes, with `replicas` replicas per master.
    fn start_with(nodes: usize, certs: Option<&TestCerts>, replicas: usize) -> Cluster {
        let dir = temp_dir("cluster");
        let mut cluster = Cluster {
            ports: Vec::new(),
            replicas: Vec::new(),
            node_ports: Vec::new(),
            tls_ports: Vec::new(),
            dir: dir.clone(),
            children: Vec::new(),
        };
        let node_timeout = if replicas > 0 { "1000" } else { "5000" };
        while cluster.ports.len() < nodes {
            let (port, bus, tls_port) = (free_port(), free_port(), free_port());
            if port == bus || port == tls_port || bus == tls_port || cluster.ports.contains(&port) {
                continue;
            }
            let mut extra: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &dir.join(format!("nodes-{port}.conf")).display().to_string(),
                "--cluster-port",
                &bus.to_string(),
                "--cluster-node-timeout",
                node_timeout,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if let Some(certs) = certs {
                extra.extend(certs.server_args(tls_port));
                extra.extend(["--tls-cluster".into(), "yes".into()]);
            }
            if let Some(c) = spawn(port, None, &dir, &extra) {
                cluster.ports.push(port);
                cluster.node_ports.push(port);
                cluster.tls_ports.push(tls_port);
                cluster.children.push(c);
            }
        }
        let nodes: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("cannot run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = cluster
                .ports
                .iter()
                .all(|p| cli_output(*p, None, &["CLUSTER", "INFO"]).is_some_and(|s| s.contains("cluster_state:ok")));
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "cluster not ok after 20 s (dir {})", dir.display());
            thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// `rediss+cluster://127.0.0.1:T1,127.0.0.1:T2,...` (the TLS ports).
    pub fn tls_url(&self) -> String {
        let nodes: Vec<String> = self.tls_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("rediss+cluster://{}", nodes.join(","))
    }

    /// `redis-cli -p PORT args...` on one node.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        cli_output(port, None, args).expect("cannot run redis-cli")
    }

    /// Every key matching `pattern` on every master, sorted.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .ports
            .iter()
            .flat_map(|p| {
                cli_output(*p, None, &["--scan", "--pattern", pattern])
                    .unwrap_or_default()
                    .lines()
                    .map(String::from)
                    .collect::<Vec<_>>()
            })
            .filter(|l| !l.trim().is_empty() && !is_memo(l))
            .collect();
        keys.sort();
        keys
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// One GET on a fresh connection, timed from the request written on the
/// open connection to its last byte (as [`super::concurrent_timed`]). The
/// connect is left out: the kernel answers it, not nginx, and of the tens of
/// thousands of connections a test opens, one may wait a second for a SYN
/// to be retransmitted.
pub fn timed_get(port: u16, path: &str, headers: &[(&str, &str)]) -> (Response, Duration) {
    let s = connect(port).unwrap_or_else(|e| panic!("connect to port {port} failed: {e}"));
    let t = Instant::now();
    let r =
        exchange(s, &request_text(path, headers)).unwrap_or_else(|e| panic!("GET {path} on port {port} failed: {e}"));
    (r, t.elapsed())
}

/// The `q`-quantile (0..=1) of `d`.
pub fn quantile(d: &[Duration], q: f64) -> Duration {
    let mut v = d.to_vec();
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

impl Redis {
    /// A server replicating `master` (`--replicaof 127.0.0.1 PORT`); waits
    /// until its link to the master is up and the first sync is done.
    pub fn replica_of(master: &Redis) -> Redis {
        let r = Redis::start_with(None, vec!["--replicaof".into(), "127.0.0.1".into(), master.port.to_string()]);
        until_synced(r.port);
        r
    }

    /// `INFO commandstats` calls of `cmd` (lowercase, e.g. `evalsha`) on this server.
    pub fn calls(&self, cmd: &str) -> u64 {
        let tag = format!("cmdstat_{cmd}:calls=");
        self.cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|l| l.trim().strip_prefix(tag.as_str()))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Errors of `code` (`ERR`, `NOSCRIPT`, ...) this server has answered,
    /// from `INFO errorstats`.
    pub fn errors(&self, code: &str) -> u64 {
        let tag = format!("errorstat_{code}:count=");
        self.cli(&["INFO", "errorstats"])
            .lines()
            .find_map(|l| l.trim().strip_prefix(tag.as_str()))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `role:master` or `role:slave`, from `INFO replication`.
    pub fn role(&self) -> String {
        self.cli(&["INFO", "replication"])
            .lines()
            .find_map(|l| l.trim().strip_prefix("role:").map(String::from))
            .unwrap_or_default()
    }
}

/// One Redis Sentinel (`redis-server sentinel.conf --sentinel`) on
/// 127.0.0.1, monitoring a master as `mymaster` with quorum 1,
/// `down-after-milliseconds 500` and `failover-timeout 5000`.
pub struct Sentinel {
    pub port: u16,
    /// With [`Sentinel::start_tls`]: its TLS port.
    pub tls_port: u16,
    pub master_name: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl Sentinel {
    /// A sentinel monitoring the server on `master_port`; waits until it
    /// answers with the master's address.
    pub fn start(master_port: u16) -> Sentinel {
        Sentinel::start_with(master_port, None)
    }

    /// A sentinel that also serves TLS, and monitors the master over TLS
    /// (`tls-replication yes`) on its TLS port `master_tls_port`, with the
    /// certificates of `certs`. The plain port stays for the harness.
    pub fn start_tls(master_tls_port: u16, certs: &TestCerts) -> Sentinel {
        Sentinel::start_with(master_tls_port, Some(certs))
    }

    fn start_with(master_port: u16, certs: Option<&TestCerts>) -> Sentinel {
        let dir = temp_dir("sentinel");
        let name = "mymaster";
        for _ in 0..5 {
            let (port, tls_port) = (free_port(), free_port());
            if port == tls_port {
                continue;
            }
            let conf = dir.join(format!("sentinel-{port}.conf"));
            // The server's TLS arguments, as configuration lines ("--opt value" -> "opt value").
            let tls: String = match certs {
                Some(c) => {
                    let args = c.server_args(tls_port);
                    let lines: String =
                        args.chunks(2).map(|kv| format!("{} {}\n", kv[0].trim_start_matches("--"), kv[1])).collect();
                    lines + "tls-replication yes\n"
                }
                None => String::new(),
            };
            fs::write(
                &conf,
                format!(
                    "port {port}\n\
                     bind 127.0.0.1\n\
                     daemonize no\n\
                     dir {dir}\n\
                     {tls}\
                     sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
                     sentinel down-after-milliseconds {name} 500\n\
                     sentinel failover-timeout {name} 5000\n",
                    dir = dir.display()
                ),
            )
            .unwrap();
            let log = fs::File::create(dir.join(format!("sentinel-{port}.log"))).unwrap();
            let mut child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("cannot run redis-server --sentinel");
            let deadline = Instant::now() + Duration::from_secs(10);
            let want = format!("127.0.0.1\n{master_port}");
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if cli_output(port, None, &["SENTINEL", "get-master-addr-by-name", name]).as_deref()
                    == Some(want.as_str())
                {
                    return Sentinel { port, tls_port, master_name: name.to_string(), dir, child: Some(child) };
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("redis sentinel did not start; logs in {}", dir.display());
    }

    /// `redis+sentinel://127.0.0.1:PORT/mymaster`.
    pub fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/{}", self.port, self.master_name)
    }

    /// `rediss+sentinel://127.0.0.1:TLS_PORT/mymaster`.
    pub fn tls_url(&self) -> String {
        format!("rediss+sentinel://127.0.0.1:{}/{}", self.tls_port, self.master_name)
    }

    /// `redis-cli -p PORT args...` on the sentinel: its output, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        cli_output(self.port, None, args).expect("cannot run redis-cli")
    }

    /// The master's port as the sentinel reports it.
    pub fn master_port(&self) -> Option<u16> {
        let out = self.cli(&["SENTINEL", "get-master-addr-by-name", &self.master_name]);
        out.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }

    /// Whether the sentinel lists a healthy replica on `port` (a failover
    /// needs one: otherwise `SENTINEL FAILOVER` answers NOGOODSLAVE).
    pub fn knows_replica(&self, port: u16) -> bool {
        let out = self.cli(&["SENTINEL", "replicas", &self.master_name]);
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        // Flat field/value pairs per replica; find ours and check its flags.
        let mut i = 0;
        let (mut port_ok, mut flags_ok) = (false, false);
        while i + 1 < lines.len() {
            match lines[i] {
                "name" => {
                    if port_ok && flags_ok {
                        return true;
                    }
                    port_ok = false;
                    flags_ok = false;
                }
                "port" => port_ok = lines[i + 1] == port.to_string(),
                "flags" => flags_ok = lines[i + 1] == "slave",
                _ => {}
            }
            i += 2;
        }
        port_ok && flags_ok
    }

    /// The sentinel's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join(format!("sentinel-{}.log", self.port))).unwrap_or_default()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A call's memo key: a state key, then `:c:` and the call's name.
pub fn is_memo(key: &str) -> bool {
    key.contains(":c:")
}
