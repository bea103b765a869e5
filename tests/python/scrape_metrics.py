"""Scrapes a toolgate `/metrics` endpoint over HTTP and parses it with the official Prometheus
client's OpenMetrics parser (which refuses anything malformed). Prints one JSON object:
`{"content_type": ..., "families": [{"name", "type", "samples": [{"name", "labels", "value"}]}]}`.

Run by the end-to-end tests (tests/tests/metrics.rs) with the suite's Python environment:
`python scrape_metrics.py http://127.0.0.1:PORT/metrics`.
"""

import json
import sys
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families


def main() -> None:
    url = sys.argv[1]
    with urllib.request.urlopen(url, timeout=10) as response:
        content_type = response.headers.get("Content-Type", "")
        text = response.read().decode("utf-8")
    families = []
    for family in text_string_to_metric_families(text):
        families.append(
            {
                "name": family.name,
                "type": family.type,
                "samples": [
                    {"name": s.name, "labels": dict(s.labels), "value": s.value}
                    for s in family.samples
                ],
            }
        )
    json.dump({"content_type": content_type, "families": families}, sys.stdout)


if __name__ == "__main__":
    main()
