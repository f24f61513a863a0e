//! `dedup-worker`: the library's command line ([`dedup_worker::cli`]) with the stock
//! [`Service`]. A service with a handler of its own has the same `main`, with its handler.

use dedup_worker::Service;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    Service::new().run().await
}
