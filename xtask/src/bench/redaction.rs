//! The redactor's cost per typical call: a typical tool call's input and output JSON, redacted
//! as the engine redacts them before the ledger sees them (the input in the secrets mode, the
//! output in the output mode, which also removes personal data). Measured in this release
//! binary, in-process, in batches of calls. The figure is the batch at the 10th percentile,
//! per call: the work is pure CPU, so slower batches measure other processes' load (on a busy
//! machine the median doubled while the fastest batches stayed put); the median is reported
//! beside it.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_core::Redactor;

/// The figures of one measurement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RedactionFigures {
    /// Time per call of the batch at the 10th percentile.
    pub(crate) per_call: Duration,
    /// Time per call of the median batch.
    pub(crate) median: Duration,
    /// The fastest and slowest batch, per call.
    pub(crate) fastest: Duration,
    pub(crate) slowest: Duration,
    /// Calls redacted in all.
    pub(crate) calls: u64,
}

/// A typical small tool call: a Shopify-style order lookup's input (with a credential in it)
/// and its 25-field output (with an email, a phone, a street address and a card-free tracking
/// number), plus a Slack-style post whose text quotes a token and an error text.
fn typical_call() -> (Value, Value) {
    let input = json!({
        "shop": "example-store",
        "order_id": "#1001",
        "include_line_items": true,
        "max_tokens": 1024,
        "api_key": "shpat_0123456789abcdef0123456789abcdef",
        "note": "customer asked to resend, see ticket 4521; token xoxb-123456789012-1234567890123-AbCdEfGhIjKl",
    });
    let output = json!({
        "id": 5123456789012u64,
        "name": "#1001",
        "email": "alice.smith@example.com",
        "created_at": "2024-01-15T10:30:00Z",
        "financial_status": "paid",
        "total_price": "1234.56",
        "currency": "USD",
        "shipping_address": {
            "first_name": "Alice",
            "address1": "1600 Amphitheatre Parkway",
            "city": "Mountain View",
            "zip": "94043",
            "phone": "+1 650 253 0000"
        },
        "line_items": [
            {"sku": "TSHIRT-M", "quantity": 2, "price": "19.99", "title": "Classic tee"},
            {"sku": "MUG-01", "quantity": 1, "price": "9.50", "title": "Mug"}
        ],
        "tracking_number": "1Z999AA10123456784",
        "note": "Leave at the front desk, thanks! Call 650-253-0000 if closed.",
        "tags": ["vip", "repeat"],
        "gateway": "shopify_payments",
        "processed_at": "2024-01-15T10:31:02Z"
    });
    (input, output)
}

/// Redacts the typical call for about `duration`, in batches, and reports per call.
pub(crate) fn measure(duration: Duration) -> RedactionFigures {
    let redactor = Redactor::new();
    let (input, output) = typical_call();
    let call = || {
        black_box(redactor.redact_json(black_box(&input)));
        black_box(redactor.redact_output_json(black_box(&output)));
    };
    // Warm up: compile the patterns, fill the caches.
    let warm_until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < warm_until {
        call();
    }
    const BATCH: u32 = 200;
    let mut batches: Vec<Duration> = Vec::new();
    let until = Instant::now() + duration;
    while Instant::now() < until || batches.len() < 5 {
        let started = Instant::now();
        for _ in 0..BATCH {
            call();
        }
        batches.push(started.elapsed() / BATCH);
    }
    batches.sort_unstable();
    RedactionFigures {
        per_call: batches[batches.len() / 10],
        median: batches[batches.len() / 2],
        fastest: batches[0],
        slowest: batches[batches.len() - 1],
        calls: u64::try_from(batches.len()).unwrap_or(u64::MAX) * u64::from(BATCH),
    }
}
