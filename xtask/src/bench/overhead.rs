//! Two gateways started side by side and driven by the same closed loop in alternating windows
//! (the half's leader first in even rounds, the other one first in odd ones), in two halves on
//! two fresh pairs: the base leads the first half, the measured gateway the second (see
//! [`halves`] for why). On a shared machine whose steal time and neighbours drift by tens of
//! percent over a minute, separate phases minutes apart compare the drift; alternating windows
//! put it on both alike, and the median of the per-round ratios discards a window a neighbour
//! spoiled.
//!
//! Two pairs are compared this way ([`Pair`]): what observing costs (one build, plain and with
//! traces exported and metrics on), and a change (`--compare`: this tree's build against a
//! build of another commit, both plain).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::bench::load::{self, ClosedLoop, Transport};
use crate::bench::mcp::McpClient;
use crate::bench::process::{self, CpuUsage, Gateway};

/// The two gateways compared side by side.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pair<'a> {
    /// One build twice: plain (no traces, no metrics) as the base, and observed (traces
    /// exported to the sink, metrics on).
    Observing(&'a Path),
    /// Two builds: `other` (a build of another commit) as the base, and `this`; both plain, or
    /// both observed (`--observed`: what a change does to a gateway that exports its traces).
    Builds {
        this: &'a Path,
        other: &'a Path,
        observed: bool,
    },
}

impl Pair<'_> {
    /// The names of the base and of the measured gateway.
    pub(crate) fn names(self) -> (&'static str, &'static str) {
        match self {
            Pair::Observing(_) => ("plain", "observed"),
            Pair::Builds { .. } => ("other build", "this build"),
        }
    }

    /// The base's binary and the measured one's, each with whether it exports its traces (to
    /// the sink) with metrics on.
    pub(crate) fn gateways<'p>(self) -> [(&'p Path, bool); 2]
    where
        Self: 'p,
    {
        match self {
            Pair::Observing(binary) => [(binary, false), (binary, true)],
            Pair::Builds {
                this,
                other,
                observed,
            } => [(other, observed), (this, observed)],
        }
    }

    /// Whether either gateway exports traces, so the pair needs the sink.
    pub(crate) fn exports_traces(self) -> bool {
        self.gateways().iter().any(|(_, observed)| *observed)
    }

    /// What is compared, measured against base.
    fn what(self) -> &'static str {
        match self {
            Pair::Observing(_) => "traces exported and metrics on vs off",
            Pair::Builds {
                observed: false, ..
            } => "this build vs the other",
            Pair::Builds { observed: true, .. } => {
                "this build vs the other, both exporting traces with metrics on"
            }
        }
    }
}

/// One round: a window on each gateway.
#[derive(Debug)]
pub(crate) struct Round {
    pub(crate) base: ClosedLoop,
    pub(crate) measured: ClosedLoop,
}

impl Round {
    /// The measured gateway's throughput over the base's in this round.
    pub(crate) fn ratio(&self) -> f64 {
        let base = self.base.throughput();
        if base > 0.0 {
            self.measured.throughput() / base
        } else {
            0.0
        }
    }
}

/// The rounds of one comparison.
#[derive(Debug)]
pub(crate) struct Overhead {
    pub(crate) rounds: Vec<Round>,
    pub(crate) window: Duration,
    /// The names of the base and of the measured gateway.
    pub(crate) names: (&'static str, &'static str),
    /// What is compared, for the summary line.
    pub(crate) what: &'static str,
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

/// Student's t for a two-sided 95% interval, by degrees of freedom (1 to 30); beyond 30 the
/// normal distribution's 1.96 is within 4% of it.
const T_95: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// A ratio's geometric mean over the rounds, with its 95% confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Interval {
    pub(crate) mean: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
}

/// The geometric mean of `ratios` and its 95% confidence interval: Student's t over their
/// logarithms (a ratio's noise is multiplicative: a window a neighbour slowed by a tenth is
/// 0.9, not 1 - 0.1 of anything else). `None` with fewer than two ratios or one that is not
/// above 0 (a window without calls).
fn interval(ratios: &[f64]) -> Option<Interval> {
    if ratios.len() < 2
        || ratios
            .iter()
            .any(|ratio| !(*ratio > 0.0 && ratio.is_finite()))
    {
        return None;
    }
    let count = u32::try_from(ratios.len()).ok()?;
    let logs: Vec<f64> = ratios.iter().map(|ratio| ratio.ln()).collect();
    let mean = logs.iter().sum::<f64>() / f64::from(count);
    let variance = logs.iter().map(|log| (log - mean).powi(2)).sum::<f64>() / f64::from(count - 1);
    let t = T_95.get(ratios.len() - 2).copied().unwrap_or(1.96);
    let half = t * (variance / f64::from(count)).sqrt();
    Some(Interval {
        mean: mean.exp(),
        low: (mean - half).exp(),
        high: (mean + half).exp(),
    })
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

/// CPU per successful call of what `percent` picks out of each window's usage (in percent of
/// one core), in microseconds, over several windows.
fn percent_per_call<'a>(
    loops: impl Iterator<Item = &'a ClosedLoop>,
    percent: impl Fn(&CpuUsage) -> f64,
) -> f64 {
    let (seconds, calls) = loops.fold((0.0, 0_u64), |(seconds, calls), window| {
        (
            seconds + percent(&window.cpu) / 100.0 * window.cpu.wall.as_secs_f64(),
            calls + window.calls,
        )
    });
    if calls == 0 {
        return 0.0;
    }
    seconds * 1e6 / calls as f64
}

/// The whole machine's CPU per call while one gateway was measured, and the load client's and
/// other processes' parts of it, µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MachineCost {
    pub(crate) machine: f64,
    pub(crate) client: f64,
    pub(crate) others: f64,
}

impl MachineCost {
    fn of<'a>(loops: impl Iterator<Item = &'a ClosedLoop> + Clone) -> MachineCost {
        MachineCost {
            machine: percent_per_call(loops.clone(), |cpu| cpu.machine_percent),
            client: percent_per_call(loops.clone(), |cpu| cpu.client_percent),
            others: percent_per_call(loops, CpuUsage::others_percent),
        }
    }
}

/// Gateway CPU per successful call by thread (the threads of one name together), in
/// microseconds, over several windows.
fn threads_per_call<'a>(loops: impl Iterator<Item = &'a ClosedLoop>) -> BTreeMap<String, f64> {
    let mut seconds: BTreeMap<String, f64> = BTreeMap::new();
    let mut calls = 0_u64;
    for window in loops {
        calls += window.calls;
        let wall = window.cpu.wall.as_secs_f64();
        for (name, percent) in &window.cpu.server_threads {
            *seconds.entry(name.clone()).or_default() += percent / 100.0 * wall;
        }
    }
    if calls == 0 {
        return BTreeMap::new();
    }
    seconds
        .into_iter()
        .map(|(name, seconds)| (name, seconds * 1e6 / calls as f64))
        .collect()
}

/// One thread's CPU per call in the base and in the measured gateway, µs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ThreadCost {
    pub(crate) thread: String,
    pub(crate) base: f64,
    pub(crate) measured: f64,
}

impl Overhead {
    /// Where the CPU per call goes, thread by thread, in both gateways: a thread only one of
    /// them has (the trace exporter's) counts 0 in the other. Threads under 0.1 µs a call in
    /// both are left out; the one whose cost grew most comes first.
    pub(crate) fn threads(&self) -> Vec<ThreadCost> {
        let base = threads_per_call(self.rounds.iter().map(|r| &r.base));
        let measured = threads_per_call(self.rounds.iter().map(|r| &r.measured));
        let mut threads: Vec<ThreadCost> = base
            .keys()
            .chain(measured.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|thread| ThreadCost {
                thread: thread.clone(),
                base: base.get(thread).copied().unwrap_or(0.0),
                measured: measured.get(thread).copied().unwrap_or(0.0),
            })
            .filter(|cost| cost.base >= 0.1 || cost.measured >= 0.1)
            .collect();
        threads.sort_by(|a, b| (b.measured - b.base).total_cmp(&(a.measured - a.base)));
        threads
    }

    /// The median of the rounds' throughput ratios (measured over base): for observing, the
    /// figure the 5% budget is held to.
    pub(crate) fn ratio(&self) -> f64 {
        median(self.rounds.iter().map(Round::ratio).collect())
    }

    /// The geometric mean of the rounds' ratios with its 95% confidence interval: how far the
    /// median can be trusted on a machine whose windows scatter.
    pub(crate) fn interval(&self) -> Option<Interval> {
        interval(&self.rounds.iter().map(Round::ratio).collect::<Vec<_>>())
    }

    /// Median throughput of the base and of the measured gateway, calls/s.
    pub(crate) fn throughputs(&self) -> (f64, f64) {
        (
            median(self.rounds.iter().map(|r| r.base.throughput()).collect()),
            median(
                self.rounds
                    .iter()
                    .map(|r| r.measured.throughput())
                    .collect(),
            ),
        )
    }

    /// Gateway CPU per call of the base and of the measured gateway, µs, over all rounds.
    pub(crate) fn cpu_per_call(&self) -> (f64, f64) {
        (
            cpu_per_call(self.rounds.iter().map(|r| &r.base)),
            cpu_per_call(self.rounds.iter().map(|r| &r.measured)),
        )
    }

    /// The machine's CPU per call while the base and while the measured gateway ran: on two
    /// shared cores the throughput follows it, not the gateway's alone (the load client and,
    /// for an observed gateway, the trace sink take their share of the same cores).
    pub(crate) fn machine_per_call(&self) -> (MachineCost, MachineCost) {
        (
            MachineCost::of(self.rounds.iter().map(|r| &r.base)),
            MachineCost::of(self.rounds.iter().map(|r| &r.measured)),
        )
    }

    /// Calls that failed in any window.
    pub(crate) fn failed(&self) -> u64 {
        self.rounds
            .iter()
            .map(|r| r.base.failed + r.measured.failed)
            .sum()
    }

    /// One line for people.
    pub(crate) fn summary(&self) -> String {
        let (base, measured) = self.throughputs();
        let (base_cpu, measured_cpu) = self.cpu_per_call();
        let ratios: Vec<String> = self
            .rounds
            .iter()
            .map(|r| format!("{:.3}", r.ratio()))
            .collect();
        let interval = self.interval().map_or(String::new(), |interval| {
            format!(
                ", geometric mean {:.3} with 95% confidence {:.3}-{:.3}",
                interval.mean, interval.low, interval.high
            )
        });
        let threads: Vec<String> = self
            .threads()
            .iter()
            .map(|cost| {
                format!(
                    "{} {:.1} vs {:.1} ({:+.1})",
                    cost.thread,
                    cost.measured,
                    cost.base,
                    cost.measured - cost.base
                )
            })
            .collect();
        let threads = if threads.is_empty() {
            String::new()
        } else {
            format!("; by thread, µs a call: {}", threads.join(", "))
        };
        let (base_machine, measured_machine) = self.machine_per_call();
        format!(
            "{}, {} alternating rounds of {:.0} s on two gateways side by side: throughput {:.0} vs {:.0} calls/s, median ratio {:.3} (rounds {}){}; gateway CPU per call {:.0} vs {:.0} µs ({:+.0} µs, {:+.1}%{threads}); the machine's CPU per call {:.0} vs {:.0} µs, of which the load client {:.1} vs {:.1} and other processes (the trace sink among them) {:.1} vs {:.1}; {} failed",
            self.what,
            self.rounds.len(),
            self.window.as_secs_f64(),
            measured,
            base,
            self.ratio(),
            ratios.join(", "),
            interval,
            measured_cpu,
            base_cpu,
            measured_cpu - base_cpu,
            if base_cpu > 0.0 {
                (measured_cpu / base_cpu - 1.0) * 100.0
            } else {
                0.0
            },
            measured_machine.machine,
            base_machine.machine,
            measured_machine.client,
            base_machine.client,
            measured_machine.others,
            base_machine.others,
            self.failed()
        )
    }

    /// The figures, keyed by the gateways' names (`throughput_plain`, ...; spaces become
    /// underscores).
    pub(crate) fn json(&self) -> serde_json::Value {
        let (base, measured) = self.throughputs();
        let (base_cpu, measured_cpu) = self.cpu_per_call();
        let (base_name, measured_name) = (
            self.names.0.replace(' ', "_"),
            self.names.1.replace(' ', "_"),
        );
        let mut figures = serde_json::json!({
            "window_s": self.window.as_secs_f64(),
            "ratio_median": self.ratio(),
            "round_ratios": self.rounds.iter().map(Round::ratio).collect::<Vec<_>>(),
            "failed": self.failed(),
        });
        if let Some(interval) = self.interval() {
            figures["ratio_geometric_mean"] = serde_json::json!(interval.mean);
            figures["ratio_95_low"] = serde_json::json!(interval.low);
            figures["ratio_95_high"] = serde_json::json!(interval.high);
        }
        let (base_machine, measured_machine) = self.machine_per_call();
        for (key, value) in [
            (format!("throughput_{base_name}"), base),
            (format!("throughput_{measured_name}"), measured),
            (format!("cpu_per_call_us_{base_name}"), base_cpu),
            (format!("cpu_per_call_us_{measured_name}"), measured_cpu),
            (
                format!("machine_cpu_per_call_us_{base_name}"),
                base_machine.machine,
            ),
            (
                format!("machine_cpu_per_call_us_{measured_name}"),
                measured_machine.machine,
            ),
            (
                format!("client_cpu_per_call_us_{base_name}"),
                base_machine.client,
            ),
            (
                format!("client_cpu_per_call_us_{measured_name}"),
                measured_machine.client,
            ),
            (
                format!("others_cpu_per_call_us_{base_name}"),
                base_machine.others,
            ),
            (
                format!("others_cpu_per_call_us_{measured_name}"),
                measured_machine.others,
            ),
        ] {
            figures[key] = serde_json::json!(value);
        }
        let (mut base_threads, mut measured_threads) =
            (serde_json::Map::new(), serde_json::Map::new());
        for cost in self.threads() {
            base_threads.insert(cost.thread.clone(), serde_json::json!(cost.base));
            measured_threads.insert(cost.thread, serde_json::json!(cost.measured));
        }
        figures[format!("cpu_per_call_us_by_thread_{base_name}")] = base_threads.into();
        figures[format!("cpu_per_call_us_by_thread_{measured_name}")] = measured_threads.into();
        figures
    }
}

/// Which gateway of a pair goes first in a half of the comparison: it is started, given its
/// tenant and run, and connected to first, and its window comes first in the half's first round
/// (and every other round after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lead {
    Base,
    Measured,
}

/// Starts the two gateways of `pair`, `lead` first; each observed one with `observed_env`
/// (where it exports its traces).
fn start_pair(
    pair: Pair<'_>,
    observed_env: &[(&str, &str)],
    lead: Lead,
) -> anyhow::Result<(Gateway, Gateway)> {
    let [start_base, start_measured] = pair.gateways().map(|(binary, observed)| {
        let env = if observed { observed_env } else { &[] };
        move || Gateway::start(binary, None, observed, env)
    });
    Ok(match lead {
        Lead::Base => {
            let base = start_base()?;
            (base, start_measured()?)
        }
        Lead::Measured => {
            let measured = start_measured()?;
            (start_base()?, measured)
        }
    })
}

/// Gives `gateway` its tenant and runs and connects to it (over MCP, the MCP client).
async fn transport_of(gateway: &Gateway, shape: Shape) -> anyhow::Result<Transport> {
    let target = gateway.prepare(shape.runs).await?;
    if shape.mcp {
        return Ok(Transport::Mcp(Arc::new(McpClient::new(&target)?)));
    }
    let channels = load::connect(&target.url, shape.connections).await?;
    Ok(Transport::Grpc(target, channels))
}

/// How many of `rounds` each half runs, and which gateway leads it: the base leads the first
/// half, the measured one the second, on a fresh pair.
///
/// Whichever gateway goes first is slower, and not by a little: the same build compared with
/// itself, all 16 rounds of 3 s on one pair, measured 1.080 (95% confidence 1.030-1.132) for
/// the one going second, and 0.923 (0.891-0.955) with every order swapped. Alternating which
/// window comes first in each round does not cancel it; swapping the lead between two halves
/// does, whatever causes it. An odd count gives the second half the extra round, so only an
/// even one balances the halves exactly (the default 16 does; `--quick`'s 3 does not).
fn halves(rounds: usize) -> [(Lead, usize); 2] {
    let first = rounds / 2;
    [(Lead::Base, first), (Lead::Measured, rounds - first)]
}

/// How the load is shaped: calls in flight, connections per gateway (gRPC's; MCP holds one per
/// call in flight), runs they spread over, and whether the calls go over MCP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) concurrency: usize,
    pub(crate) connections: usize,
    pub(crate) runs: usize,
    pub(crate) mcp: bool,
}

/// Runs `rounds` rounds of `window` each (after `warmup` per window) with the load `shape` on
/// each gateway, in two halves on two fresh pairs of gateways, each half led by the other
/// gateway ([`halves`]).
pub(crate) async fn measure(
    own_binary: &Path,
    pair: Pair<'_>,
    rounds: usize,
    window: Duration,
    warmup: Duration,
    shape: Shape,
) -> anyhow::Result<Overhead> {
    let sink = if pair.exports_traces() {
        Some(process::spawn_sink(own_binary)?)
    } else {
        None
    };
    let observed_env = sink.as_ref().map(process::observed_env);
    let observed_env = observed_env.as_ref().map_or(&[][..], |env| &env[..]);
    let names = pair.names();
    let mut overhead = Overhead {
        rounds: Vec::with_capacity(rounds),
        window,
        names,
        what: pair.what(),
    };
    for (lead, count) in halves(rounds) {
        if count == 0 {
            continue;
        }
        let (base, measured) = start_pair(pair, observed_env, lead)?;
        let (base_transport, measured_transport) = match lead {
            Lead::Base => {
                let base_transport = transport_of(&base, shape).await?;
                (base_transport, transport_of(&measured, shape).await?)
            }
            Lead::Measured => {
                let measured_transport = transport_of(&measured, shape).await?;
                (transport_of(&base, shape).await?, measured_transport)
            }
        };
        for round in 0..count {
            let phase = format!("overhead-{}-", overhead.rounds.len());
            let run = |transport: &Transport, pid: u32| {
                let transport = transport.clone();
                let phase = phase.clone();
                async move {
                    load::closed_loop(&transport, &phase, shape.concurrency, warmup, window, pid)
                        .await
                }
            };
            let base_first = (round % 2 == 0) == (lead == Lead::Base);
            let (base_loop, measured_loop) = if base_first {
                let b = run(&base_transport, base.pid()).await?;
                (b, run(&measured_transport, measured.pid()).await?)
            } else {
                let m = run(&measured_transport, measured.pid()).await?;
                (run(&base_transport, base.pid()).await?, m)
            };
            let round = Round {
                base: base_loop,
                measured: measured_loop,
            };
            println!(
                "  round {} ({} leads): {} {:.0} calls/s, {} {:.0} calls/s, ratio {:.3}",
                overhead.rounds.len() + 1,
                match lead {
                    Lead::Base => names.0,
                    Lead::Measured => names.1,
                },
                names.0,
                round.base.throughput(),
                names.1,
                round.measured.throughput(),
                round.ratio()
            );
            overhead.rounds.push(round);
        }
        drop(measured);
        drop(base);
    }
    drop(sink);
    Ok(overhead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_says_which_gateways_export_traces() {
        let (this, other) = (Path::new("this"), Path::new("other"));
        let observing = Pair::Observing(this);
        assert_eq!(observing.gateways(), [(this, false), (this, true)]);
        assert!(observing.exports_traces());
        for observed in [false, true] {
            let builds = Pair::Builds {
                this,
                other,
                observed,
            };
            assert_eq!(builds.gateways(), [(other, observed), (this, observed)]);
            assert_eq!(builds.exports_traces(), observed);
        }
    }

    #[test]
    fn each_gateway_leads_half_of_the_rounds() {
        assert_eq!(halves(6), [(Lead::Base, 3), (Lead::Measured, 3)]);
        assert_eq!(halves(3), [(Lead::Base, 1), (Lead::Measured, 2)]);
        assert_eq!(halves(1), [(Lead::Base, 0), (Lead::Measured, 1)]);
    }

    #[test]
    fn the_interval_is_students_t_over_the_ratios_logarithms() {
        // Six rounds of a run, against figures computed apart from this code.
        let six = interval(&[1.182, 1.003, 1.020, 0.966, 0.949, 1.013]).unwrap();
        assert!((six.mean - 1.019_519).abs() < 1e-5, "{six:?}");
        assert!((six.low - 0.939_629).abs() < 1e-5, "{six:?}");
        assert!((six.high - 1.106_201).abs() < 1e-5, "{six:?}");
        // Two rounds: one degree of freedom, the widest t.
        let two = interval(&[0.9, 1.1]).unwrap();
        assert!((two.mean - 0.994_987).abs() < 1e-5, "{two:?}");
        assert!(two.low < 0.3 && two.high > 3.0, "{two:?}");
        // Identical rounds: no spread at all.
        let same = interval(&[1.02; 40]).unwrap();
        assert!((same.low - 1.02).abs() < 1e-12 && (same.high - 1.02).abs() < 1e-12);
        // Nothing to say from one round, or from a window without calls.
        assert_eq!(interval(&[1.0]), None);
        assert_eq!(interval(&[1.0, 0.0, 1.1]), None);
    }

    #[test]
    fn the_figures_are_keyed_by_the_gateways_names() {
        let binary = Path::new("toolgate");
        for (pair, keys) in [
            (
                Pair::Observing(binary),
                ["throughput_plain", "cpu_per_call_us_observed"],
            ),
            (
                Pair::Builds {
                    this: binary,
                    other: binary,
                    observed: false,
                },
                ["throughput_other_build", "cpu_per_call_us_this_build"],
            ),
        ] {
            let overhead = Overhead {
                rounds: Vec::new(),
                window: Duration::from_secs(1),
                names: pair.names(),
                what: pair.what(),
            };
            let json = overhead.json();
            for key in keys {
                assert!(json.get(key).is_some(), "{key} missing from {json}");
            }
            assert!(overhead.summary().starts_with(pair.what()));
        }
        assert_eq!(
            crate::bench::instructions::profile("this build"),
            "callgrind-this-build.out"
        );
        assert_eq!(
            crate::bench::instructions::profile("plain"),
            "callgrind-plain.out"
        );
    }

    /// A window of `calls` calls over one second, its threads busy `percent` of a core each.
    fn window(calls: u64, threads: &[(&str, f64)]) -> ClosedLoop {
        ClosedLoop {
            concurrency: 128,
            calls,
            failed: 0,
            first_failure: None,
            elapsed: Duration::from_secs(1),
            cpu: CpuUsage {
                server_threads: threads
                    .iter()
                    .map(|(name, percent)| ((*name).to_owned(), *percent))
                    .collect(),
                wall: Duration::from_secs(1),
                ..Default::default()
            },
        }
    }

    #[test]
    fn the_cpu_per_call_is_split_by_thread() {
        let base = || window(1000, &[("tokio-rt-worker", 6.0), ("ledger-writer", 4.0)]);
        let overhead = Overhead {
            rounds: vec![
                Round {
                    base: base(),
                    measured: window(
                        800,
                        &[
                            ("tokio-rt-worker", 7.2),
                            ("ledger-writer", 3.2),
                            ("otlp-exporter", 0.4),
                            ("sqlx-sqlite-wor", 0.005),
                        ],
                    ),
                },
                Round {
                    base: base(),
                    measured: window(
                        1200,
                        &[
                            ("tokio-rt-worker", 9.6),
                            ("ledger-writer", 4.8),
                            ("otlp-exporter", 0.8),
                        ],
                    ),
                },
            ],
            window: Duration::from_secs(1),
            names: ("plain", "observed"),
            what: "traces exported and metrics on vs off",
        };
        // Worked out by hand: the measured worker spent 0.072 s + 0.096 s on 2,000 calls.
        let threads = overhead.threads();
        let figures: Vec<(&str, f64, f64)> = threads
            .iter()
            .map(|cost| (cost.thread.as_str(), cost.base, cost.measured))
            .collect();
        let expected = [
            ("tokio-rt-worker", 60.0, 84.0),
            ("otlp-exporter", 0.0, 6.0),
            ("ledger-writer", 40.0, 40.0),
        ];
        assert_eq!(figures.len(), expected.len(), "{figures:?}");
        for ((thread, base, measured), (name, want_base, want_measured)) in
            figures.iter().zip(expected)
        {
            assert_eq!(*thread, name, "{figures:?}");
            assert!((base - want_base).abs() < 1e-9, "{figures:?}");
            assert!((measured - want_measured).abs() < 1e-9, "{figures:?}");
        }
        let summary = overhead.summary();
        assert!(
            summary.contains(
                "by thread, µs a call: tokio-rt-worker 84.0 vs 60.0 (+24.0), otlp-exporter 6.0 vs 0.0 (+6.0), ledger-writer 40.0 vs 40.0 (+0.0)"
            ),
            "{summary}"
        );
        let json = overhead.json();
        assert_eq!(
            json["cpu_per_call_us_by_thread_observed"]["otlp-exporter"].as_f64(),
            Some(6.0)
        );
        assert_eq!(
            json["cpu_per_call_us_by_thread_plain"]["otlp-exporter"].as_f64(),
            Some(0.0)
        );
        assert!(json["cpu_per_call_us_by_thread_plain"]["sqlx-sqlite-wor"].is_null());
    }

    /// A window of `calls` in one second in which the machine, the load client and the
    /// gateway used these percentages of a core.
    fn machine_window(calls: u64, machine: f64, client: f64, server: f64) -> ClosedLoop {
        ClosedLoop {
            cpu: CpuUsage {
                machine_percent: machine,
                client_percent: client,
                server_percent: server,
                ..window(calls, &[]).cpu
            },
            ..window(calls, &[])
        }
    }

    #[test]
    fn the_machines_cpu_per_call_is_split_between_client_and_other_processes() {
        let overhead = Overhead {
            rounds: vec![
                Round {
                    base: machine_window(10_000, 190.0, 30.0, 150.0),
                    measured: machine_window(9_000, 195.0, 27.0, 150.0),
                },
                Round {
                    base: machine_window(10_000, 190.0, 30.0, 150.0),
                    measured: machine_window(11_000, 195.0, 33.0, 150.0),
                },
            ],
            window: Duration::from_secs(1),
            names: ("plain", "observed"),
            what: "traces exported and metrics on vs off",
        };
        // Worked out by hand: the observed windows used 3.9 s of the machine for 20,000
        // calls, 0.6 s of it the client's and 0.3 s neither the client's nor the gateway's.
        let (base, measured) = overhead.machine_per_call();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(base.machine, 190.0) && close(base.client, 30.0) && close(base.others, 10.0));
        assert!(
            close(measured.machine, 195.0)
                && close(measured.client, 30.0)
                && close(measured.others, 15.0),
            "{measured:?}"
        );
        let summary = overhead.summary();
        assert!(
            summary.contains("the machine's CPU per call 195 vs 190 µs, of which the load client 30.0 vs 30.0 and other processes (the trace sink among them) 15.0 vs 10.0"),
            "{summary}"
        );
        assert_eq!(
            overhead.json()["others_cpu_per_call_us_observed"].as_f64(),
            Some(15.0)
        );
    }

    #[test]
    fn the_median_of_an_odd_and_an_even_count() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![0.9, 1.1, 0.5]), 0.9);
        assert_eq!(median(vec![1.0, 0.5, 0.9, 0.7]), 0.8);
    }
}
