//! `dedup-worker`: see `src/cli.rs` for the commands and the library for everything else.

mod cli;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    cli::run().await
}
