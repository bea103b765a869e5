//! `aws.iam_audit`: users, MFA, access keys, the root user, the password policy.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_smithy_types::error::metadata::ProvideErrorMetadata as _;
use serde_json::{Value, json};
use toolgate_core::ToolError;

use crate::errors::{Operation, sdk_error};
use crate::session::Session;
use crate::tools::{Capped, bounded, finding, invalid, limit, page_size, time};

/// One access key, as the audit sees it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Key {
    pub(crate) id: String,
    pub(crate) active: bool,
    /// Seconds since the epoch.
    pub(crate) created: Option<i64>,
    pub(crate) last_used: Option<i64>,
}

/// One user.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) console_password: bool,
    pub(crate) mfa_devices: usize,
    pub(crate) keys: Vec<Key>,
}

const DAY: i64 = 86_400;

/// The findings for one user at `now` (seconds since the epoch).
pub(crate) fn user_findings(user: &User, max_age_days: i64, now: i64) -> Vec<Value> {
    let mut findings = Vec::new();
    if user.mfa_devices == 0 {
        let (severity, detail) = if user.console_password {
            (
                "high",
                "user can sign in to the console with a password and has no MFA device",
            )
        } else {
            ("medium", "user has no MFA device")
        };
        findings.push(finding(
            "user_without_mfa",
            severity,
            &user.name,
            None,
            detail.to_owned(),
        ));
    }
    for key in user.keys.iter().filter(|k| k.active) {
        let age_days = key.created.map(|c| (now - c) / DAY);
        if let Some(age) = age_days.filter(|a| *a > max_age_days) {
            findings.push(finding(
                "access_key_too_old",
                "medium",
                &user.name,
                None,
                format!(
                    "active access key {} is {age} days old (over {max_age_days}); rotate it",
                    key.id
                ),
            ));
        }
        match key.last_used {
            Some(used) if (now - used) / DAY > max_age_days => {
                findings.push(finding("access_key_unused", "medium", &user.name, None, format!("active access key {} was last used {} days ago; deactivate it if no longer needed", key.id, (now - used) / DAY)));
            }
            None if age_days.is_some_and(|a| a > max_age_days) => {
                findings.push(finding(
                    "access_key_never_used",
                    "medium",
                    &user.name,
                    None,
                    format!(
                        "active access key {} was never used in {} days; deactivate it",
                        key.id,
                        age_days.unwrap_or(0)
                    ),
                ));
            }
            _ => {}
        }
    }
    findings
}

fn seconds(t: Option<&aws_smithy_types::DateTime>) -> Option<i64> {
    t.map(aws_smithy_types::DateTime::secs)
}

fn now_secs() -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(now.as_secs()).unwrap_or(i64::MAX)
}

/// `aws.iam_audit`.
pub(crate) async fn iam_audit(session: &Session, arguments: &Value) -> Result<Value, ToolError> {
    let limit = limit(arguments, 100, super::MAX_LIMIT)?;
    let max_age_days = match arguments.get("max_key_age_days") {
        None | Some(Value::Null) => 90,
        Some(value) => match value.as_i64() {
            Some(n) if (1..=3650).contains(&n) => n,
            _ => {
                return Err(invalid(
                    "`max_key_age_days` must be an integer from 1 to 3650",
                ));
            }
        },
    };
    let iam = session.iam()?;
    let list_users = Operation {
        action: "iam:ListUsers",
    };
    let mut users = Capped::new(limit);
    let mut pages = iam
        .list_users()
        .into_paginator()
        .page_size(page_size(session, limit, 1, 1000))
        .send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| sdk_error(list_users, &e))?;
        let more = page.is_truncated();
        let names: Vec<(String, Value, Value)> = page
            .users()
            .iter()
            .map(|u| {
                (
                    u.user_name().to_owned(),
                    time(Some(u.create_date())),
                    time(u.password_last_used()),
                )
            })
            .collect();
        if users.extend(names, more) {
            break;
        }
    }
    let truncated = users.truncated;
    let concurrency = session.config().max_concurrency;
    let details = bounded(
        concurrency,
        users.items,
        |(name, created, password_last_used)| {
            let iam = iam.clone();
            async move {
                let user = describe_user(&iam, &name).await?;
                Ok::<_, ToolError>((user, created, password_last_used))
            }
        },
    )
    .await;
    let now = now_secs();
    let mut items = Vec::new();
    let mut findings = Vec::new();
    for detail in details {
        let (user, created, password_last_used) = detail?;
        findings.extend(user_findings(&user, max_age_days, now));
        items.push(json!({
            "user_name": user.name,
            "created": created,
            "console_password": user.console_password,
            "password_last_used": password_last_used,
            "mfa_devices": user.mfa_devices,
            "access_keys": user.keys.iter().map(|k| json!({
                "access_key_id": k.id,
                "status": if k.active { "Active" } else { "Inactive" },
                "age_days": k.created.map(|c| (now - c) / DAY),
                "last_used_days_ago": k.last_used.map(|u| (now - u) / DAY),
            })).collect::<Vec<_>>(),
        }));
    }
    let summary_op = Operation {
        action: "iam:GetAccountSummary",
    };
    let summary = iam
        .get_account_summary()
        .send()
        .await
        .map_err(|e| sdk_error(summary_op, &e))?;
    let map = summary.summary_map();
    let count =
        |key: &str| map.and_then(|m| m.iter().find(|(k, _)| k.as_str() == key).map(|(_, v)| *v));
    let root_keys = count("AccountAccessKeysPresent").unwrap_or(0);
    let root_mfa = count("AccountMFAEnabled").unwrap_or(0);
    if root_keys > 0 {
        findings.push(finding(
            "root_access_key",
            "high",
            "root",
            None,
            "the root user has an access key; delete it and use IAM roles or users".to_owned(),
        ));
    }
    if root_mfa == 0 {
        findings.push(finding(
            "root_without_mfa",
            "high",
            "root",
            None,
            "the root user has no MFA device".to_owned(),
        ));
    }
    let policy_op = Operation {
        action: "iam:GetAccountPasswordPolicy",
    };
    let password_policy = match iam.get_account_password_policy().send().await {
        Ok(output) => output.password_policy().map(|p| {
            json!({
                "minimum_length": p.minimum_password_length(),
                "require_symbols": p.require_symbols(),
                "require_numbers": p.require_numbers(),
                "require_uppercase": p.require_uppercase_characters(),
                "require_lowercase": p.require_lowercase_characters(),
                "max_age_days": p.max_password_age(),
                "reuse_prevention": p.password_reuse_prevention(),
            })
        }),
        Err(e) if e.code() == Some("NoSuchEntity") => None,
        Err(e) => return Err(sdk_error(policy_op, &e)),
    };
    if password_policy.is_none() {
        findings.push(finding(
            "no_password_policy",
            "medium",
            "account",
            None,
            "the account has no password policy: console passwords may be short and never expire"
                .to_owned(),
        ));
    }
    Ok(json!({
        "count": items.len(),
        "truncated": truncated,
        "users_without_mfa": items.iter().filter(|u| u["mfa_devices"] == 0).count(),
        "root": {"access_keys_present": root_keys > 0, "mfa_enabled": root_mfa > 0},
        "password_policy": password_policy,
        "max_key_age_days": max_age_days,
        "findings": findings,
        "items": items,
    }))
}

async fn describe_user(iam: &aws_sdk_iam::Client, name: &str) -> Result<User, ToolError> {
    let keys_op = Operation {
        action: "iam:ListAccessKeys",
    };
    let mfa_op = Operation {
        action: "iam:ListMFADevices",
    };
    let login_op = Operation {
        action: "iam:GetLoginProfile",
    };
    let used_op = Operation {
        action: "iam:GetAccessKeyLastUsed",
    };
    // A user has at most two access keys; MFA devices are only counted.
    let keys = iam
        .list_access_keys()
        .user_name(name)
        .send()
        .await
        .map_err(|e| sdk_error(keys_op, &e))?;
    let mfa = iam
        .list_mfa_devices()
        .user_name(name)
        .send()
        .await
        .map_err(|e| sdk_error(mfa_op, &e))?;
    let console_password = match iam.get_login_profile().user_name(name).send().await {
        Ok(_) => true,
        Err(e) if e.code() == Some("NoSuchEntity") => false,
        Err(e) => return Err(sdk_error(login_op, &e)),
    };
    let mut audited = Vec::new();
    for key in keys.access_key_metadata() {
        let Some(id) = key.access_key_id() else {
            continue;
        };
        let used = iam
            .get_access_key_last_used()
            .access_key_id(id)
            .send()
            .await
            .map_err(|e| sdk_error(used_op, &e))?;
        audited.push(Key {
            id: id.to_owned(),
            active: key.status().is_some_and(|s| s.as_str() == "Active"),
            created: seconds(key.create_date()),
            last_used: seconds(used.access_key_last_used().and_then(|u| u.last_used_date())),
        });
    }
    Ok(User {
        name: name.to_owned(),
        console_password,
        mfa_devices: mfa.mfa_devices().len(),
        keys: audited,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn key(age_days: i64, used_days_ago: Option<i64>, active: bool) -> Key {
        Key {
            id: "AKIAEXAMPLEKEY000001".into(),
            active,
            created: Some(NOW - age_days * DAY),
            last_used: used_days_ago.map(|d| NOW - d * DAY),
        }
    }

    fn kinds(user: &User) -> Vec<String> {
        user_findings(user, 90, NOW)
            .iter()
            .map(|f| {
                format!(
                    "{}:{}",
                    f["kind"].as_str().unwrap(),
                    f["severity"].as_str().unwrap()
                )
            })
            .collect()
    }

    #[test]
    fn user_findings_follow_the_rules() {
        let cases: Vec<(User, Vec<&str>)> = vec![
            (
                User {
                    name: "ok".into(),
                    console_password: true,
                    mfa_devices: 1,
                    keys: vec![key(10, Some(1), true)],
                },
                vec![],
            ),
            (
                User {
                    name: "console".into(),
                    console_password: true,
                    mfa_devices: 0,
                    keys: vec![],
                },
                vec!["user_without_mfa:high"],
            ),
            (
                User {
                    name: "api".into(),
                    console_password: false,
                    mfa_devices: 0,
                    keys: vec![key(5, None, true)],
                },
                vec!["user_without_mfa:medium"],
            ),
            (
                User {
                    name: "old".into(),
                    console_password: false,
                    mfa_devices: 1,
                    keys: vec![key(200, Some(2), true)],
                },
                vec!["access_key_too_old:medium"],
            ),
            (
                User {
                    name: "idle".into(),
                    console_password: false,
                    mfa_devices: 1,
                    keys: vec![key(120, Some(100), true)],
                },
                vec!["access_key_too_old:medium", "access_key_unused:medium"],
            ),
            (
                User {
                    name: "never".into(),
                    console_password: false,
                    mfa_devices: 1,
                    keys: vec![key(95, None, true)],
                },
                vec!["access_key_too_old:medium", "access_key_never_used:medium"],
            ),
            (
                User {
                    name: "inactive".into(),
                    console_password: false,
                    mfa_devices: 1,
                    keys: vec![key(400, None, false)],
                },
                vec![],
            ),
        ];
        for (user, expected) in cases {
            assert_eq!(kinds(&user), expected, "{}", user.name);
        }
    }
}
