//! The administration commands of the binary: `token create|list|revoke`, `policy show` and
//! `reconcile`.

use std::io::Write;

use blazar_service::{Store, StoreOptions};
use chrono::Utc;

use crate::config::{Config, PolicyCommand, TokenCommand};
use crate::policy::Policy;
use crate::tokens::{self, NewToken};

async fn open_store(config: &Config) -> anyhow::Result<Store> {
    Store::connect(&StoreOptions {
        url: config.database_url.clone(),
        max_connections: 2,
        sqlite_sync: config.sqlite_sync(),
    })
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "cannot open database {}: {e}",
            crate::redact(&config.database_url)
        )
    })
}

fn time(t: chrono::DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// Runs a `token` command, writing its result to `out`.
pub async fn token(
    config: &Config,
    command: TokenCommand,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let store = open_store(config).await?;
    let now = Utc::now();
    let result = match command {
        TokenCommand::Create {
            project,
            roles,
            user,
            expires_in,
            description,
        } => {
            let expires_at = expires_in
                .as_deref()
                .map(tokens::parse_duration)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--expires-in {e}"))?
                .map(|d| {
                    now.checked_add_signed(d)
                        .ok_or_else(|| anyhow::anyhow!("--expires-in is too long"))
                })
                .transpose()?;
            let issued = tokens::issue(
                &store,
                NewToken {
                    project_id: project,
                    user_id: user,
                    roles,
                    description,
                    expires_at,
                },
                now,
            )
            .await?;
            // The token alone on standard output, so scripts can capture it; the rest on
            // standard error, for the person.
            writeln!(out, "{}", issued.token)?;
            eprintln!(
                "Created token {} for user {} in project {} with roles {}{}. It is shown only \
                 this once; blazar-server keeps only its digest.",
                issued.row.id,
                issued.row.user_id,
                issued.row.project_id,
                issued.row.roles.join(","),
                issued
                    .row
                    .expires_at
                    .map(|t| format!(", expiring {} UTC", time(t)))
                    .unwrap_or_default()
            );
            if config.auth != crate::config::AuthMode::Tokens {
                eprintln!(
                    "Note: tokens are checked only when the server runs with --auth tokens \
                     (it is configured with {:?} here).",
                    config.auth
                );
            }
            Ok(())
        }
        TokenCommand::List => {
            let rows = tokens::list(&store).await?;
            let mut table = vec![[
                "ID".to_string(),
                "USER".into(),
                "PROJECT".into(),
                "ROLES".into(),
                "CREATED".into(),
                "EXPIRES".into(),
                "STATUS".into(),
                "DESCRIPTION".into(),
            ]];
            for row in &rows {
                table.push([
                    row.id.clone(),
                    row.user_id.clone(),
                    row.project_id.clone(),
                    row.roles.join(","),
                    time(row.created_at),
                    row.expires_at.map(time).unwrap_or_else(|| "never".into()),
                    tokens::status(row, now).to_string(),
                    row.description.clone(),
                ]);
            }
            let widths: Vec<usize> = (0..8)
                .map(|i| {
                    table
                        .iter()
                        .map(|r| r[i].chars().count())
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            for row in &table {
                let line: Vec<String> = row
                    .iter()
                    .zip(&widths)
                    .map(|(cell, w)| format!("{cell:<w$}"))
                    .collect();
                writeln!(out, "{}", line.join("  ").trim_end())?;
            }
            Ok(())
        }
        TokenCommand::Revoke { id } => {
            if tokens::revoke(&store, &id, now).await? {
                let shown = tokens::split(&id).map_or(id.as_str(), |(id, _)| id);
                writeln!(out, "Revoked token {shown}")?;
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "no active token has id {}",
                    tokens::split(&id).map_or(id.as_str(), |(id, _)| id)
                ))
            }
        }
    };
    store.close().await;
    result
}

/// Runs a `policy` command.
pub fn policy(config: &Config, command: PolicyCommand, out: &mut impl Write) -> anyhow::Result<()> {
    match command {
        PolicyCommand::Show => {
            let policy = Policy::load(config.policy_file.as_deref())?;
            write!(out, "{}", policy.render())?;
            Ok(())
        }
    }
}

/// Runs one reconciler pass with the configured backend, printing each difference found
/// (repaired with `apply`) and each repair that failed. Exit status 0 whether or not there
/// was drift; an error if a repair failed.
pub async fn reconcile(config: &Config, apply: bool, out: &mut impl Write) -> anyhow::Result<()> {
    let state = crate::build_state(config).await?;
    let report = state
        .service
        .reconcile(apply)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for line in &report.repairs {
        let kind = if report.left.contains(line) {
            "left: "
        } else if apply {
            "repaired: "
        } else {
            "drift: "
        };
        writeln!(out, "{kind}{line}")?;
    }
    writeln!(
        out,
        "{} difference(s){}",
        report.changes().count(),
        if apply {
            ", repaired"
        } else {
            " (dry run; --apply repairs them)"
        }
    )?;
    for line in &report.failed {
        writeln!(out, "failed: {line}")?;
    }
    state.service.store().close().await;
    if !report.failed.is_empty() {
        anyhow::bail!("{} repair(s) failed", report.failed.len());
    }
    Ok(())
}
