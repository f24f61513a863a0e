//! `dedup-worker`: the library's command line ([`dedup_worker::cli`]) with nothing overridden.
//! A service with a handler of its own has the same `main`, with its [`Overrides`].
//!
//! [`Overrides`]: dedup_worker::startup::Overrides

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dedup_worker::cli::run(dedup_worker::startup::Overrides::default()).await
}
