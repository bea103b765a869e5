//! AWS failures as stable codes with sanitized, actionable messages. Every SDK error passes
//! through [`sdk_error`]; nothing here panics, and nothing repeats a credential.
//!
//! - throttling codes -> `VENDOR_RATE_LIMITED`;
//! - `AccessDenied*`, `UnauthorizedOperation`, `AuthFailure`, invalid or expired tokens ->
//!   `VENDOR_ERROR` naming the permission the operation needs;
//! - Compute Optimizer's `OptInRequiredException`, Cost Explorer's "not enabled" denial and
//!   EC2's `OptInRequired` for a region -> `VENDOR_ERROR` saying what the account has not
//!   enabled;
//! - timeouts -> `TIMEOUT`; dispatch failures and 5xx -> `VENDOR_ERROR` (retryable).

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use toolgate_core::{ErrorCode, ToolError};

/// One AWS operation, for messages: the IAM action it needs, e.g. `ec2:DescribeInstances`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operation {
    pub(crate) action: &'static str,
}

/// What went wrong, classified from the SDK's error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) code: Option<String>,
    pub(crate) message: Option<String>,
    pub(crate) status: Option<u16>,
    pub(crate) kind: FailureKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailureKind {
    Service,
    Timeout,
    Dispatch,
    Construction,
    Response,
}

/// Converts an SDK error of `operation` into the agent's answer.
pub(crate) fn sdk_error<E>(operation: Operation, err: &SdkError<E, HttpResponse>) -> ToolError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    classify(operation, &failure(err))
}

/// Extracts code, message and status from an SDK error.
pub(crate) fn failure<E>(err: &SdkError<E, HttpResponse>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let kind = match err {
        SdkError::ServiceError(_) => FailureKind::Service,
        SdkError::TimeoutError(_) => FailureKind::Timeout,
        SdkError::DispatchFailure(failure) if failure.is_timeout() => FailureKind::Timeout,
        SdkError::DispatchFailure(_) => FailureKind::Dispatch,
        SdkError::ConstructionFailure(_) => FailureKind::Construction,
        _ => FailureKind::Response,
    };
    Failure {
        code: err.code().map(str::to_owned),
        message: err.message().map(str::to_owned),
        status: err.raw_response().map(|r| r.status().as_u16()),
        kind,
    }
}

const THROTTLING: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "SlowDown",
    "PriorRequestNotComplete",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "EC2ThrottledException",
];

const CREDENTIAL_CODES: &[&str] = &[
    "AuthFailure",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
    "InvalidToken",
];

/// The decision table, kept apart from the SDK types so it is tested directly.
pub(crate) fn classify(operation: Operation, failure: &Failure) -> ToolError {
    let action = operation.action;
    let code = failure.code.as_deref().unwrap_or("");
    let aws_message = failure.message.as_deref().map(sanitize).unwrap_or_default();
    let said = if aws_message.is_empty() {
        String::new()
    } else {
        format!(" (AWS said: {aws_message})")
    };
    match failure.kind {
        FailureKind::Timeout => {
            return ToolError::new(
                ErrorCode::Timeout,
                format!(
                    "{action} did not answer within the call's deadline; try again, or with fewer regions or a smaller limit"
                ),
            );
        }
        FailureKind::Dispatch => {
            return ToolError::new(
                ErrorCode::VendorError,
                format!(
                    "{action} could not reach AWS (connection or TLS failure); this is usually transient, try again"
                ),
            );
        }
        FailureKind::Construction => {
            return ToolError::new(
                ErrorCode::Internal,
                format!("{action} could not be built as a request; this is a connector fault"),
            );
        }
        FailureKind::Service | FailureKind::Response => {}
    }
    if THROTTLING.contains(&code) || failure.status == Some(429) {
        return ToolError::new(
            ErrorCode::VendorRateLimited,
            format!(
                "AWS throttled {action} ({code_or_status}); wait a little and try again, or ask for fewer regions",
                code_or_status = code_or_status(failure)
            ),
        );
    }
    if code == "OptInRequiredException" {
        return ToolError::new(
            ErrorCode::VendorError,
            format!(
                "this AWS account has not enabled Compute Optimizer (OptInRequiredException): an administrator opts in in the Compute Optimizer console or with `aws compute-optimizer update-enrollment-status --status Active`; recommendations appear about 12 hours later{said}"
            ),
        );
    }
    if code == "OptInRequired" {
        return ToolError::new(
            ErrorCode::VendorError,
            format!(
                "this AWS account has not enabled the region or service {action} was sent to (OptInRequired): enable the region in the account settings, or leave it out of `regions`{said}"
            ),
        );
    }
    let lowered = aws_message.to_ascii_lowercase();
    if code.starts_with("AccessDenied") && lowered.contains("not enabled for cost explorer") {
        return ToolError::new(
            ErrorCode::VendorError,
            "this AWS account has not enabled Cost Explorer: the management (payer) account enables it once in the Billing console (Cost Explorer, Launch Cost Explorer); data appears within 24 hours",
        );
    }
    if code.starts_with("AccessDenied")
        || code == "UnauthorizedOperation"
        || code == "UnauthorizedAccess"
        || code == "Forbidden"
        || (code.is_empty() && failure.status == Some(403))
    {
        let needed = named_permission(&aws_message).unwrap_or(action);
        return ToolError::new(
            ErrorCode::VendorError,
            format!(
                "AWS denied {action} ({code_or_status}): the credentials lack the permission `{needed}`; grant it (see the connector's IAM policy) or drop this tool from the run{said}",
                code_or_status = code_or_status(failure)
            ),
        );
    }
    if CREDENTIAL_CODES.contains(&code) || failure.status == Some(401) {
        return ToolError::new(
            ErrorCode::VendorError,
            format!(
                "AWS refused the tenant's credentials for {action} ({code_or_status}): the keys are wrong, disabled or expired; an administrator updates the `aws_default` secret",
                code_or_status = code_or_status(failure)
            ),
        );
    }
    if failure.status.is_some_and(|s| s >= 500)
        || code == "InternalError"
        || code == "ServiceUnavailable"
        || code == "InternalFailure"
    {
        return ToolError::new(
            ErrorCode::VendorError,
            format!(
                "AWS failed {action} on its side ({code_or_status}); this is usually transient, try again",
                code_or_status = code_or_status(failure)
            ),
        );
    }
    ToolError::new(
        ErrorCode::VendorError,
        format!(
            "AWS refused {action} ({code_or_status}){said}",
            code_or_status = code_or_status(failure)
        ),
    )
}

fn code_or_status(failure: &Failure) -> String {
    match (&failure.code, failure.status) {
        (Some(code), _) if !code.is_empty() => sanitize(code),
        (_, Some(status)) => format!("HTTP {status}"),
        _ => "no error code".to_owned(),
    }
}

/// `... is not authorized to perform: ec2:DescribeInstances ...` -> the action.
fn named_permission(message: &str) -> Option<&str> {
    let start = message.find("perform: ")? + "perform: ".len();
    let rest = &message[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == ':' || c == '-'))
        .unwrap_or(rest.len());
    let action = &rest[..end];
    action.contains(':').then_some(action)
}

/// AWS's own message, kept short, on one line, and without anything credential-shaped (EC2's
/// encoded authorization messages are dropped, access key ids masked).
pub(crate) fn sanitize(text: &str) -> String {
    let mut words = Vec::new();
    for word in text.split_whitespace() {
        let upper = word.trim_matches(|c: char| !c.is_ascii_alphanumeric());
        let key_like =
            (upper.starts_with("AKIA") || upper.starts_with("ASIA")) && upper.len() >= 16;
        if key_like {
            words.push("[access key id]");
        } else if word.len() > 120 {
            words.push("[long value omitted]");
        } else {
            words.push(word);
        }
        if word.eq_ignore_ascii_case("message:") {
            break;
        }
    }
    let joined = words.join(" ");
    let cut: String = joined.chars().take(300).collect();
    if cut.len() < joined.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        code: Option<&str>,
        message: Option<&str>,
        status: Option<u16>,
        kind: FailureKind,
        expected: ErrorCode,
        contains: &[&str],
    ) {
        let failure = Failure {
            code: code.map(str::to_owned),
            message: message.map(str::to_owned),
            status,
            kind,
        };
        let err = classify(
            Operation {
                action: "ec2:DescribeInstances",
            },
            &failure,
        );
        assert_eq!(err.code, expected, "{failure:?}: {err}");
        for part in contains {
            assert!(
                err.message.contains(part),
                "{failure:?}: `{}` lacks `{part}`",
                err.message
            );
        }
        assert!(
            !err.message.contains("AKIAIOSFODNN7EXAMPLE"),
            "{}",
            err.message
        );
        assert!(
            !err.message.contains("AAAAAAAAAAAAAAAAAAAA"),
            "encoded messages are dropped: {}",
            err.message
        );
    }

    #[test]
    fn failures_map_to_stable_codes() {
        use FailureKind::*;
        check(
            Some("RequestLimitExceeded"),
            Some("Request limit exceeded."),
            Some(503),
            Service,
            ErrorCode::VendorRateLimited,
            &["throttled", "RequestLimitExceeded"],
        );
        check(
            Some("ThrottlingException"),
            None,
            Some(400),
            Service,
            ErrorCode::VendorRateLimited,
            &["ThrottlingException"],
        );
        check(
            None,
            None,
            Some(429),
            Response,
            ErrorCode::VendorRateLimited,
            &["HTTP 429"],
        );
        check(
            Some("SlowDown"),
            None,
            Some(503),
            Service,
            ErrorCode::VendorRateLimited,
            &[],
        );
        check(
            Some("UnauthorizedOperation"),
            Some(
                "You are not authorized to perform this operation. Encoded authorization failure message: AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            ),
            Some(403),
            Service,
            ErrorCode::VendorError,
            &[
                "permission `ec2:DescribeInstances`",
                "Encoded authorization failure message:)",
            ],
        );
        check(
            Some("AccessDeniedException"),
            Some(
                "User: arn:aws:iam::123456789012:user/audit is not authorized to perform: ce:GetCostAndUsage on resource: *",
            ),
            Some(400),
            Service,
            ErrorCode::VendorError,
            &["permission `ce:GetCostAndUsage`"],
        );
        check(
            Some("AccessDeniedException"),
            Some("User not enabled for cost explorer access"),
            Some(400),
            Service,
            ErrorCode::VendorError,
            &["has not enabled Cost Explorer"],
        );
        check(
            Some("OptInRequiredException"),
            Some("Account is not enrolled in the service"),
            Some(403),
            Service,
            ErrorCode::VendorError,
            &[
                "has not enabled Compute Optimizer",
                "update-enrollment-status",
            ],
        );
        check(
            Some("OptInRequired"),
            Some("You are not subscribed to this service."),
            Some(401),
            Service,
            ErrorCode::VendorError,
            &["has not enabled the region"],
        );
        check(
            Some("AuthFailure"),
            Some(
                "AWS was not able to validate the provided access credentials AKIAIOSFODNN7EXAMPLE",
            ),
            Some(401),
            Service,
            ErrorCode::VendorError,
            &["refused the tenant's credentials", "aws_default"],
        );
        check(
            Some("ExpiredToken"),
            None,
            Some(400),
            Service,
            ErrorCode::VendorError,
            &["expired"],
        );
        check(
            Some("InvalidClientTokenId"),
            None,
            Some(403),
            Service,
            ErrorCode::VendorError,
            &["credentials"],
        );
        check(
            Some("InternalError"),
            None,
            Some(500),
            Service,
            ErrorCode::VendorError,
            &["transient"],
        );
        check(
            None,
            None,
            Some(502),
            Response,
            ErrorCode::VendorError,
            &["HTTP 502", "transient"],
        );
        check(
            None,
            None,
            None,
            Dispatch,
            ErrorCode::VendorError,
            &["could not reach AWS"],
        );
        check(None, None, None, Timeout, ErrorCode::Timeout, &["deadline"]);
        check(
            Some("InvalidParameterValue"),
            Some("Value (foo) for parameter x is invalid"),
            Some(400),
            Service,
            ErrorCode::VendorError,
            &["InvalidParameterValue", "AWS said"],
        );
        assert!(
            ErrorCode::VendorError.is_retryable() && ErrorCode::VendorRateLimited.is_retryable()
        );
    }

    #[test]
    fn messages_are_sanitized() {
        let long = "x".repeat(2000);
        assert!(sanitize(&long).len() < 200);
        assert_eq!(
            sanitize("key ASIAIOSFODNN7EXAMPLE\nbad"),
            "key [access key id] bad"
        );
        assert_eq!(
            named_permission("is not authorized to perform: iam:ListUsers on resource"),
            Some("iam:ListUsers")
        );
        assert_eq!(named_permission("no action here"), None);
    }
}
