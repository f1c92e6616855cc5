//! nginx running a whole configuration file from `nginx-conf/`, as it is
//! (the module path and the listening port rewritten).

use std::fs;
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::{get, module_path, nginx_bin, Response};

/// nginx running a whole configuration file from `nginx-conf/`, with the
/// module path and the listening port rewritten; stopped on drop.
pub struct ConfNginx {
    pub prefix: PathBuf,
    pub port: u16,
    master: Option<u32>,
}

/// Instances started by this test binary: one recipe may run twice at once
/// (a fleet), each in its own prefix.
static STARTED: AtomicUsize = AtomicUsize::new(0);

impl ConfNginx {
    pub fn start(name: &str, files: &[(&str, &str)]) -> ConfNginx {
        ConfNginx::start_with(name, files, &[])
    }

    /// As [`ConfNginx::start`], with each `(from, to)` of `replace` replaced
    /// in the file too (where it must occur: a Redis URL, say).
    pub fn start_with(name: &str, files: &[(&str, &str)], replace: &[(&str, &str)]) -> ConfNginx {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("nginx-conf").join(name);
        let mut conf = fs::read_to_string(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        assert!(conf.contains("load_module modules/ngx_http_rl_module.so;") && conf.contains("127.0.0.1:8080"));
        for (from, to) in replace {
            assert!(conf.contains(from), "{from:?} is not in {name}");
            conf = conf.replace(from, to);
        }
        let n = STARTED.fetch_add(1, Ordering::SeqCst);
        let prefix = std::env::temp_dir().join(format!("nginx-rl-conf-{}-{n}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&prefix);
        fs::create_dir_all(prefix.join("logs")).unwrap();
        for (rel, content) in files {
            let path = prefix.join("html").join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, content).unwrap();
        }
        let module = module_path();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port();
            let text = conf
                .replace("load_module modules/ngx_http_rl_module.so;", &format!("load_module {};", module.display()))
                .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
            fs::write(prefix.join("nginx.conf"), text).unwrap();
            // Output to a file: the daemon could keep a pipe open.
            let startup = prefix.join("startup.log");
            let status = Command::new(nginx_bin())
                .arg("-p")
                .arg(format!("{}/", prefix.display()))
                .arg("-c")
                .arg(prefix.join("nginx.conf"))
                .arg("-e")
                .arg(prefix.join("logs/error.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(&startup).unwrap())
                .status()
                .expect("cannot run nginx");
            let mut ngx = ConfNginx { prefix: prefix.clone(), port, master: None };
            if !status.success() {
                let err = fs::read_to_string(&startup).unwrap_or_default() + &ngx.error_log();
                assert!(err.contains("Address already in use"), "nginx did not start with {name}: {err}");
                continue;
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while ngx.master.is_none() || TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
                ngx.master = fs::read_to_string(prefix.join("nginx.pid")).ok().and_then(|p| p.trim().parse().ok());
                assert!(Instant::now() < deadline, "nginx with {name} not listening:\n{}", ngx.error_log());
                thread::sleep(Duration::from_millis(10));
            }
            return ngx;
        }
        panic!("no free port for nginx with {name}");
    }

    pub fn concurrent(&self, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<Response> {
        super::concurrent(self.port, n, path, headers)
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        get(self.port, path, headers)
    }

    pub fn error_log(&self) -> String {
        fs::read_to_string(self.prefix.join("logs/error.log")).unwrap_or_default()
    }
}

impl Drop for ConfNginx {
    fn drop(&mut self) {
        if let Some(pid) = self.master.take() {
            let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
        }
        if !thread::panicking() {
            let _ = fs::remove_dir_all(&self.prefix);
        }
    }
}
