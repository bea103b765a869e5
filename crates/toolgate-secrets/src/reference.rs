//! Credentials held outside toolgate: an environment variable or a file, read at use.

use std::fmt;
use std::path::PathBuf;

use crate::error::SecretsError;

/// Where a referenced credential lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reference {
    /// An environment variable of the gateway process: `env:NAME`.
    Env(String),
    /// A file readable by the gateway: `file:/path`.
    File(PathBuf),
}

impl Reference {
    /// Parses `env:NAME` or `file:/absolute/path`. Secret-manager references
    /// (`aws-sm:`, `vault:`, `gcp-sm:`) are recognised and refused: not supported yet.
    pub fn parse(text: &str) -> Result<Reference, SecretsError> {
        let invalid = |reason: String| Err(SecretsError::InvalidReference(reason));
        let Some((kind, target)) = text.split_once(':') else {
            return invalid(format!("`{text}` must be `env:NAME` or `file:/path`"));
        };
        match kind {
            "env" => {
                let valid = !target.is_empty()
                    && target.len() <= 128
                    && target
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !target.starts_with(|c: char| c.is_ascii_digit());
                if valid {
                    Ok(Reference::Env(target.to_owned()))
                } else {
                    invalid(format!("`{target}` is not an environment variable name"))
                }
            }
            "file" => {
                let path = PathBuf::from(target);
                if path.is_absolute() {
                    Ok(Reference::File(path))
                } else {
                    invalid(format!(
                        "file references need an absolute path, got `{target}`"
                    ))
                }
            }
            "aws-sm" | "vault" | "gcp-sm" | "azure-kv" => invalid(format!(
                "`{kind}:` secret-manager references are not supported yet; use env: or file:"
            )),
            other => invalid(format!(
                "unknown reference kind `{other}:`; use env: or file:"
            )),
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reference::Env(name) => write!(f, "env:{name}"),
            Reference::File(path) => write!(f, "file:{}", path.display()),
        }
    }
}

/// Reads what references point at. Injected so the library itself never touches the process
/// environment or the file system directly, and tests can supply their own.
pub trait Environment: Send + Sync + fmt::Debug + 'static {
    /// The value of an environment variable.
    fn var(&self, name: &str) -> Option<String>;
    /// The contents of a file.
    fn read_file(&self, path: &std::path::Path) -> std::io::Result<String>;
}

/// The gateway process's real environment and file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn read_file(&self, path: &std::path::Path) -> std::io::Result<String> {
        std::fs::read_to_string(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_or_say_why_not() {
        assert_eq!(
            Reference::parse("env:SLACK_TOKEN").unwrap(),
            Reference::Env("SLACK_TOKEN".into())
        );
        assert_eq!(
            Reference::parse("file:/run/secrets/x").unwrap().to_string(),
            "file:/run/secrets/x"
        );
        let cases = [
            ("SLACK_TOKEN", "env:NAME"),
            ("env:", "not an environment variable"),
            ("env:1BAD", "not an environment variable"),
            ("env:BAD-NAME", "not an environment variable"),
            ("file:relative/path", "absolute"),
            ("aws-sm:arn:aws:secretsmanager:x", "not supported yet"),
            ("ftp:x", "unknown reference kind"),
        ];
        for (text, fragment) in cases {
            let err = Reference::parse(text).unwrap_err().to_string();
            assert!(err.contains(fragment), "{text}: {err}");
        }
    }
}
