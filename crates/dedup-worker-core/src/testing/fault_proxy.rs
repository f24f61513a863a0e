//! A TCP proxy the test controls, put between the binary and one dependency (PostgreSQL,
//! RabbitMQ, Redis, the SQS emulator, an HTTP sink) to inject the faults production meets,
//! without touching the machine's shared services:
//!
//! * [`Mode::Pass`]: bytes flow both ways;
//! * [`Mode::BlackHole`]: connections stay open and nothing is answered (a hung server, a
//!   partition): open connections stop forwarding with both ends held open, so the dependency
//!   sees no close either; new ones are accepted and held;
//! * [`Mode::Refuse`]: open connections are reset and new ones are reset as soon as accepted
//!   (a server that is down or restarting);
//! * [`Mode::LoseAnswers`]: what clients send reaches the dependency, and what it answers is
//!   read and thrown away, on open connections and new ones, until the mode changes, when they
//!   are reset: a network that drops one direction, the way a commit's answer gets lost after
//!   the commit (the client must retry work that did happen);
//! * [`FaultProxy::cut_all`]: every open connection is reset once, new ones pass (a broker
//!   restart, a load balancer dropping idle connections);
//! * [`FaultProxy::set_latency`]: every chunk of bytes, either way, is held that long before it
//!   is passed on (a slow network, a far region, a throttled or overloaded service), on open
//!   connections too; a delay line, so throughput is not cut, only every round trip lengthened
//!   by twice the latency.
//!
//! It is part of the test kit so that the integration suite and the soak (`bench/soak.sh`)
//! inject faults with one proxy.
//!
//! Connections held by a black hole are reset when the mode changes again: their bytes in
//! flight are gone, as after a real partition longer than the server's patience.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    BlackHole,
    Refuse,
    LoseAnswers,
}

/// The proxy's state every connection task watches: the mode, and how many cuts so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    mode: Mode,
    cuts: u64,
}

pub struct FaultProxy {
    /// Where the binary connects: 127.0.0.1 and this port.
    pub port: u16,
    state: watch::Sender<State>,
    /// Held by every connection while it forwards, replaced at each change: a change waits
    /// until the connections that forwarded before it have stopped (new ones may start).
    forwarding: Arc<Mutex<Arc<()>>>,
    /// Connections accepted since start, in any mode (attempts to reach the dependency).
    accepted: Arc<AtomicU64>,
    /// The delay added to every chunk forwarded, in microseconds (read per chunk, so a change
    /// reaches open connections without resetting them).
    latency: Arc<AtomicU64>,
    /// The accept loop, stopped on drop (its connection tasks end with the test's runtime).
    accept: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy in [`Mode::Pass`] forwarding to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let (state, _) = watch::channel(State {
            mode: Mode::Pass,
            cuts: 0,
        });
        let forwarding = Arc::new(Mutex::new(Arc::new(())));
        let accepted = Arc::new(AtomicU64::new(0));
        let latency = Arc::new(AtomicU64::new(0));
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream.to_owned(),
            state.clone(),
            forwarding.clone(),
            accepted.clone(),
            latency.clone(),
        ));
        FaultProxy {
            port,
            state,
            forwarding,
            accepted,
            latency,
            accept,
        }
    }

    /// `url` with its `host:port` authority replaced by the proxy's.
    pub fn rewrite(&self, url: &str, upstream: &str) -> String {
        assert!(url.contains(upstream), "{url} does not name {upstream}");
        url.replacen(upstream, &format!("127.0.0.1:{}", self.port), 1)
    }

    /// Switches mode; returns once no connection forwards any more if the mode stops
    /// forwarding, so nothing sent after this reaches the dependency.
    pub async fn set(&self, mode: Mode) {
        let before = self.new_epoch();
        self.state.send_modify(|s| s.mode = mode);
        if mode != Mode::Pass {
            Self::until_stopped(before).await;
        }
    }

    /// Resets every open connection once; new connections pass (if the mode is `Pass`).
    pub async fn cut_all(&self) {
        let before = self.new_epoch();
        self.state.send_modify(|s| s.cuts += 1);
        Self::until_stopped(before).await;
    }

    /// Holds every chunk forwarded from now on, either way, `latency` before passing it on
    /// (`Duration::ZERO`: none). Open connections stay open.
    pub fn set_latency(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency.store(micros, Ordering::SeqCst);
    }

    /// The latency [`FaultProxy::set_latency`] set last.
    pub fn latency(&self) -> Duration {
        Duration::from_micros(self.latency.load(Ordering::SeqCst))
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Starts a new epoch of forwarding connections; returns the old one's token.
    fn new_epoch(&self) -> Arc<()> {
        std::mem::replace(&mut *self.forwarding.lock().unwrap(), Arc::new(()))
    }

    /// Waits until no connection holds `epoch` (they all saw the change).
    async fn until_stopped(epoch: Arc<()>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&epoch) > 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "proxy connections still forwarding after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: String,
    state: watch::Sender<State>,
    forwarding: Arc<Mutex<Arc<()>>>,
    accepted: Arc<AtomicU64>,
    latency: Arc<AtomicU64>,
) {
    while let Ok((client, _)) = listener.accept().await {
        accepted.fetch_add(1, Ordering::SeqCst);
        let watcher = state.subscribe();
        tokio::spawn(connection(
            client,
            upstream.clone(),
            watcher,
            forwarding.clone(),
            latency.clone(),
        ));
    }
}

/// One client connection, for its life: forwarded while the mode passes, held in a black
/// hole, reset when refused or cut.
async fn connection(
    mut client: TcpStream,
    upstream: String,
    mut state: watch::Receiver<State>,
    forwarding: Arc<Mutex<Arc<()>>>,
    latency: Arc<AtomicU64>,
) {
    let start = *state.borrow_and_update();
    match start.mode {
        Mode::Refuse => return reset(client),
        Mode::BlackHole => return hold_until_change(client, state).await,
        Mode::Pass | Mode::LoseAnswers => {}
    }
    let Ok(mut server) = TcpStream::connect(&upstream).await else {
        return reset(client);
    };
    if start.mode == Mode::LoseAnswers {
        lose_answers_until_change(&mut client, &mut server, state).await;
        drop(server);
        return reset(client);
    }
    // Taken before looking at the state again: a change made after this sees this connection.
    let epoch = forwarding.lock().unwrap().clone();
    // Biased, the state first: a connection that starts after a change forwards nothing.
    let next = tokio::select! {
        biased;
        changed = state.wait_for(|s| *s != start) => changed.ok().map(|s| *s),
        _ = forward(&mut client, &mut server, &latency) => None,
    };
    drop(epoch);
    match next {
        // Both ends held: as in a real partition, the dependency sees nothing either (a
        // PostgreSQL session stays open, its transaction and locks with it, until the server's
        // own timeouts end it).
        Some(State {
            mode: Mode::BlackHole,
            cuts,
        }) if cuts == start.cuts => {
            hold_until_change(client, state).await;
            drop(server);
        }
        // The same connection goes on one way: what was in flight is lost, as on a real
        // network.
        Some(State {
            mode: Mode::LoseAnswers,
            cuts,
        }) if cuts == start.cuts => {
            lose_answers_until_change(&mut client, &mut server, state).await;
            drop(server);
            reset(client);
        }
        _ => {
            drop(server);
            reset(client);
        }
    }
}

/// Holds a connection open without reading or writing until the proxy's state changes, then
/// resets it.
async fn hold_until_change(client: TcpStream, mut state: watch::Receiver<State>) {
    let held = *state.borrow_and_update();
    let _ = state.wait_for(|s| *s != held).await;
    reset(client);
}

/// Passes what the client sends to the server and throws away what the server answers, until
/// the proxy's state changes or either side ends.
async fn lose_answers_until_change(
    client: &mut TcpStream,
    server: &mut TcpStream,
    mut state: watch::Receiver<State>,
) {
    let held = *state.borrow_and_update();
    let (mut client_read, _client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let up = tokio::io::copy(&mut client_read, &mut server_write);
    let mut thrown_away = tokio::io::sink();
    let down = tokio::io::copy(&mut server_read, &mut thrown_away);
    tokio::select! {
        _ = state.wait_for(|s| *s != held) => {}
        _ = async { tokio::join!(up, down) } => {}
    }
}

/// Closes with a reset (no orderly FIN), as a dead or restarting server's host does.
fn reset(client: TcpStream) {
    // Deprecated because a non-zero linger blocks the thread on drop; zero never waits.
    #[allow(deprecated)]
    let _ = client.set_linger(Some(Duration::ZERO));
    drop(client);
}

/// Forwards both ways, each through a delay line, until both directions ended or either
/// failed (as `copy_bidirectional` does).
async fn forward(client: &mut TcpStream, server: &mut TcpStream, latency: &AtomicU64) {
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let up = delay_line(&mut client_read, &mut server_write, latency);
    let down = delay_line(&mut server_read, &mut client_write, latency);
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        let ended = tokio::select! {
            ended = &mut up, if !up_done => { up_done = true; ended }
            ended = &mut down, if !down_done => { down_done = true; ended }
        };
        if ended.is_err() {
            return;
        }
    }
}

/// Chunks read from `from` are written to `to` once `latency` (as it was when each was read)
/// has passed; the end of `from` shuts `to`'s writing half. Reading goes on while earlier chunks
/// wait, so a delay does not cut throughput.
async fn delay_line(
    from: &mut ReadHalf<'_>,
    to: &mut WriteHalf<'_>,
    latency: &AtomicU64,
) -> std::io::Result<()> {
    let (chunks, mut due) = mpsc::channel::<(Instant, Vec<u8>)>(64);
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            let at = Instant::now() + Duration::from_micros(latency.load(Ordering::SeqCst));
            if chunks.send((at, buf[..n].to_vec())).await.is_err() {
                return Ok(());
            }
        }
    };
    // Owns the receiving end: a failed write drops it, so the reader stops at its next chunk.
    let write = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            to.write_all(&chunk).await?;
        }
        to.shutdown().await
    };
    let (read, write) = tokio::join!(read, write);
    read.and(write)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on port 0: what it reads, it writes back.
    async fn echo() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = conn.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(conn: &mut TcpStream, bytes: &[u8]) -> Duration {
        let started = Instant::now();
        conn.write_all(bytes).await.unwrap();
        let mut back = vec![0u8; bytes.len()];
        conn.read_exact(&mut back).await.unwrap();
        assert_eq!(back, bytes);
        started.elapsed()
    }

    /// A server that counts the bytes it reads and answers each chunk with `ok`.
    async fn counting() -> (String, Arc<AtomicU64>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let read = Arc::new(AtomicU64::new(0));
        let counted = read.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n @ 1..) = conn.read(&mut buf).await {
                        counted.fetch_add(n as u64, Ordering::SeqCst);
                        if conn.write_all(b"ok").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, read)
    }

    /// Waits (polling, 5 s at most) until the server has read `n` bytes in all.
    async fn until_read(read: &AtomicU64, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while read.load(Ordering::SeqCst) < n {
            assert!(
                Instant::now() < deadline,
                "the server read {read:?}, not {n}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn lose_answers_delivers_requests_and_drops_answers_on_open_and_new_connections() {
        let (addr, read) = counting().await;
        let proxy = FaultProxy::start(&addr).await;
        let mut open = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        open.write_all(b"before").await.unwrap();
        let mut answer = [0u8; 2];
        open.read_exact(&mut answer).await.unwrap();

        proxy.set(Mode::LoseAnswers).await;
        let mut new = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        open.write_all(b"during").await.unwrap();
        new.write_all(b"during").await.unwrap();
        // Both requests reach the server...
        until_read(&read, 6 + 6 + 6).await;
        // ...and neither answer comes back (the server wrote them at once).
        for conn in [&mut open, &mut new] {
            let answered =
                tokio::time::timeout(Duration::from_millis(300), conn.read(&mut answer)).await;
            assert!(answered.is_err(), "an answer came through: {answered:?}");
        }

        // Back to passing: the connections that lost answers are reset; a new one works.
        proxy.set(Mode::Pass).await;
        for conn in [&mut open, &mut new] {
            let ended = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut answer))
                .await
                .expect("a reset, not silence");
            assert!(matches!(ended, Ok(0) | Err(_)), "{ended:?}");
        }
        let mut after = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        after.write_all(b"after").await.unwrap();
        after.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"ok");
    }

    #[tokio::test]
    async fn latency_lengthens_each_round_trip_on_open_connections_without_resetting_them() {
        let proxy = FaultProxy::start(&echo().await).await;
        let mut conn = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        round_trip(&mut conn, b"before").await;

        proxy.set_latency(Duration::from_millis(150));
        assert_eq!(proxy.latency(), Duration::from_millis(150));
        // Held once each way: at least twice the latency (a lower bound only; the machine may
        // add to it, never take away).
        let slow = round_trip(&mut conn, b"during").await;
        assert!(slow >= Duration::from_millis(300), "{slow:?}");

        // Many chunks in flight at once still arrive whole and in order.
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        round_trip(&mut conn, &big).await;

        proxy.set_latency(Duration::ZERO);
        round_trip(&mut conn, b"after").await;
        assert_eq!(proxy.accepted(), 1, "the same connection throughout");
    }
}
