//! `blazar-server`: parses the configuration and runs the server.

use clap::Parser;

use blazar_server::config::{Cli, Config};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let config = match Config::resolve(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("blazar-server: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();
    match blazar_server::run(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("blazar-server: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
