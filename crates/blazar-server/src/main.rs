//! `blazar-server`: parses the configuration and runs the server, or an administration
//! command (`token`, `policy`, `reconcile`).

use std::io::IsTerminal;

use clap::Parser;

use blazar_server::config::{Cli, Command, Config, LogFormat};

/// jemalloc for the whole process, SQLite's page caches included (the crate's
/// `override_allocator_on_supported_platforms`): glibc's malloc gives each thread that
/// allocates an arena of its own and keeps in each what a burst freed there, which cost
/// tens of megabytes at a large site; the arenas are set in `.cargo/config.toml`.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
    let result = match command {
        Command::Serve => {
            // Colours only for a person at a terminal, not in files or journals.
            init_logs(&config, false);
            blazar_server::run(config).await
        }
        // Commands print their results on standard output; logs go to standard error.
        Command::Token(token) => {
            init_logs(&config, true);
            blazar_server::commands::token(&config, token, &mut std::io::stdout()).await
        }
        Command::Reconcile { apply, .. } => {
            init_logs(&config, true);
            blazar_server::commands::reconcile(&config, apply, &mut std::io::stdout()).await
        }
        Command::Policy(policy) => {
            init_logs(&config, true);
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

/// Installs the log subscriber: the configured filter and format, on standard output (the
/// server) or standard error (commands, whose results go to standard output). Text is
/// coloured only for a person at a terminal; JSON lines carry the fields of the spans they
/// happen in (`request.global_id`, ...), flattened into `span` and `spans`.
fn init_logs(config: &Config, to_stderr: bool) {
    // The AMQP library logs every dropped broker connection as an ERROR (three or four
    // lines, one saying recovery was abandoned while the publisher goes on retrying): the
    // publisher logs each failure itself, once, so the library is heard only when the
    // filter names it.
    let directives = if config.log.contains("lapin") {
        config.log.clone()
    } else {
        format!("{},lapin=off", config.log)
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,lapin=off"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match (config.log_format, to_stderr) {
        (LogFormat::Json, false) => logs.json().with_current_span(true).init(),
        (LogFormat::Json, true) => logs
            .json()
            .with_current_span(true)
            .with_writer(std::io::stderr)
            .init(),
        (LogFormat::Text, false) => logs.with_ansi(std::io::stdout().is_terminal()).init(),
        (LogFormat::Text, true) => logs
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .init(),
    }
}
