//! The twelve tools: specs (`specs.rs`), shared argument handling and region fan-out (here),
//! and one module per AWS service family.

pub(crate) mod cloudtrail;
pub(crate) mod cost;
pub(crate) mod ec2;
pub(crate) mod iam;
pub(crate) mod rds;
pub(crate) mod s3;
pub(crate) mod specs;

use futures::StreamExt as _;
use serde_json::{Value, json};
use toolgate_core::{ErrorCode, ToolError};

use crate::regions::{MAX_REGIONS, check_region};
use crate::session::Session;

/// The most items one call returns.
pub const MAX_LIMIT: u64 = 1000;

/// An `INVALID_ARGUMENTS` answer; nothing was sent.
pub(crate) fn invalid(message: impl Into<String>) -> ToolError {
    ToolError::new(ErrorCode::InvalidArguments, message).with_attempts(0)
}

/// `limit`: 1..=max, default `default`.
pub(crate) fn limit(arguments: &Value, default: u64, max: u64) -> Result<usize, ToolError> {
    let value = match arguments.get("limit") {
        None | Some(Value::Null) => default,
        Some(value) => match value.as_u64() {
            Some(n) if (1..=max).contains(&n) => n,
            _ => {
                return Err(invalid(format!(
                    "`limit` must be an integer from 1 to {max}"
                )));
            }
        },
    };
    usize::try_from(value).map_err(|_| invalid("`limit` is too large"))
}

/// `regions`: a list of known region names without duplicates; default the tenant's region.
pub(crate) fn regions(arguments: &Value, session: &Session) -> Result<Vec<String>, ToolError> {
    let Some(value) = arguments.get("regions").filter(|v| !v.is_null()) else {
        return Ok(vec![session.home_region.clone()]);
    };
    let Some(list) = value.as_array() else {
        return Err(invalid(
            "`regions` must be a list of region names such as [\"us-east-1\", \"eu-west-1\"]",
        ));
    };
    if list.is_empty() || list.len() > MAX_REGIONS {
        return Err(invalid(format!(
            "`regions` must hold 1 to {MAX_REGIONS} region names"
        )));
    }
    let mut regions: Vec<String> = Vec::new();
    for entry in list {
        let Some(name) = entry.as_str() else {
            return Err(invalid("`regions` must hold strings such as \"us-east-1\""));
        };
        check_region(name).map_err(|e| invalid(format!("`regions`: {e}")))?;
        if regions.iter().any(|r| r == name) {
            return Err(invalid(format!("`regions` names `{name}` twice")));
        }
        regions.push(name.to_owned());
    }
    Ok(regions)
}

/// An optional non-empty string argument.
pub(crate) fn optional_string(
    arguments: &Value,
    name: &str,
    max: usize,
) -> Result<Option<String>, ToolError> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if !text.trim().is_empty() && text.chars().count() <= max => {
            Ok(Some(text.trim().to_owned()))
        }
        Some(_) => Err(invalid(format!(
            "`{name}` must be a non-empty string of at most {max} characters"
        ))),
    }
}

/// The page size for an operation accepting `min..=max` per page.
pub(crate) fn page_size(session: &Session, wanted: usize, min: i32, max: i32) -> i32 {
    let configured = i32::try_from(session.config().page_size).unwrap_or(max);
    let wanted = i32::try_from(wanted).unwrap_or(max);
    configured.min(wanted).clamp(min, max)
}

/// Items gathered up to a limit, remembering whether more exist.
#[derive(Debug)]
pub(crate) struct Capped<T> {
    pub(crate) items: Vec<T>,
    pub(crate) truncated: bool,
    limit: usize,
}

impl<T> Capped<T> {
    pub(crate) fn new(limit: usize) -> Capped<T> {
        Capped {
            items: Vec::new(),
            truncated: false,
            limit,
        }
    }

    /// Adds one page; `more_pages` says whether the service has a next page. Returns whether
    /// the limit is reached (stop paginating).
    pub(crate) fn extend(&mut self, page: impl IntoIterator<Item = T>, more_pages: bool) -> bool {
        for item in page {
            if self.items.len() == self.limit {
                self.truncated = true;
                return true;
            }
            self.items.push(item);
        }
        if self.items.len() == self.limit {
            self.truncated |= more_pages;
            return true;
        }
        false
    }
}

/// Runs `task` for every region, at most `max_concurrency` at once, in the call's deadline
/// (each SDK client carries it). Answers in the order of `regions`.
pub(crate) async fn fan_out<T, F, Fut>(
    session: &Session,
    regions: &[String],
    task: F,
) -> Vec<(String, Result<T, ToolError>)>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<T, ToolError>>,
{
    let concurrency = session.config().max_concurrency;
    let mut results: Vec<(usize, String, Result<T, ToolError>)> =
        futures::stream::iter(regions.iter().cloned().enumerate())
            .map(|(i, region)| {
                let future = task(region.clone());
                async move { (i, region, future.await) }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
    results.sort_by_key(|(i, _, _)| *i);
    results
        .into_iter()
        .map(|(_, region, result)| (region, result))
        .collect()
}

/// The regions that answered, with their answers, and the `region_errors` of the others.
pub(crate) type Settled<T> = (Vec<(String, T)>, Vec<Value>);

/// Splits per-region results into successes and `region_errors`. When every region failed,
/// the call fails with the first region's error (its message naming the region).
pub(crate) fn settle<T>(
    results: Vec<(String, Result<T, ToolError>)>,
) -> Result<Settled<T>, ToolError> {
    let mut ok = Vec::new();
    let mut errors = Vec::new();
    let mut first_error: Option<ToolError> = None;
    for (region, result) in results {
        match result {
            Ok(value) => ok.push((region, value)),
            Err(err) => {
                errors.push(
                    json!({"region": region, "code": err.code.as_str(), "message": err.message}),
                );
                if first_error.is_none() {
                    first_error = Some(ToolError {
                        message: format!("{region}: {}", err.message),
                        ..err
                    });
                }
            }
        }
    }
    match first_error {
        Some(err) if ok.is_empty() => Err(err),
        _ => Ok((ok, errors)),
    }
}

/// A finding: what is wrong, how bad, on which resource, and what to do.
pub(crate) fn finding(
    kind: &str,
    severity: &str,
    resource: &str,
    region: Option<&str>,
    detail: String,
) -> Value {
    json!({"kind": kind, "severity": severity, "resource": resource, "region": region, "detail": detail})
}

/// An SDK timestamp as RFC 3339.
pub(crate) fn time(value: Option<&aws_smithy_types::DateTime>) -> Value {
    value
        .and_then(|t| t.fmt(aws_smithy_types::date_time::Format::DateTime).ok())
        .map_or(Value::Null, Value::String)
}

/// Runs `f` over `items` with at most `concurrency` at once, keeping their order.
pub(crate) async fn bounded<I, T, F, Fut>(concurrency: usize, items: Vec<I>, f: F) -> Vec<T>
where
    F: Fn(I) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    futures::stream::iter(items)
        .map(f)
        .buffered(concurrency)
        .collect()
        .await
}
