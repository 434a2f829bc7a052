//! A real `redis-server` for the remote tier's tests and bench: started on a free local port
//! with persistence off, killed when dropped. `None` (with the reason printed) where the binary
//! is missing, so that a plain `cargo test` still passes.

#![allow(dead_code)] // each user takes some of these

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Child,
    port: u16,
    password: Option<String>,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server, or says why it cannot.
    pub fn start() -> Option<Self> {
        Self::start_with(None)
    }

    /// Starts a server that wants `password`.
    pub fn start_with(password: Option<&str>) -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .ok()?
            .port();
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(password) = password {
            command.args(["--requirepass", password]);
        }
        let child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                eprintln!(
                    "skipped: cannot start redis-server ({e}); install it (apt-get install redis-server)"
                );
                return None;
            }
        };
        let server = Self {
            child,
            port,
            password: password.map(str::to_string),
            _dir: dir,
        };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not listen on port {port} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    /// The URL to give `SpillConfig::remote_tier`, with the password if the server wants one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The URL without any password.
    pub fn url_without_password(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain client connection, as any other program would open.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("a plain client connects")
    }

    /// Keys under burn-spill's namespaces.
    pub fn spill_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("burn-spill:*")
            .query(&mut self.client())
            .expect("KEYS");
        keys.sort();
        keys
    }

    /// Kills the server at once (SIGKILL: no clean shutdown).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
