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
    ///
    /// The port comes from binding port 0 and letting it go, so another process (or another
    /// test's server) may take it before this server binds: a server that exits is started
    /// again on a fresh port. The server is ready when it answers as itself (see
    /// [`answers_as_itself`](Self::answers_as_itself)), not when the port merely accepts.
    pub fn start_with(password: Option<&str>) -> Option<Self> {
        const ATTEMPTS: usize = 5;
        for attempt in 1..=ATTEMPTS {
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
            let mut server = Self {
                child,
                port,
                password: password.map(str::to_string),
                _dir: dir,
            };
            if server.wait_until_ready() {
                return Some(server);
            }
            eprintln!(
                "redis-server on port {port} exited at start (attempt {attempt} of {ATTEMPTS})"
            );
        }
        panic!("redis-server exited at start {ATTEMPTS} times, each on a fresh port");
    }

    /// Waits until this child answers on its port: true then, false if it exited first.
    fn wait_until_ready(&mut self) -> bool {
        let start = Instant::now();
        loop {
            if let Ok(Some(_status)) = self.child.try_wait() {
                return false;
            }
            if self.answers_as_itself() {
                return true;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not answer on port {} within 10 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server on the port answers and is this child: two starts may be handed the
    /// same free port, and then the one that lost the race must not take the other's server
    /// for its own (it would vanish when the other test ends). `INFO server` names the pid.
    fn answers_as_itself(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
            return false;
        };
        let info: String = match redis::cmd("INFO").arg("server").query(&mut connection) {
            Ok(info) => info,
            Err(_) => return false,
        };
        let ours = format!("process_id:{}", self.child.id());
        info.lines().any(|line| line.trim() == ours)
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
