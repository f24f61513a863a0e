//! `dedup-worker retention run`: one retention pass now, what the service's retention task does
//! every `consumer.retention_interval`, printed as JSON (what was purged, which day partitions
//! were made, finished, detached and dropped, what failed). For an operator who shortened
//! `retention.payload_days` and wants the disk back now, or who was alerted that partitions
//! are running out.

use std::path::PathBuf;

use clap::Subcommand;
use tokio_util::sync::CancellationToken;

use super::commands::{connect, store_settings};
use crate::retention::{retention_pass, RetentionOptions};

#[derive(Debug, Subcommand)]
pub enum RetentionCommand {
    /// Run one retention pass now and print what it did as JSON.
    Run,
}

pub async fn retention(config: Option<PathBuf>, command: RetentionCommand) -> anyhow::Result<()> {
    match command {
        RetentionCommand::Run => {
            let options = RetentionOptions::from_settings(&store_settings(config.clone())?);
            let store = connect(config).await?;
            let pass = retention_pass(&store, &options, &CancellationToken::new()).await;
            println!("{}", serde_json::to_string_pretty(&pass)?);
            store.close().await;
            if let Some(error) = pass.errors.first() {
                anyhow::bail!(
                    "{} step(s) of the pass failed, the first: {error}",
                    pass.errors.len()
                );
            }
            Ok(())
        }
    }
}
