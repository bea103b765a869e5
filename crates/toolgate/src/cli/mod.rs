//! The command-line client: how the `admin`, `secrets`, `approvals` and `call` commands reach
//! the gateway with a token of their own role, and the exit codes every command shares.

mod admin;
mod approvals;
mod call;
mod ledger;
mod output;
mod secrets;
mod tls;
mod tools;

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub(crate) use admin::{AdminCommand, admin};
pub(crate) use approvals::{ApprovalsCommand, approvals};
pub(crate) use call::{CallArgs, call};
pub(crate) use ledger::{LedgerCommand, ledger};
pub(crate) use secrets::{SecretsCommand, secrets};
pub(crate) use tools::tools;

/// Where the gateway is and how to authenticate. Each command uses a token of its own role and
/// never another role's: `TOOLGATE_AGENT_TOKEN` for `call`, `TOOLGATE_APPROVER_TOKEN` for
/// `approvals`, and for `admin` and `secrets` the admin token file the gateway writes on first
/// start (or `TOOLGATE_ADMIN_TOKEN`). Tokens never come from the command line (it shows in
/// process listings): from those variables or `--token-file`.
#[derive(Debug, Args)]
pub(crate) struct Connection {
    /// The gateway's address: `http://` (plaintext) or `https://` (TLS). A gateway that is
    /// still starting is waited for up to 10 s.
    #[arg(long, env = "TOOLGATE_ADDR", default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// For an https:// address: the CA certificate(s) (PEM) to check the gateway's
    /// certificate against, instead of the system's.
    #[arg(long, env = "TOOLGATE_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// For a gateway that requires client certificates (mTLS): this client's certificate
    /// (PEM), with --key-file.
    #[arg(long, env = "TOOLGATE_CLIENT_CERT_FILE")]
    cert_file: Option<PathBuf>,
    /// The private key (PEM) of --cert-file.
    #[arg(long, env = "TOOLGATE_CLIENT_KEY_FILE")]
    key_file: Option<PathBuf>,
    /// A file holding the token, instead of the role's variable (admin commands: instead of
    /// TOOLGATE_ADMIN_TOKEN and ./toolgate-admin.token).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

/// The role of a token: the one a command needs, and the one `admin tokens create --role`
/// issues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum TokenRole {
    Agent,
    Approver,
    Admin,
}

/// A channel to the gateway that sends the bearer token with every request.
pub(crate) type Authed = InterceptedService<Channel, Bearer>;

/// Puts `authorization: Bearer <token>` on every request.
#[derive(Clone, Debug)]
pub(crate) struct Bearer(MetadataValue<Ascii>);

/// The exit codes, shown in `toolgate --help` and the README.
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0  done: the command did what it says (a call that succeeded, an approval that executed a
     call that succeeded, a rejection or continue applied, a ledger whose chains verify)
  1  error: the command could not be done (gateway unreachable, request refused, no token,
     bad input, an invalid policy file)
  2  usage: the command line is wrong
  3  the tool call did not succeed (refused, failed, timed out, outcome unknown)
  4  the tool call waits for an approver's decision
  5  the decision was not applied (another decision came first, a policy denial cannot be
     approved, or tool calling is disabled so an approval executes nothing)
  6  the ledger's audit chains do not verify";

/// `toolgate call`: the call did not succeed.
const EXIT_CALL_NOT_SUCCEEDED: u8 = 3;
/// `toolgate call`: the call waits for approval.
const EXIT_WAITING_APPROVAL: u8 = 4;
/// `toolgate approvals`: the decision did not apply.
const EXIT_NOT_DECIDED: u8 = 5;
/// `ledger verify`, `admin verify-ledger`: tampering found.
const EXIT_CHAIN_BROKEN: u8 = 6;

/// Where the admin token is when nothing else is said: the file the gateway writes on first
/// start in its working directory.
const DEFAULT_ADMIN_TOKEN_FILE: &str = "toolgate-admin.token";

/// How long a command waits for a gateway that refuses connections (one still starting).
const CONNECT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

impl TokenRole {
    /// The role as the gateway and the tokens' prefixes spell it.
    fn name(self) -> &'static str {
        match self {
            TokenRole::Agent => "agent",
            TokenRole::Approver => "approver",
            TokenRole::Admin => "admin",
        }
    }

    /// The variable holding this role's token.
    fn variable(self) -> &'static str {
        match self {
            TokenRole::Agent => "TOOLGATE_AGENT_TOKEN",
            TokenRole::Approver => "TOOLGATE_APPROVER_TOKEN",
            TokenRole::Admin => "TOOLGATE_ADMIN_TOKEN",
        }
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

impl Connection {
    /// A channel to the gateway carrying a token of `role`.
    async fn connect(&self, role: TokenRole) -> anyhow::Result<Authed> {
        // A token that comes from the environment or a named file is checked before anything
        // is sent; the admin token file may appear only once a starting gateway listens.
        let early = match (role, &self.token_file) {
            (TokenRole::Admin, None) if std::env::var_os(role.variable()).is_none() => None,
            _ => Some(self.token(role)?),
        };
        let endpoint = Channel::from_shared(self.addr.clone())
            .with_context(|| format!("invalid address `{}`", self.addr))?;
        let tls = self.tls_connector()?;
        let started = std::time::Instant::now();
        let channel = loop {
            let connected = match &tls {
                Some(connector) => endpoint.connect_with_connector(connector.clone()).await,
                None => endpoint.connect().await,
            };
            match connected {
                Ok(channel) => break channel,
                Err(error) if refused(&error) && started.elapsed() < CONNECT_PATIENCE => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(error) => {
                    return Err(anyhow::Error::new(error).context(format!(
                        "cannot reach the gateway at {} (is `toolgate serve` running there?)",
                        self.addr
                    )));
                }
            }
        };
        let token = match early {
            Some(token) => token,
            None => self.token(role)?,
        };
        let header: MetadataValue<Ascii> = format!("Bearer {token}")
            .parse()
            .context("the token contains characters not allowed in a header")?;
        Ok(InterceptedService::new(channel, Bearer(header)))
    }

    /// The TLS connector for an `https://` address; `None` for `http://`, where TLS files
    /// would be ignored and so are refused.
    fn tls_connector(&self) -> anyhow::Result<Option<tls::TlsConnector>> {
        let files = tls::ClientFiles {
            ca_file: self.ca_file.as_deref(),
            cert_file: self.cert_file.as_deref(),
            key_file: self.key_file.as_deref(),
        };
        if self.addr.starts_with("https://") {
            return Ok(Some(tls::TlsConnector::new(files)?));
        }
        if files.ca_file.is_some() || files.cert_file.is_some() || files.key_file.is_some() {
            bail!(
                "--ca-file, --cert-file and --key-file (TOOLGATE_CA_FILE, TOOLGATE_CLIENT_CERT_FILE, TOOLGATE_CLIENT_KEY_FILE) apply to an https:// address; {} is plaintext",
                self.addr
            );
        }
        Ok(None)
    }

    /// The token for `role`: `--token-file`, else the role's variable, else (admin only) the
    /// gateway's admin token file. Never another role's token.
    fn token(&self, role: TokenRole) -> anyhow::Result<String> {
        let variable = role.variable();
        let (token, source) = if let Some(file) = &self.token_file {
            (
                read_token_file(file)?,
                format!("--token-file {}", file.display()),
            )
        } else if let Some(value) = std::env::var(variable)
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            (value.trim().to_owned(), variable.to_owned())
        } else if role == TokenRole::Admin {
            let file = PathBuf::from(DEFAULT_ADMIN_TOKEN_FILE);
            let token = read_token_file(&file).with_context(|| {
                format!(
                    "no admin token: set {variable} or pass --token-file (the gateway writes {} in its working directory on first start)",
                    file.display()
                )
            })?;
            (token, file.display().to_string())
        } else {
            let legacy = if std::env::var_os("TOOLGATE_TOKEN").is_some() {
                " (TOOLGATE_TOKEN is not read: each command takes the token of its own role)"
            } else {
                ""
            };
            bail!(
                "no {role} token: set {variable} to the token `toolgate admin tokens create --role {role} --tenant TENANT` printed, or pass --token-file{legacy}",
                role = role.name()
            );
        };
        // Tokens name their role (`tg_<role>_...`): refuse to send another role's.
        let held = TokenRole::value_variants()
            .iter()
            .find(|held| token.starts_with(&format!("tg_{}_", held.name())));
        if let Some(held) = held
            && *held != role
        {
            bail!(
                "{source} holds an {} token, but this command needs an {} token",
                held.name(),
                role.name()
            );
        }
        Ok(token)
    }
}

fn read_token_file(path: &std::path::Path) -> anyhow::Result<String> {
    toolgate_server::files::refuse_shared_file(path, "token file")?;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        bail!("the token file {} is empty", path.display());
    }
    Ok(token.to_owned())
}

/// Whether connecting failed because nothing listens (yet) at the address.
fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        current = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use toolgate_proto::v1 as pb;

    use super::*;

    #[test]
    fn exit_codes_mean_what_they_say() {
        use pb::ToolCallStatus as Status;
        let calls = [
            (Status::Succeeded, 0),
            (Status::WaitingApproval, EXIT_WAITING_APPROVAL),
            (Status::Failed, EXIT_CALL_NOT_SUCCEEDED),
            (Status::Blocked, EXIT_CALL_NOT_SUCCEEDED),
            (Status::TimedOut, EXIT_CALL_NOT_SUCCEEDED),
            (Status::OutcomeUnknown, EXIT_CALL_NOT_SUCCEEDED),
            (Status::Unspecified, EXIT_CALL_NOT_SUCCEEDED),
        ];
        for (status, code) in calls {
            assert_eq!(call::call_exit_code(status), code, "{status:?}");
        }
        use pb::ResumeOutcome as Outcome;
        let decisions = [
            (Outcome::Executed, Some(Status::Succeeded), 0),
            (
                Outcome::Executed,
                Some(Status::Failed),
                EXIT_CALL_NOT_SUCCEEDED,
            ),
            (Outcome::Rejected, None, 0),
            (Outcome::Continued, None, 0),
            (Outcome::ClaimLost, None, EXIT_NOT_DECIDED),
            (Outcome::PolicyDenialTerminal, None, EXIT_NOT_DECIDED),
            (Outcome::FeatureDisabled, None, EXIT_NOT_DECIDED),
            (Outcome::Unspecified, None, EXIT_NOT_DECIDED),
        ];
        for (outcome, status, code) in decisions {
            assert_eq!(
                approvals::resume_exit_code(outcome, status),
                code,
                "{outcome:?}"
            );
        }
        // Usage errors are clap's 2; none of ours collides with it or with 1.
        for code in [
            EXIT_CALL_NOT_SUCCEEDED,
            EXIT_WAITING_APPROVAL,
            EXIT_NOT_DECIDED,
            EXIT_CHAIN_BROKEN,
        ] {
            assert!(code > 2, "{code}");
            assert!(
                EXIT_CODES.contains(&format!("  {code}  ")),
                "{code} is documented"
            );
        }
    }
}
