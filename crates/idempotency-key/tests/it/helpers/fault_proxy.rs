//! A TCP proxy the test controls, between the layer and PostgreSQL or Redis, to inject the
//! faults production meets without touching the machine's shared services:
//!
//! * [`Mode::Pass`]: bytes flow both ways;
//! * [`Mode::BlackHole`]: connections stay open and nothing is answered (a hung server, a
//!   partition): open connections stop forwarding with both ends held open, so the dependency
//!   sees no close either; new ones are accepted and held;
//! * [`Mode::Refuse`]: open connections are reset and new ones are reset as soon as accepted
//!   (a server that is down or restarting);
//! * [`FaultProxy::cut_all`]: every open connection is reset once, new ones pass (a restart, a
//!   load balancer dropping idle connections).
//!
//! The same proxy as dedup-worker's test kit (`dedup_worker::testing::fault_proxy`), less its
//! latency: this crate's tests cannot depend on the pipeline, and use only these faults.
//! Connections held by a black hole are reset when the mode changes again: their bytes in
//! flight are gone, as after a real partition longer than the server's patience.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))] // `Refuse` is for Redis's faults
pub enum Mode {
    Pass,
    BlackHole,
    Refuse,
}

/// The proxy's state every connection task watches: the mode, and how many cuts so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    mode: Mode,
    cuts: u64,
}

pub struct FaultProxy {
    /// Where the client connects: 127.0.0.1 and this port.
    pub port: u16,
    state: watch::Sender<State>,
    /// Held by every connection while it forwards, replaced at each change: a change waits
    /// until the connections that forwarded before it have stopped (new ones may start).
    forwarding: Arc<Mutex<Arc<()>>>,
    /// Connections accepted since start, in any mode (attempts to reach the dependency).
    accepted: Arc<AtomicU64>,
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
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream.to_owned(),
            state.clone(),
            forwarding.clone(),
            accepted.clone(),
        ));
        FaultProxy {
            port,
            state,
            forwarding,
            accepted,
            accept,
        }
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
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // Redis's faults only
    pub async fn cut_all(&self) {
        let before = self.new_epoch();
        self.state.send_modify(|s| s.cuts += 1);
        Self::until_stopped(before).await;
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
) {
    while let Ok((client, _)) = listener.accept().await {
        accepted.fetch_add(1, Ordering::SeqCst);
        let watcher = state.subscribe();
        tokio::spawn(connection(
            client,
            upstream.clone(),
            watcher,
            forwarding.clone(),
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
) {
    let start = *state.borrow_and_update();
    match start.mode {
        Mode::Refuse => return reset(client),
        Mode::BlackHole => return hold_until_change(client, state).await,
        Mode::Pass => {}
    }
    let Ok(mut server) = TcpStream::connect(&upstream).await else {
        return reset(client);
    };
    // Taken before looking at the state again: a change made after this sees this connection.
    let epoch = forwarding.lock().unwrap().clone();
    // Biased, the state first: a connection that starts after a change forwards nothing.
    let next = tokio::select! {
        biased;
        changed = state.wait_for(|s| *s != start) => changed.ok().map(|s| *s),
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => None,
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

/// Closes with a reset (no orderly FIN), as a dead or restarting server's host does.
fn reset(client: TcpStream) {
    // Deprecated because a non-zero linger blocks the thread on drop; zero never waits.
    #[allow(deprecated)]
    let _ = client.set_linger(Some(Duration::ZERO));
    drop(client);
}
