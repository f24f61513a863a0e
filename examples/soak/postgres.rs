//! The run's own PostgreSQL server: a private cluster made with `initdb` in a temporary
//! directory and started with `pg_ctl` on a free port, so the nemesis can crash it (SIGKILL to
//! the postmaster and its backends: the database host going down) and start it again (crash
//! recovery from its WAL), and so its `default_transaction_isolation` can be the run's draw. It
//! is stopped and its directory removed when the run ends, whatever ended it (on drop too);
//! only a SIGKILL of the driver itself leaves it behind (`pg_ctl -D <dir>/data stop`).
//!
//! The binaries come from `SOAK_PG_BIN`, else `pg_config --bindir`, else the newest
//! `/usr/lib/postgresql/*/bin`. PostgreSQL refuses to run as root: as root the driver runs
//! them as the `postgres` user (`runuser`), and gives it the directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::time::Instant;

use crate::plan::Isolation;

/// How long `pg_ctl start` may take (crash recovery included).
const START_TIMEOUT_SECS: u64 = 60;

pub struct PgServer {
    bin: PathBuf,
    /// Removed by [`PgServer::remove`] or on drop (after the server is stopped).
    dir: std::sync::Mutex<Option<tempfile::TempDir>>,
    root: PathBuf,
    data: PathBuf,
    pub port: u16,
    /// Run the binaries as `postgres` (the driver is root).
    as_postgres: bool,
}

impl PgServer {
    /// Makes the cluster and starts it (blocking calls: run it where blocking is fine).
    pub fn start(isolation: Isolation) -> anyhow::Result<PgServer> {
        let bin = binaries()?;
        // SAFETY: geteuid(2) cannot fail and touches no memory.
        let as_postgres = unsafe { libc::geteuid() } == 0;
        let dir = tempfile::Builder::new()
            .prefix("dw-soak-pg-")
            .tempdir()
            .context("making the server's directory")?;
        if as_postgres {
            give_to_postgres(dir.path())?;
        }
        let data = dir.path().join("data");
        let port = free_port()?;
        let server = PgServer {
            bin,
            root: dir.path().to_owned(),
            dir: std::sync::Mutex::new(Some(dir)),
            data,
            port,
            as_postgres,
        };
        let data = server.data.display().to_string();
        server.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        let socket_dir = server.dir().display().to_string();
        // fsync off: the nemesis kills processes, never the machine, so what was written is in
        // the page cache and crash recovery replays the WAL as it would; this saves the shared
        // machine's disk. Every other setting is the default but the isolation.
        let settings = format!(
            "\n# The fault soak's own server (examples/soak/postgres.rs)\n\
             port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{socket_dir}'\n\
             max_connections = 300\nfsync = off\nshared_buffers = 64MB\n\
             default_transaction_isolation = '{}'\n",
            isolation.setting()
        );
        let conf = server.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).context("reading postgresql.conf")?;
        text.push_str(&settings);
        std::fs::write(&conf, text).context("writing postgresql.conf")?;
        server.pg_ctl_start()?;
        Ok(server)
    }

    fn dir(&self) -> &Path {
        &self.root
    }

    /// `postgres://` to the server's `postgres` database, as its superuser.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        }
    }

    fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<()> {
        let out = self
            .command(program)
            .args(args)
            .output()
            .with_context(|| format!("running {program}"))?;
        if !out.status.success() {
            bail!(
                "{program} {}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    fn pg_ctl_start(&self) -> anyhow::Result<()> {
        let data = self.data.display().to_string();
        let log = self.dir().join("server.log").display().to_string();
        let timeout = START_TIMEOUT_SECS.to_string();
        self.run(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-w", "-t", &timeout, "-s", "start"],
        )
    }

    /// The postmaster's pid, if one runs: the pid file's, when that process is a `postgres`
    /// whose data directory is ours (a stale file's pid may have been reused by anything).
    fn postmaster(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let ours = String::from_utf8_lossy(&cmdline).contains(&*self.data.to_string_lossy());
        ours.then_some(pid)
    }

    /// SIGKILL to the postmaster and every backend it forked; whether it was running.
    pub fn kill(&self) -> bool {
        let Some(postmaster) = self.postmaster() else {
            return false;
        };
        let children = children_of(postmaster);
        // SAFETY: kill(2) on the server's processes (read from its own pid file and /proc).
        unsafe {
            libc::kill(postmaster, libc::SIGKILL);
            for child in children {
                libc::kill(child, libc::SIGKILL);
            }
        }
        true
    }

    /// Starts the server again (crash recovery), polled until it runs or `deadline`: an
    /// orphaned backend still attached to the old shared memory makes a start fail until it
    /// exits.
    pub async fn restart(self: &Arc<Self>, deadline: Instant) -> anyhow::Result<u32> {
        let mut failures = 0;
        loop {
            // On the blocking pool, never `block_in_place`: that retires the runtime worker it
            // runs on, and the service processes that worker spawned die with it (their
            // PR_SET_PDEATHSIG follows the spawning thread; cluster.rs).
            let this = self.clone();
            let started = tokio::task::spawn_blocking(move || this.pg_ctl_start())
                .await
                .unwrap_or_else(|e| Err(anyhow!("pg_ctl start panicked: {e}")));
            match started {
                Ok(()) => return Ok(failures),
                Err(error) if Instant::now() >= deadline => {
                    return Err(error.context(format!("{failures} failed start(s)")))
                }
                Err(_) => failures += 1,
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Whether the postmaster runs.
    pub fn running(&self) -> bool {
        self.postmaster().is_some()
    }

    /// Stops the server at once and removes its directory (once).
    pub fn remove(&self) {
        let Some(dir) = self.dir.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        if self.running() {
            let data = self.data.display().to_string();
            let _ = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
        }
        // Whatever pg_ctl left (it failed, or backends outlived a crash).
        self.kill();
        let _ = dir.close();
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.remove();
    }
}

fn binaries() -> anyhow::Result<PathBuf> {
    if let Ok(dir) = std::env::var("SOAK_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .filter(|dir| dir.join("initdb").is_file());
    if let Some(dir) = from_pg_config {
        return Ok(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        anyhow!(
            "no PostgreSQL server binaries (initdb, pg_ctl): set SOAK_PG_BIN to their directory"
        )
    })
}

fn give_to_postgres(dir: &Path) -> anyhow::Result<()> {
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: getpwnam returns a pointer into static storage, read at once, on this thread.
    let (uid, gid) = unsafe {
        let entry = libc::getpwnam(name.as_ptr());
        if entry.is_null() {
            bail!("running as root, and there is no postgres user to run the server as");
        }
        ((*entry).pw_uid, (*entry).pw_gid)
    };
    std::os::unix::fs::chown(dir, Some(uid), Some(gid)).context("giving the directory to postgres")
}

/// A port free now (the server binds it a moment later; a clash fails the start, loudly).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The pids whose parent is `parent` (from /proc).
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid …`: comm may hold spaces, so read after its last ')'.
            let ppid: i32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}
