//! `toolgate secrets`: tenant credentials and the master keys that seal them, on a running
//! gateway.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use serde_json::json;
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::admin_service_client::AdminServiceClient;

use super::output::{message_json, print_json, print_message};
use super::{Connection, TokenRole};

/// `toolgate secrets` subcommands. Values are read from standard input or a file, never from
/// the command line (it shows in process listings and shell history).
#[derive(Debug, Subcommand)]
pub(crate) enum SecretsCommand {
    /// Seals and stores a credential; the value comes from --file or standard input.
    Put {
        tenant: String,
        name: String,
        /// Read the value from this file instead of standard input.
        #[arg(long)]
        file: Option<PathBuf>,
        /// A JSON object describing the credential.
        #[arg(long)]
        metadata: Option<String>,
        #[arg(long)]
        notes: Option<String>,
    },
    /// Stores a reference read at use: `env:NAME` or `file:/absolute/path`.
    Ref {
        tenant: String,
        name: String,
        reference: String,
        /// A JSON object describing the credential.
        #[arg(long)]
        metadata: Option<String>,
        #[arg(long)]
        notes: Option<String>,
    },
    /// Lists a tenant's credentials (never their values).
    List { tenant: String },
    /// Deletes a credential.
    Delete { tenant: String, name: String },
    /// Adds a new master key and makes it the one that seals.
    RotateKey,
    /// Re-seals every credential under the active master key.
    Rewrap,
    /// Removes an old master key (refused while a credential needs it).
    RetireKey { key_id: String },
}

/// Runs a secrets subcommand.
pub(crate) async fn secrets(conn: Connection, command: SecretsCommand) -> anyhow::Result<ExitCode> {
    let mut client = AdminServiceClient::new(conn.connect(TokenRole::Admin).await?);
    match command {
        SecretsCommand::Put {
            tenant,
            name,
            file,
            metadata,
            notes,
        } => {
            let request = pb::PutSecretRequest {
                tenant_id: tenant,
                name,
                value: read_secret_value(file.as_deref())?,
                metadata_json: metadata.unwrap_or_default(),
                notes: notes.unwrap_or_default(),
            };
            print_message(&client.put_secret(request).await?.into_inner())?;
        }
        SecretsCommand::Ref {
            tenant,
            name,
            reference,
            metadata,
            notes,
        } => {
            let request = pb::PutSecretReferenceRequest {
                tenant_id: tenant,
                name,
                reference,
                metadata_json: metadata.unwrap_or_default(),
                notes: notes.unwrap_or_default(),
            };
            print_message(&client.put_secret_reference(request).await?.into_inner())?;
        }
        SecretsCommand::List { tenant } => {
            let request = pb::ListSecretsRequest { tenant_id: tenant };
            print_message(&client.list_secrets(request).await?.into_inner().secrets)?;
        }
        SecretsCommand::Delete { tenant, name } => {
            let request = pb::DeleteSecretRequest {
                tenant_id: tenant,
                name: name.clone(),
            };
            client.delete_secret(request).await?;
            print_json(&json!({"deleted": name}));
        }
        SecretsCommand::RotateKey => {
            let ring = client.rotate_key(pb::RotateKeyRequest {}).await?;
            let mut printed = message_json(&ring.into_inner())?;
            printed["next"] = json!("run `toolgate secrets rewrap`, then retire the old key");
            print_json(&printed);
        }
        SecretsCommand::Rewrap => {
            let rewrapped = client.rewrap_secrets(pb::RewrapSecretsRequest {}).await?;
            print_message(&rewrapped.into_inner())?;
        }
        SecretsCommand::RetireKey { key_id } => {
            let request = pb::RetireKeyRequest { key_id };
            print_message(&client.retire_key(request).await?.into_inner())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A secret value from a file or standard input, without one trailing newline.
fn read_secret_value(file: Option<&std::path::Path>) -> anyhow::Result<String> {
    use std::io::Read as _;
    let mut value = String::new();
    match file {
        Some(path) => {
            value = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
        }
        None => {
            std::io::stdin()
                .read_to_string(&mut value)
                .context("cannot read the value from standard input")?;
        }
    }
    let trimmed = value.strip_suffix('\n').unwrap_or(&value);
    let trimmed = trimmed.strip_suffix('\r').unwrap_or(trimmed);
    if trimmed.is_empty() {
        bail!("the secret value is empty: pipe it on standard input or pass --file");
    }
    Ok(trimmed.to_owned())
}
