//! `toolgate ledger`: verifies a ledger database and writes checkpoints of it, on the database
//! itself (no gateway needed; a SQLite file is opened read-only beside its owner).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::EXIT_CHAIN_BROKEN;
use super::output::{print_json, print_raw};

/// Ledger subcommands (work on the database directly, no server needed).
#[derive(Debug, Subcommand)]
pub(crate) enum LedgerCommand {
    /// Checks every audit chain (each tenant's and the system chain), the call, decision and
    /// pending-invocation rows its events bind, and optionally a checkpoint; reports the first
    /// problem and what could not be checked (without the master keys: the events' MACs).
    Verify {
        #[command(flatten)]
        ledger: LedgerArgs,
        /// A checkpoint written earlier by `ledger checkpoint`: truncation and rewinding show
        /// against it.
        #[arg(long)]
        checkpoint: Option<PathBuf>,
    },
    /// Verifies the ledger, then prints the head of every chain MAC'd with the master keys,
    /// to keep away from the database (for `ledger verify --checkpoint`).
    Checkpoint {
        #[command(flatten)]
        ledger: LedgerArgs,
        /// Write the checkpoint to this file (0600) instead of standard output.
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

/// Where the ledger and its keys are.
#[derive(Debug, Args)]
pub(crate) struct LedgerArgs {
    /// The ledger: a SQLite file or a postgres:// URL.
    #[arg(long, env = "TOOLGATE_DATABASE", default_value = "toolgate.db")]
    database: String,
    /// The PostgreSQL schema holding the ledger.
    #[arg(long, env = "TOOLGATE_DATABASE_SCHEMA")]
    schema: Option<String>,
    /// The master key file the gateway uses (TOOLGATE_MASTER_KEYS takes precedence); the
    /// audit chain's keys are derived from it. Never created by these commands.
    #[arg(long, env = "TOOLGATE_KEY_FILE", default_value = "toolgate-keys")]
    key_file: PathBuf,
}

impl LedgerArgs {
    /// The key ring, if one is configured.
    fn keys(&self) -> anyhow::Result<Option<Arc<dyn toolgate_core::AuditKeys>>> {
        let inline = std::env::var("TOOLGATE_MASTER_KEYS")
            .ok()
            .filter(|keys| !keys.trim().is_empty());
        let ring = toolgate_server::keys::read_key_ring(&self.key_file, inline.as_deref())?;
        Ok(ring.map(|ring| Arc::new(ring) as Arc<dyn toolgate_core::AuditKeys>))
    }

    /// The ledger, read-only (works beside the gateway that owns a SQLite file).
    async fn open(
        &self,
        keys: Option<Arc<dyn toolgate_core::AuditKeys>>,
    ) -> anyhow::Result<Arc<dyn toolgate_ledger::Store>> {
        let database =
            toolgate_server::storage::Database::parse(&self.database, self.schema.clone())
                .map_err(|message| anyhow::anyhow!(message))?;
        if let toolgate_server::storage::Database::Sqlite(path) = &database
            && !path.exists()
        {
            bail!("no ledger at {}", path.display());
        }
        database.open_for_reading(keys).await
    }
}

/// Runs a ledger subcommand.
pub(crate) async fn ledger(command: LedgerCommand) -> anyhow::Result<ExitCode> {
    match command {
        LedgerCommand::Verify { ledger, checkpoint } => {
            let keys = ledger.keys()?;
            let checkpoint = match &checkpoint {
                Some(path) => {
                    let text = std::fs::read_to_string(path).with_context(|| {
                        format!("cannot read the checkpoint {}", path.display())
                    })?;
                    let parsed = toolgate_ledger::Checkpoint::parse(&text)
                        .with_context(|| format!("checkpoint {}", path.display()))?;
                    let auth = parsed.authenticate(keys.as_deref());
                    if auth == toolgate_ledger::CheckpointAuth::Forged {
                        bail!(
                            "the checkpoint {} does not match its MAC: it was changed after it \
                             was written (or written with other keys); nothing was verified \
                             against it",
                            path.display()
                        );
                    }
                    Some((parsed, auth))
                }
                None => None,
            };
            let store = ledger.open(keys).await?;
            let report = store
                .verify_against(checkpoint.as_ref().map(|(parsed, _)| parsed))
                .await?;
            let ok = report.first_problem.is_none();
            print_json(&ledger_report_json(
                &report,
                checkpoint.as_ref().map(|(_, auth)| auth),
            ));
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_CHAIN_BROKEN)
            })
        }
        LedgerCommand::Checkpoint { ledger, output } => {
            let Some(keys) = ledger.keys()? else {
                bail!(
                    "no master keys: a checkpoint is MAC'd with the audit chain key, derived \
                     from the master key file ({}) or TOOLGATE_MASTER_KEYS",
                    ledger.key_file.display()
                );
            };
            let store = ledger.open(Some(Arc::clone(&keys))).await?;
            let report = store.verify_chains().await?;
            let now = toolgate_core::Clock::now(&toolgate_core::SystemClock).0;
            let checkpoint =
                match toolgate_ledger::Checkpoint::of_report(&report, keys.as_ref(), now) {
                    Ok(checkpoint) => checkpoint,
                    Err(error) => {
                        eprintln!("toolgate: {error}");
                        return Ok(ExitCode::from(EXIT_CHAIN_BROKEN));
                    }
                };
            let text = checkpoint.to_text();
            match output {
                Some(path) => {
                    toolgate_server::files::write_private_file(&path, &text).with_context(
                        || format!("cannot write the checkpoint {}", path.display()),
                    )?;
                }
                None => print_raw(&text),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `ledger verify`'s answer: the verdict, the counts, what was and was not checked, and the
/// first problem.
fn ledger_report_json(
    report: &toolgate_ledger::VerifyReport,
    checkpoint: Option<&toolgate_ledger::CheckpointAuth>,
) -> Value {
    let mut notes: Vec<String> = Vec::new();
    if !report.keys_loaded {
        notes.push(format!(
            "no master keys were given: the MACs of {} keyed events were not checked, so an \
             event edited by someone without the key goes unseen; links, order and the rows \
             the events bind were checked",
            report.keyed_events
        ));
    } else if !report.missing_keys.is_empty() {
        notes.push(format!(
            "{} keyed events are MAC'd with keys that are not loaded ({}): their MACs were not \
             checked",
            report.keyed_events - report.authenticated_events,
            report.missing_keys.join(", ")
        ));
    }
    if report.legacy_events > 0 {
        let protection = if report.unprotected_legacy_events > 0 {
            "nothing authenticates them (they were written without keys)"
        } else {
            "the keyed record taken when the keyed chain began authenticates them"
        };
        notes.push(format!(
            "{} legacy events carry the unkeyed hash of the format before the keyed chain: {}",
            report.legacy_events, protection
        ));
    }
    if report.legacy_rows > 0 {
        notes.push(format!(
            "{} call, decision or pending-invocation rows were recorded before the keyed chain \
             and are not bound to it",
            report.legacy_rows
        ));
    }
    match checkpoint {
        None => notes.push(
            "no checkpoint was given: removal of the newest events with the head rewound cannot \
             be ruled out (see `toolgate ledger checkpoint`)"
                .to_owned(),
        ),
        Some(toolgate_ledger::CheckpointAuth::Unverifiable) => notes.push(
            "the checkpoint's MAC was not checked (its key is not loaded): the chains were \
             compared with it as given"
                .to_owned(),
        ),
        Some(_) => {}
    }
    let mut value = json!({
        "ok": report.first_problem.is_none(),
        "events_checked": report.events_checked,
        "chains_checked": report.chains_checked,
        "keys_loaded": report.keys_loaded,
        "keyed_events": report.keyed_events,
        "authenticated_events": report.authenticated_events,
        "legacy_events": report.legacy_events,
        "missing_keys": report.missing_keys,
        "rows_checked": report.rows_checked,
        "legacy_rows": report.legacy_rows,
        "checkpoint": match checkpoint {
            None => Value::Null,
            Some(auth) => json!({
                "authenticated": *auth == toolgate_ledger::CheckpointAuth::Authentic,
                "chains": report.checkpoint_chains,
            }),
        },
        "not_checked": notes,
    });
    if let Some(problem) = &report.first_problem {
        value["problem"] = json!({
            "tenant_id": problem.chain.to_string(),
            "chain_seq": problem.chain_seq,
            "kind": problem.kind.as_str(),
            "detail": problem.detail,
        });
    }
    value
}
