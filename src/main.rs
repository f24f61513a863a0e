//! `dedup-worker`: see `src/cli.rs` for the commands and the library for everything else.

mod cli;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match cli::run().await {
        Ok(code) => code,
        Err(error) => {
            // `{:#}` prints the whole cause chain on one line, without a backtrace.
            eprintln!("dedup-worker: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
