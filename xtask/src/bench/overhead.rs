//! What observing the gateway costs: two gateways of the same build started side by side, one
//! plain (no traces, no metrics), one with traces exported to the sink and metrics on, driven
//! by the same closed loop in alternating windows (plain first in even rounds, observed first
//! in odd ones). On a shared machine whose steal time and neighbours drift by tens of percent
//! over a minute, separate phases minutes apart compare the drift; alternating windows put it
//! on both alike, and the median of the per-round ratios discards a window a neighbour spoiled.

use std::path::Path;
use std::time::Duration;

use crate::bench::load::{self, ClosedLoop, Transport};
use crate::bench::process::{self, Gateway};

/// One round: a window on each gateway.
#[derive(Debug)]
pub(crate) struct Round {
    pub(crate) plain: ClosedLoop,
    pub(crate) observed: ClosedLoop,
}

impl Round {
    /// Observed throughput over plain throughput in this round.
    pub(crate) fn ratio(&self) -> f64 {
        let plain = self.plain.throughput();
        if plain > 0.0 {
            self.observed.throughput() / plain
        } else {
            0.0
        }
    }
}

/// The rounds of one comparison.
#[derive(Debug, Default)]
pub(crate) struct Overhead {
    pub(crate) rounds: Vec<Round>,
    pub(crate) window: Duration,
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        f64::midpoint(values[middle - 1], values[middle])
    }
}

/// Gateway CPU per successful call, in microseconds, over several windows.
fn cpu_per_call<'a>(loops: impl Iterator<Item = &'a ClosedLoop>) -> f64 {
    let (time, calls) = loops.fold((Duration::ZERO, 0_u64), |(time, calls), window| {
        (time + window.cpu.server_time, calls + window.calls)
    });
    if calls == 0 {
        return 0.0;
    }
    time.as_secs_f64() * 1e6 / calls as f64
}

impl Overhead {
    /// The median of the rounds' throughput ratios (observed over plain): the figure the
    /// 5% budget is held to.
    pub(crate) fn ratio(&self) -> f64 {
        median(self.rounds.iter().map(Round::ratio).collect())
    }

    /// Median throughput of the plain and of the observed gateway, calls/s.
    pub(crate) fn throughputs(&self) -> (f64, f64) {
        (
            median(self.rounds.iter().map(|r| r.plain.throughput()).collect()),
            median(
                self.rounds
                    .iter()
                    .map(|r| r.observed.throughput())
                    .collect(),
            ),
        )
    }

    /// Gateway CPU per call of the plain and of the observed gateway, µs, over all rounds.
    pub(crate) fn cpu_per_call(&self) -> (f64, f64) {
        (
            cpu_per_call(self.rounds.iter().map(|r| &r.plain)),
            cpu_per_call(self.rounds.iter().map(|r| &r.observed)),
        )
    }

    /// Calls that failed in any window.
    pub(crate) fn failed(&self) -> u64 {
        self.rounds
            .iter()
            .map(|r| r.plain.failed + r.observed.failed)
            .sum()
    }

    /// One line for people.
    pub(crate) fn summary(&self) -> String {
        let (plain, observed) = self.throughputs();
        let (plain_cpu, observed_cpu) = self.cpu_per_call();
        let ratios: Vec<String> = self
            .rounds
            .iter()
            .map(|r| format!("{:.3}", r.ratio()))
            .collect();
        format!(
            "traces exported and metrics on vs off, {} alternating rounds of {:.0} s on two gateways side by side: throughput {:.0} vs {:.0} calls/s, median ratio {:.3} (rounds {}); gateway CPU per call {:.0} vs {:.0} µs ({:+.0} µs, {:+.1}%); {} failed",
            self.rounds.len(),
            self.window.as_secs_f64(),
            observed,
            plain,
            self.ratio(),
            ratios.join(", "),
            observed_cpu,
            plain_cpu,
            observed_cpu - plain_cpu,
            if plain_cpu > 0.0 {
                (observed_cpu / plain_cpu - 1.0) * 100.0
            } else {
                0.0
            },
            self.failed()
        )
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        let (plain, observed) = self.throughputs();
        let (plain_cpu, observed_cpu) = self.cpu_per_call();
        serde_json::json!({
            "window_s": self.window.as_secs_f64(),
            "ratio_median": self.ratio(),
            "round_ratios": self.rounds.iter().map(Round::ratio).collect::<Vec<_>>(),
            "throughput_plain": plain,
            "throughput_observed": observed,
            "cpu_per_call_us_plain": plain_cpu,
            "cpu_per_call_us_observed": observed_cpu,
            "failed": self.failed(),
        })
    }
}

/// Runs `rounds` rounds of `window` each (after `warmup` per window) with `concurrency` calls
/// in flight over `connections` connections per gateway.
pub(crate) async fn measure(
    own_binary: &Path,
    gateway_binary: &Path,
    rounds: usize,
    window: Duration,
    warmup: Duration,
    concurrency: usize,
    connections: usize,
) -> anyhow::Result<Overhead> {
    let sink = process::spawn_sink(own_binary)?;
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", sink.url.as_str()),
        ("OTEL_SERVICE_NAME", "toolgate-bench"),
    ];
    let plain = Gateway::start(gateway_binary, None, false, &[])?;
    let observed = Gateway::start(gateway_binary, None, true, &env)?;
    let plain_target = plain.prepare().await?;
    let observed_target = observed.prepare().await?;
    let plain_transport = Transport::Grpc(
        plain_target.clone(),
        load::connect(&plain_target.url, connections).await?,
    );
    let observed_transport = Transport::Grpc(
        observed_target.clone(),
        load::connect(&observed_target.url, connections).await?,
    );
    let mut overhead = Overhead {
        rounds: Vec::with_capacity(rounds),
        window,
    };
    for round in 0..rounds {
        let phase = format!("overhead-{round}-");
        let run = |transport: &Transport, pid: u32| {
            let transport = transport.clone();
            let phase = phase.clone();
            async move { load::closed_loop(&transport, &phase, concurrency, warmup, window, pid).await }
        };
        let (plain_loop, observed_loop) = if round % 2 == 0 {
            let p = run(&plain_transport, plain.pid()).await?;
            (p, run(&observed_transport, observed.pid()).await?)
        } else {
            let o = run(&observed_transport, observed.pid()).await?;
            (run(&plain_transport, plain.pid()).await?, o)
        };
        let round = Round {
            plain: plain_loop,
            observed: observed_loop,
        };
        println!(
            "  round {}: plain {:.0} calls/s, observed {:.0} calls/s, ratio {:.3}",
            overhead.rounds.len() + 1,
            round.plain.throughput(),
            round.observed.throughput(),
            round.ratio()
        );
        overhead.rounds.push(round);
    }
    drop(observed);
    drop(plain);
    drop(sink);
    Ok(overhead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_odd_and_an_even_count() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![0.9, 1.1, 0.5]), 0.9);
        assert_eq!(median(vec![1.0, 0.5, 0.9, 0.7]), 0.8);
    }
}
