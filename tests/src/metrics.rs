//! Reading a gateway's `/metrics` as a Prometheus server would: over HTTP, through the official
//! Python client's OpenMetrics parser (`tests/python/scrape_metrics.py`), which refuses a
//! malformed exposition.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The variable naming the Python that has `prometheus_client` (`cargo xtask ci` sets it to
/// its virtual environment's).
pub const PYTHON_ENV: &str = "TOOLGATE_TEST_PYTHON";

/// One parsed scrape.
#[derive(Debug, Clone)]
pub struct Scrape {
    /// The response's `Content-Type`.
    pub content_type: String,
    /// Every family's name and type, in the order exposed.
    pub families: Vec<(String, String)>,
    /// Every sample of every family.
    pub samples: Vec<Sample>,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name (`toolgate_tool_calls_total`, `..._bucket`, ...).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

impl Scrape {
    /// The value of the sample `name` whose labels are exactly `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == wanted)
            .map(|s| s.value)
    }

    /// The sum of the samples `name` having at least `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|found| found == v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// The type of family `name` (`counter`, `gauge`, `histogram`, `info`).
    pub fn family_type(&self, name: &str) -> Option<&str> {
        self.families
            .iter()
            .find(|(family, _)| family == name)
            .map(|(_, kind)| kind.as_str())
    }

    /// The distinct values label `label` takes in samples `name`.
    pub fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        let mut values: Vec<String> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .filter_map(|s| s.labels.get(label).cloned())
            .collect();
        values.sort();
        values.dedup();
        values
    }
}

/// Scrapes `url` and parses it; panics with the reason (no Python, a refused exposition).
pub fn scrape(url: &str) -> Scrape {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/scrape_metrics.py");
    let output = Command::new(python())
        .arg(&script)
        .arg(url)
        .output()
        .expect("run the metrics scraper");
    assert!(
        output.status.success(),
        "scraping {url} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let parsed: Value = serde_json::from_slice(&output.stdout).expect("the scraper's JSON");
    let mut families = Vec::new();
    let mut samples = Vec::new();
    for family in parsed["families"].as_array().expect("families") {
        let name = family["name"].as_str().expect("name").to_owned();
        let kind = family["type"].as_str().expect("type").to_owned();
        families.push((name, kind));
        for sample in family["samples"].as_array().expect("samples") {
            samples.push(Sample {
                name: sample["name"].as_str().expect("sample name").to_owned(),
                labels: sample["labels"]
                    .as_object()
                    .expect("labels")
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect(),
                value: sample["value"].as_f64().expect("a number"),
            });
        }
    }
    Scrape {
        content_type: parsed["content_type"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        families,
        samples,
    }
}

/// `TOOLGATE_TEST_PYTHON`, or the suite's virtual environment when it exists.
fn python() -> PathBuf {
    if let Some(path) = std::env::var_os(PYTHON_ENV) {
        return PathBuf::from(path);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/py/venv/bin/python");
    assert!(
        venv.exists(),
        "the metrics tests parse /metrics with Python's prometheus_client: run them with `cargo xtask ci` (it creates target/py/venv from tests/python/requirements.txt and sets {PYTHON_ENV}), or create a venv with `pip install -r tests/python/requirements.txt` and set {PYTHON_ENV} to its python"
    );
    venv
}
