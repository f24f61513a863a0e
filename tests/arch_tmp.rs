#[path = "it/architecture.rs"]
mod architecture;
