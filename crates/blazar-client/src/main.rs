//! `blazar`: the command-line client for Blazar reservation services, command for command
//! and byte for byte compatible with python-blazarclient's `blazar`, plus waiting, relative
//! dates and local times.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ERROR: cannot start the I/O runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    ExitCode::from(runtime.block_on(cli::main()))
}
