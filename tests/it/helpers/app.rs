//! The application under test: in this process on port 0 (the test kit's [`TestApp`]), or as
//! the real binary on port 0 ([`RunningBinary`], killed on drop) and its CLI ([`run_cli`]); and
//! reading what the binary logs and exposes.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use dedup_worker::testing::{test_settings, TestApp};

use super::poll_until;

/// The binary with a clean environment: `PATH`, the brokers' and the AWS SDK's own settings
/// (scripts/test.sh sets them), then `env`. No developer configuration leaks in.
pub fn dedup_command(env: &[(&str, String)]) -> Command {
    program_command(Path::new(env!("CARGO_BIN_EXE_dedup-worker")), env)
}

/// The binary of example `name` (a service of one's own on the library, built by
/// `cargo build --example NAME`, which scripts/test.sh runs before the suite): beside the
/// crate's own binary, under `examples/`.
pub fn example_binary(name: &str) -> PathBuf {
    let binary = Path::new(env!("CARGO_BIN_EXE_dedup-worker"));
    let path = binary
        .parent()
        .expect("the binary's directory")
        .join("examples")
        .join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --example {name}` first (scripts/test.sh does)",
        path.display()
    );
    path
}

/// [`dedup_command`] for another program built on the library (an example service).
pub fn program_command(program: &Path, env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for name in [
        "AMQP_URL",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ] {
        if let Ok(value) = std::env::var(name) {
            cmd.env(name, value);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs a `dedup-worker` command (`dlq list`, `migrate`, …) with `env` and returns its stdout;
/// the command must succeed.
pub fn run_cli(env: &[(&str, String)], args: &[&str]) -> String {
    let out = dedup_command(env).args(args).output().expect("run cli");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// [`run_cli`] for a command that prints JSON lines (`dlq list`, `outbox failed`), parsed.
pub fn cli_json_lines(env: &[(&str, String)], args: &[&str]) -> Vec<serde_json::Value> {
    run_cli(env, args)
        .lines()
        .map(|l| serde_json::from_str(l).expect("the command prints JSON lines"))
        .collect()
}

/// The real binary, started with `env`, killed on drop.
pub struct RunningBinary {
    pub child: Child,
    pub addr: SocketAddr,
    /// The console's address, when `DEDUP_ADMIN__LISTEN` was given (the binary prints it on the
    /// line after the listening one).
    pub admin_addr: Option<SocketAddr>,
    /// Lines the binary wrote to stderr, for failure messages.
    pub stderr_path: PathBuf,
}

impl RunningBinary {
    pub fn start(env: &[(&str, String)], log_dir: &Path) -> Self {
        Self::start_program(Path::new(env!("CARGO_BIN_EXE_dedup-worker")), env, log_dir)
    }

    /// [`RunningBinary::start`] for another program built on the library: its `serve`.
    pub fn start_program(program: &Path, env: &[(&str, String)], log_dir: &Path) -> Self {
        let stderr_path = log_dir.join(format!("stderr-{}.log", uuid::Uuid::new_v4().simple()));
        let stderr = std::fs::File::create(&stderr_path).expect("log file");
        // Text logs, which the tests read for `field=value` (a test of the JSON lines sets
        // DEDUP_LOG__FORMAT=json, later in `env`).
        let mut cmd = program_command(
            program,
            &[
                ("DEDUP_LISTEN", "127.0.0.1:0".into()),
                ("RUST_LOG", "warn".into()),
                ("DEDUP_LOG__FORMAT", "text".into()),
            ],
        );
        cmd.arg("serve").stdout(Stdio::piped()).stderr(stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = lines.next().and_then(Result::ok).unwrap_or_else(|| {
            panic!(
                "binary exited early: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            )
        });
        let addr = line
            .strip_prefix("dedup-worker listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .expect("address");
        let admin_addr = env
            .iter()
            .any(|(k, _)| *k == "DEDUP_ADMIN__LISTEN")
            .then(|| {
                let line = lines.next().and_then(Result::ok).unwrap_or_default();
                line.strip_prefix("dedup-worker console on http://")
                    .unwrap_or_else(|| panic!("unexpected second line {line:?}"))
                    .parse()
                    .expect("address")
            });
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        RunningBinary {
            child,
            addr,
            admin_addr,
            stderr_path,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The status of `/readyz`.
    pub async fn readyz(&self, client: &reqwest::Client) -> u16 {
        let response = client.get(self.url("/readyz")).send().await;
        response.expect("/readyz answers").status().as_u16()
    }

    /// SIGTERM: the process drains and exits on its own; see [`RunningBinary::wait_exit`].
    pub fn terminate(&self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) with a pid we spawned and still hold (not yet reaped).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM sent");
    }

    /// Waits up to `timeout` for the process to exit; its exit status.
    pub async fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the binary did not exit within {timeout:?}; it logged:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// [`wait_for`], but a timeout also shows what the binary logged, so a failure in CI says
    /// why the pipeline stalled rather than only that it did.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        poll_until(timeout, check).await.unwrap_or_else(|| {
            panic!(
                "timed out after {timeout:?} waiting for {what}; the binary logged:\n{}",
                self.stderr()
            )
        })
    }
}

impl Drop for RunningBinary {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `logged` without the terminal colours the log puts around field names, so a test can match
/// `field=value`.
pub fn without_colours(logged: &str) -> String {
    let mut plain = String::with_capacity(logged.len());
    let mut chars = logged.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The value of an unlabelled counter in a Prometheus text exposition (`/metrics`); 0 when the
/// counter has not been registered yet (nothing incremented it).
pub fn counter_value(exposition: &str, name: &str) -> u64 {
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .map(|value| value.trim().parse::<f64>().expect("a counter's value") as u64)
        .next()
        .unwrap_or(0)
}
