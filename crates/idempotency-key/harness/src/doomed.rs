//! A server that dies as a crashed process does.

use axum::Router;
use sqlx::PgPool;

/// A server in a runtime of its own, so that dropping the runtime kills it like a crashed
/// process: no completion, no release, no commit, its PostgreSQL connections closed mid-way, the
/// claim just stops being renewed. `make` builds its router inside that runtime, on a pool of
/// its own over `db_url`.
pub struct DoomedServer {
    pub addr: std::net::SocketAddr,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DoomedServer {
    pub fn start<F>(db_url: String, make: F) -> Self
    where
        F: FnOnce(PgPool) -> Router + Send + 'static,
    {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("the doomed server's runtime");
            rt.block_on(async move {
                let pool = PgPool::connect(&db_url).await.expect("connect");
                let addr = crate::serve(make(pool)).await;
                addr_tx.send(addr).expect("send the address");
                let _ = kill_rx.await;
            });
            // Dropping the runtime drops every task and connection: the process is gone.
            drop(rt);
        });
        let addr = addr_rx.recv().expect("the doomed server's address");
        Self {
            addr,
            kill: Some(kill_tx),
            thread: Some(thread),
        }
    }

    /// Kills it, and returns once everything it held is gone.
    pub fn kill(mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().expect("the doomed server's thread");
        }
    }
}
