//! Shopify's failures as stable outcomes: HTTP statuses of the Admin API, GraphQL `errors[]`
//! with their `extensions.code`, and transport failures, each turned into a core `ErrorCode`
//! with a sanitized message that starts with a stable name and says what to do. Shopify's own
//! message text is never repeated whole (it can quote the query); only the parts that are
//! known to be safe and useful (a scope name, a field path) are.
//!
//! Statuses: <https://shopify.dev/docs/api/usage/response-codes>; GraphQL error codes:
//! <https://shopify.dev/docs/api/admin-graphql> (Status and error codes).

use serde_json::Value;
use toolgate_core::{ErrorCode, ToolError};
use toolgate_http::{ErrorKind, HttpError};

use crate::credentials::SECRET_NAME;

/// An HTTP error status from the GraphQL endpoint (429 is handled by the caller).
pub(crate) fn status_error(status: u16, body: &[u8]) -> ToolError {
    let text = body_text(body);
    match status {
        401 => ToolError::new(
            ErrorCode::CredentialsNotFound,
            format!(
                "UNAUTHORIZED: Shopify refused the access token for this store (HTTP 401); an operator must store a current token or client credentials in `{SECRET_NAME}`"
            ),
        ),
        402 => ToolError::new(
            ErrorCode::VendorError,
            "PAYMENT_REQUIRED: the store is frozen for an unpaid bill (HTTP 402); nothing can be read until the merchant pays Shopify; not retried",
        ),
        403 => match scope_in(&text) {
            Some(scope) => ToolError::new(
                ErrorCode::VendorError,
                format!(
                    "FORBIDDEN: the app lacks the `{scope}` scope (HTTP 403); the merchant must grant it to the app"
                ),
            ),
            None => ToolError::new(
                ErrorCode::VendorError,
                "FORBIDDEN: Shopify refused access (HTTP 403): the app lacks a scope this query needs, or the store is unavailable",
            ),
        },
        404 => ToolError::new(
            ErrorCode::VendorError,
            "NOT_FOUND: Shopify has no Admin API here (HTTP 404): the shop domain or the pinned API version is wrong",
        ),
        423 => ToolError::new(
            ErrorCode::VendorError,
            "LOCKED: the store is locked by Shopify (HTTP 423) and unavailable; the merchant must contact Shopify; not retried",
        ),
        500.. => ToolError::new(
            ErrorCode::VendorError,
            format!("SERVER_ERROR: Shopify failed to answer (HTTP {status}); try again later"),
        ),
        _ => ToolError::new(
            ErrorCode::VendorError,
            format!("BAD_REQUEST: Shopify refused the request (HTTP {status})"),
        ),
    }
}

/// The first GraphQL error of an answer (`errors` is non-empty), `THROTTLED` excepted (the
/// caller paces and retries those).
pub(crate) fn graphql_error(errors: &[Value], partial: bool) -> ToolError {
    let first = &errors[0];
    let code = first
        .pointer("/extensions/code")
        .and_then(Value::as_str)
        .unwrap_or("");
    let message = first.get("message").and_then(Value::as_str).unwrap_or("");
    let path = first
        .get("path")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .map(|p| match p {
                    Value::String(s) => sanitize_name(s),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(".")
        })
        .filter(|p| !p.is_empty());
    let at = path.map(|p| format!(" at `{p}`")).unwrap_or_default();
    let partly = if partial {
        "; Shopify returned partial data, which is withheld so nothing incomplete is taken for the whole"
    } else {
        ""
    };
    match code {
        "MAX_COST_EXCEEDED" => {
            let cost = first.pointer("/extensions/cost").and_then(Value::as_f64);
            let max = first.pointer("/extensions/maxCost").and_then(Value::as_f64);
            let figures = match (cost, max) {
                (Some(cost), Some(max)) => format!(" (cost {cost}, limit {max})"),
                _ => String::new(),
            };
            ToolError::new(
                ErrorCode::InvalidArguments,
                format!(
                    "MAX_COST_EXCEEDED: the query is too expensive for Shopify{figures}; ask for fewer results"
                ),
            )
        }
        "ACCESS_DENIED" => {
            let scope = first
                .pointer("/extensions/requiredAccess")
                .and_then(Value::as_str)
                .and_then(scope_in)
                .or_else(|| scope_in(message));
            let needs = match scope {
                Some(scope) => format!("the app lacks the `{scope}` scope"),
                None => "the app lacks a scope this query needs".to_owned(),
            };
            ToolError::new(
                ErrorCode::VendorError,
                format!(
                    "ACCESS_DENIED: {needs}{at}; the merchant must grant it to the app{partly}"
                ),
            )
        }
        "THROTTLED" => ToolError::new(
            ErrorCode::VendorRateLimited,
            "THROTTLED: the store's query-cost budget is spent; try again shortly",
        ),
        "INTERNAL_SERVER_ERROR" => ToolError::new(
            ErrorCode::VendorError,
            format!("INTERNAL_SERVER_ERROR: Shopify failed{at}; try again later{partly}"),
        ),
        "" => ToolError::new(
            ErrorCode::VendorError,
            format!("GRAPHQL_ERROR: Shopify refused the query{at}{partly}"),
        ),
        other => ToolError::new(
            ErrorCode::VendorError,
            format!(
                "{}: Shopify refused the query{at}{partly}",
                sanitize_code(other)
            ),
        ),
    }
}

/// A transport failure (no usable answer), with the attempts the HTTP client made. These are
/// read-only queries: a failure never leaves anything half done at Shopify.
pub(crate) fn transport_error(error: &HttpError, what: &str) -> ToolError {
    let base = match error.kind() {
        ErrorKind::Timeout => ToolError::new(
            ErrorCode::Timeout,
            format!("{what} to Shopify did not finish before the deadline"),
        ),
        ErrorKind::Refused => ToolError::new(
            ErrorCode::PolicyBlocked,
            format!("{what} was refused by the gateway's outbound address check: {error}"),
        ),
        _ => error.to_tool_error(),
    };
    base.with_attempts(error.attempts())
}

/// The first access-scope name in `text` (`read_orders`, `read_all_orders`, ...).
pub(crate) fn scope_in(text: &str) -> Option<String> {
    text.split(|c: char| !(c.is_ascii_lowercase() || c == '_'))
        .find(|word| {
            (word.starts_with("read_") || word.starts_with("write_"))
                && word.len() > 6
                && word.len() <= 64
        })
        .map(str::to_owned)
}

fn body_text(body: &[u8]) -> String {
    let answer: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match answer.get("errors") {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => String::from_utf8_lossy(&body[..body.len().min(2048)]).into_owned(),
    }
}

/// GraphQL error codes are `SCREAMING_SNAKE_CASE`; anything else is not repeated.
fn sanitize_code(code: &str) -> String {
    let plain = code.len() <= 64
        && code
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if plain {
        code.to_owned()
    } else {
        "GRAPHQL_ERROR".to_owned()
    }
}

/// Field names in a path are GraphQL names; anything else is not repeated.
fn sanitize_name(name: &str) -> String {
    let plain = name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if plain {
        name.to_owned()
    } else {
        "?".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn statuses_map_to_stable_codes() {
        let cases: [(u16, &str, &str, &str); 7] = [
            (
                401,
                r#"{"errors":"[API] Invalid API key or access token"}"#,
                "CREDENTIALS_NOT_FOUND",
                "UNAUTHORIZED",
            ),
            (
                402,
                r#"{"errors":"Unavailable Shop"}"#,
                "VENDOR_ERROR",
                "PAYMENT_REQUIRED",
            ),
            (
                403,
                r#"{"errors":"[API] This action requires merchant approval for read_orders scope."}"#,
                "VENDOR_ERROR",
                "`read_orders`",
            ),
            (
                404,
                r#"{"errors":"Not Found"}"#,
                "VENDOR_ERROR",
                "NOT_FOUND",
            ),
            (
                423,
                r#"{"errors":"This store is unavailable"}"#,
                "VENDOR_ERROR",
                "LOCKED",
            ),
            (503, "<html>oops</html>", "VENDOR_ERROR", "SERVER_ERROR"),
            (400, "{}", "VENDOR_ERROR", "BAD_REQUEST"),
        ];
        for (status, body, code, contains) in cases {
            let err = status_error(status, body.as_bytes());
            assert_eq!(err.code.as_str(), code, "{status}");
            assert!(err.message.contains(contains), "{status}: {}", err.message);
            assert!(!err.message.contains("oops"));
        }
    }

    #[test]
    fn graphql_codes_map_and_name_the_scope() {
        let denied = json!([{
            "message": "Access denied for customer field. Required access: `read_customers` access scope.",
            "path": ["order", "customer"],
            "extensions": {"code": "ACCESS_DENIED", "requiredAccess": "`read_customers` access scope."}
        }]);
        let err = graphql_error(denied.as_array().unwrap(), true);
        assert_eq!(err.code, ErrorCode::VendorError);
        assert!(err.message.starts_with("ACCESS_DENIED"), "{}", err.message);
        assert!(err.message.contains("`read_customers`"), "{}", err.message);
        assert!(err.message.contains("`order.customer`"), "{}", err.message);
        assert!(err.message.contains("partial data"), "{}", err.message);

        let costly = json!([{"message": "Query cost is 1172, which exceeds the single query max cost limit (1000).",
            "extensions": {"code": "MAX_COST_EXCEEDED", "cost": 1172, "maxCost": 1000}}]);
        let err = graphql_error(costly.as_array().unwrap(), false);
        assert_eq!(err.code, ErrorCode::InvalidArguments);
        assert!(
            err.message.contains("cost 1172, limit 1000"),
            "{}",
            err.message
        );

        let odd =
            json!([{"message": "secret stuff <script>", "extensions": {"code": "weird code!"}}]);
        let err = graphql_error(odd.as_array().unwrap(), false);
        assert!(err.message.starts_with("GRAPHQL_ERROR"), "{}", err.message);
        assert!(!err.message.contains("secret"), "{}", err.message);
    }

    #[test]
    fn scopes_are_found() {
        assert_eq!(
            scope_in("needs `read_all_orders` access").as_deref(),
            Some("read_all_orders")
        );
        assert_eq!(scope_in("nothing here"), None);
    }
}
