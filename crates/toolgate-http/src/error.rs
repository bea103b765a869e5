//! The crate's one error type, its classification, and the mapping to core's `ErrorCode`.
//! Messages are safe to show an LLM: they name the method and host, never the query string,
//! header values or body.

use toolgate_core::ErrorCode;

use crate::client::Response;

/// How a failure is classified; decides the engine's error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The connection failed or broke (refused, reset, TLS, DNS). Retried when idempotent.
    Transient,
    /// The vendor or the local rate limiter throttled the call (429, or waiting would pass
    /// the deadline).
    Throttling,
    /// The vendor answered 5xx, or sent a response that could not be read.
    Server,
    /// The vendor answered 4xx (other than 429), or redirected where it may not.
    Client,
    /// The SSRF guard refused the URL or an address it resolves to; nothing was sent.
    Refused,
    /// The call's deadline passed.
    Timeout,
    /// The response body is larger than the configured cap.
    BodyTooLarge,
    /// The request itself is malformed (bad URL, header or method).
    InvalidRequest,
    /// The client configuration is invalid.
    Config,
}

impl ErrorKind {
    /// The engine's error code for this kind.
    pub fn error_code(self) -> ErrorCode {
        match self {
            ErrorKind::Transient
            | ErrorKind::Server
            | ErrorKind::Client
            | ErrorKind::BodyTooLarge => ErrorCode::VendorError,
            ErrorKind::Throttling => ErrorCode::VendorRateLimited,
            ErrorKind::Refused => ErrorCode::PolicyBlocked,
            ErrorKind::Timeout => ErrorCode::Timeout,
            ErrorKind::InvalidRequest => ErrorCode::InvalidArguments,
            ErrorKind::Config => ErrorCode::Internal,
        }
    }
}

/// A failed outbound call. `Display` is safe to show an LLM.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct HttpError {
    kind: ErrorKind,
    message: String,
    attempts: u32,
    may_have_reached_vendor: bool,
    response: Option<Box<Response>>,
}

impl HttpError {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> HttpError {
        HttpError {
            kind,
            message: message.into(),
            attempts: 0,
            may_have_reached_vendor: false,
            response: None,
        }
    }

    pub(crate) fn with_attempts(mut self, attempts: u32) -> HttpError {
        self.attempts = attempts;
        self
    }

    pub(crate) fn reached_vendor(mut self, reached: bool) -> HttpError {
        self.may_have_reached_vendor = reached;
        self
    }

    pub(crate) fn with_response(mut self, response: Response) -> HttpError {
        self.response = Some(Box::new(response));
        self
    }

    /// The classification.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The engine's error code (`VENDOR_ERROR`, `VENDOR_RATE_LIMITED`, `TIMEOUT`, ...).
    pub fn error_code(&self) -> ErrorCode {
        self.kind.error_code()
    }

    /// Attempts made for this call, for the ledger: 0 when it failed before the first one
    /// (invalid or refused URL, local throttling), retries included otherwise.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether any attempt may have reached the vendor, i.e. the vendor may have acted. False
    /// for refusals, invalid requests, local throttling and connection failures.
    pub fn may_have_reached_vendor(&self) -> bool {
        self.may_have_reached_vendor
    }

    /// The vendor's final error response (4xx/5xx), so a connector can read its error body.
    pub fn response(&self) -> Option<&Response> {
        self.response.as_deref()
    }

    /// This error as core's agent-facing error, with the attempts made.
    pub fn to_tool_error(&self) -> toolgate_core::ToolError {
        toolgate_core::ToolError::new(self.error_code(), self.message.clone())
            .with_attempts(self.attempts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_engine_codes() {
        let cases = [
            (ErrorKind::Transient, "VENDOR_ERROR"),
            (ErrorKind::Throttling, "VENDOR_RATE_LIMITED"),
            (ErrorKind::Server, "VENDOR_ERROR"),
            (ErrorKind::Client, "VENDOR_ERROR"),
            (ErrorKind::Refused, "POLICY_BLOCKED"),
            (ErrorKind::Timeout, "TIMEOUT"),
            (ErrorKind::BodyTooLarge, "VENDOR_ERROR"),
            (ErrorKind::InvalidRequest, "INVALID_ARGUMENTS"),
            (ErrorKind::Config, "INTERNAL"),
        ];
        for (kind, code) in cases {
            assert_eq!(kind.error_code().as_str(), code, "{kind:?}");
        }
    }
}
