//! `blazar-server`: parses the configuration and runs the server, or an administration
//! command (`token`, `policy`, `reconcile`).

use std::io::IsTerminal;

use clap::Parser;

use blazar_server::config::{Cli, Command, Config};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut cli = Cli::parse();
    let command = cli.command.take().unwrap_or(Command::Serve);
    let config = match Config::resolve(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("blazar-server: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let result = match command {
        Command::Serve => {
            // Colours only for a person at a terminal, not in files or journals.
            logs.with_ansi(std::io::stdout().is_terminal()).init();
            blazar_server::run(config).await
        }
        // Commands print their results on standard output; logs go to standard error.
        Command::Token(token) => {
            logs.with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .init();
            blazar_server::commands::token(&config, token, &mut std::io::stdout()).await
        }
        Command::Reconcile { apply, .. } => {
            logs.with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .init();
            blazar_server::commands::reconcile(&config, apply, &mut std::io::stdout()).await
        }
        Command::Policy(policy) => {
            logs.with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .init();
            blazar_server::commands::policy(&config, policy, &mut std::io::stdout())
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("blazar-server: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
