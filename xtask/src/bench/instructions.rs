//! What observing costs in instructions: the plain and the observed gateway (traces exported
//! to the sink, metrics on) each run under valgrind's callgrind, which counts the instructions
//! the gateway executes; with `--compare`, this tree's build and another's, both plain. A
//! count does not move with the machine's load, unlike time: the same build, calls and
//! settings give the same figure within a fraction of a percent, so a few percent of added
//! work shows, where throughput on a shared machine moves by tens of percent.
//! It counts user-space work only (system calls count as the instructions that make them).
//!
//! Each gateway starts under callgrind, is warmed up with calls of its own, then its counters
//! are zeroed, a fixed number of calls is made, and the counters are dumped
//! (`callgrind_control`). The dumps are kept (`callgrind-plain.out` and `callgrind-observed.out`,
//! or `callgrind-other-build.out` and `callgrind-this-build.out`) so that where the
//! instructions go can be read with `callgrind_annotate`, and the functions whose own
//! instructions per call differ most between the two are listed from them ([`differences`]).

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::bench::load::{self, Transport};
use crate::bench::overhead::Pair;
use crate::bench::process::{self, Gateway};

/// Calls in flight while counting: few, so the gateway is never far behind under valgrind
/// (about 50 times slower) and no call's timeout comes near.
const IN_FLIGHT: usize = 8;

/// Instructions per call of the two gateways.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Instructions {
    pub(crate) calls: u64,
    /// The base gateway's (plain, or the other build's).
    pub(crate) base: f64,
    /// The measured gateway's (observed, or this build's).
    pub(crate) measured: f64,
    /// Their names.
    pub(crate) names: (&'static str, &'static str),
    /// Of `base` and `measured`, SHA-256 per call (see [`SOFT_HASHING`]).
    pub(crate) hashing: (f64, f64),
}

/// The functions of SHA-256's compression. Valgrind does not emulate the SHA extensions
/// (SHA-NI), so under callgrind the `sha2` crate takes its portable path, many times the
/// instructions of the SHA-NI path the gateway runs where the processor has it: the audit
/// chain's MACs and the calls' digests then weigh a quarter of a plain call's count (124,000
/// of 461,000), where `perf` finds SHA-256 at 0.4% of the running gateway's time. The
/// summary gives the counts without them too, the form closer to what the process executes.
const SOFT_HASHING: &str = "sha2::sha256::";

impl Instructions {
    /// Measured over base, minus one: the added work.
    pub(crate) fn added(&self) -> f64 {
        if self.base > 0.0 {
            self.measured / self.base - 1.0
        } else {
            0.0
        }
    }

    /// [`Instructions::added`] without SHA-256's compression in either count.
    pub(crate) fn added_without_hashing(&self) -> f64 {
        let (base, measured) = (self.base - self.hashing.0, self.measured - self.hashing.1);
        if base > 0.0 {
            measured / base - 1.0
        } else {
            0.0
        }
    }

    pub(crate) fn summary(&self) -> String {
        format!(
            "instructions per call (callgrind, {} calls each, {IN_FLIGHT} in flight): {} {:.0}, {} {:.0} ({:+.1}%); \
             of which SHA-256 in software (valgrind has no SHA-NI) {:.0} and {:.0}: without it {:.0} and {:.0} ({:+.1}%)",
            self.calls,
            self.names.0,
            self.base,
            self.names.1,
            self.measured,
            self.added() * 100.0,
            self.hashing.0,
            self.hashing.1,
            self.base - self.hashing.0,
            self.measured - self.hashing.1,
            self.added_without_hashing() * 100.0
        )
    }
}

/// What counting runs.
const TOOLS: [&str; 2] = ["valgrind", "callgrind_control"];

/// Whether valgrind's tools are installed.
pub(crate) fn available() -> bool {
    TOOLS.iter().all(|tool| installed(tool))
}

fn installed(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

/// The file a gateway's profile is kept in: `callgrind-plain.out`, `callgrind-this-build.out`.
pub(crate) fn profile(name: &str) -> String {
    format!("callgrind-{}.out", name.replace(' ', "-"))
}

/// Counts `calls` calls on each gateway of `pair`; their profiles are copied into `keep`,
/// and read once for the SHA-256 share and the `top` functions that differ most between them
/// ([`differences`]).
pub(crate) async fn measure(
    own_binary: &Path,
    pair: Pair<'_>,
    calls: u64,
    keep: &Path,
    top: usize,
) -> anyhow::Result<(Instructions, Vec<Difference>)> {
    for tool in TOOLS {
        if !installed(tool) {
            bail!("counting instructions needs `{tool}` (Debian's package valgrind)");
        }
    }
    std::fs::create_dir_all(keep).with_context(|| format!("cannot create {}", keep.display()))?;
    let names = pair.names();
    // The exporter's default schedule (batches of 512, or what waited 5 s), as a gateway runs
    // it: the counting waits out one schedule before zeroing and before dumping, so the
    // warm-up's spans are not counted and the counted calls' are.
    let sink = if pair.exports_traces() {
        Some(process::spawn_sink(own_binary)?)
    } else {
        None
    };
    let observed_env = sink.as_ref().map(process::observed_env);
    // Base first, then the measured gateway, each with its own profile.
    let mut counted = [0.0; 2];
    for ((binary, observed), (name, instructions)) in pair
        .gateways()
        .into_iter()
        .zip([names.0, names.1].into_iter().zip(&mut counted))
    {
        let env = match &observed_env {
            Some(env) if observed => &env[..],
            _ => &[],
        };
        *instructions = count(binary, observed, env, calls, &keep.join(profile(name))).await?;
    }
    let [base, measured] = counted;
    let base_costs = read_costs(&keep.join(profile(names.0)))?;
    let measured_costs = read_costs(&keep.join(profile(names.1)))?;
    let counted = Instructions {
        calls,
        base,
        measured,
        names,
        hashing: (
            hashing_per_call(&base_costs, calls),
            hashing_per_call(&measured_costs, calls),
        ),
    };
    Ok((
        counted,
        differences(&base_costs, measured_costs, calls, top),
    ))
}

/// The instructions each function of a profile executes itself ([`self_costs`]).
type Costs = HashMap<String, i128>;

/// The own costs of the profile at `path`.
fn read_costs(path: &Path) -> anyhow::Result<Costs> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the profile {}", path.display()))
        .map(|text| self_costs(&text))
}

/// The instructions per call that `costs`, a profile of `calls` calls, spent in SHA-256's
/// compression.
fn hashing_per_call(costs: &Costs, calls: u64) -> f64 {
    let total: i128 = costs
        .iter()
        .filter(|(function, _)| function.starts_with(SOFT_HASHING))
        .map(|(_, cost)| cost)
        .sum();
    total as f64 / calls.max(1) as f64
}

async fn count(
    gateway_binary: &Path,
    metrics: bool,
    env: &[(&str, &str)],
    calls: u64,
    keep: &Path,
) -> anyhow::Result<f64> {
    let dir = tempfile::Builder::new()
        .prefix("toolgate-callgrind-")
        .tempdir()
        .context("cannot create a directory for callgrind's files")?;
    let out = dir.path().join("callgrind.out");
    let wrapper = dir.path().join("toolgate-under-callgrind");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file={} {} \"$@\"\n",
            shell_quoted(&out),
            shell_quoted(gateway_binary)
        ),
    )
    .context("cannot write the callgrind wrapper")?;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    let gateway = Gateway::start(&wrapper, None, metrics, env)?;
    // One run: instructions per call do not depend on how calls spread over runs.
    let target = gateway.prepare(1).await?;
    let transport = Transport::Grpc(target.clone(), load::connect(&target.url, 1).await?);
    let (failed, first) = load::fixed_calls(&transport, "warm", IN_FLIGHT, calls / 4).await?;
    if failed > 0 {
        bail!("{failed} warm-up calls failed, the first: {first:?}");
    }
    tokio::time::sleep(EXPORT_WAIT).await;
    control(gateway.pid(), "-z").await?;
    let (failed, first) = load::fixed_calls(&transport, "counted", IN_FLIGHT, calls).await?;
    if failed > 0 {
        bail!("{failed} counted calls failed, the first: {first:?}");
    }
    tokio::time::sleep(EXPORT_WAIT).await;
    control(gateway.pid(), "-d").await?;
    let total = read_dump(dir.path()).await?;
    std::fs::copy(dir.path().join(DUMP), keep)
        .with_context(|| format!("cannot keep the profile at {}", keep.display()))?;
    drop(gateway);
    Ok(total as f64 / calls as f64)
}

/// Longer than the observed gateway's export delay (`OTEL_BSP_SCHEDULE_DELAY`, 5 s by
/// default), under valgrind.
const EXPORT_WAIT: Duration = Duration::from_secs(7);

/// `path` in single quotes for `sh`, a quote inside written as `'\''`.
fn shell_quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
}

/// `callgrind_control COMMAND PID`, off the runtime's threads and given 60 s.
async fn control(pid: u32, command: &'static str) -> anyhow::Result<()> {
    let run = tokio::task::spawn_blocking(move || {
        Command::new("callgrind_control")
            .args([command, &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .status()
    });
    let status = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .with_context(|| format!("callgrind_control {command} {pid} did not answer in 60 s"))?
        .context("callgrind_control panicked")?
        .context("cannot run callgrind_control")?;
    if !status.success() {
        bail!("callgrind_control {command} {pid} failed: {status}");
    }
    Ok(())
}

/// The file of callgrind's first dump.
const DUMP: &str = "callgrind.out.1";

/// The instruction total of the dump, once it is complete.
async fn read_dump(dir: &Path) -> anyhow::Result<u64> {
    let dump: PathBuf = dir.join(DUMP);
    for _ in 0..100 {
        if let Ok(text) = std::fs::read_to_string(&dump)
            && let Some(total) = text
                .lines()
                .find_map(|line| line.strip_prefix("totals:"))
                .and_then(|total| total.trim().parse::<u64>().ok())
        {
            return Ok(total);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("callgrind wrote no complete dump at {}", dump.display())
}

/// Where two profiles' instructions differ: per function, the instructions it executes
/// itself (not in what it calls) per call, measured minus base, largest first. Inlined code
/// counts as its caller's, as callgrind sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Difference {
    pub(crate) function: String,
    pub(crate) per_call: f64,
}

/// The functions whose own instructions per call differ most between the profiles `base`
/// and `measured` (each of `calls` calls): the `count` largest increases, then the `count`
/// largest decreases; a difference below one instruction per call is left out.
fn differences(base: &Costs, mut measured: Costs, calls: u64, count: usize) -> Vec<Difference> {
    for (function, cost) in base {
        *measured.entry(function.clone()).or_insert(0) -= cost;
    }
    let per_call = |cost: i128| cost as f64 / calls.max(1) as f64;
    let mut all: Vec<Difference> = measured
        .into_iter()
        .map(|(function, cost)| Difference {
            function,
            per_call: per_call(cost),
        })
        .filter(|difference| difference.per_call.abs() >= 1.0)
        .collect();
    all.sort_by(|a, b| b.per_call.total_cmp(&a.per_call));
    let increases = all.iter().take_while(|d| d.per_call > 0.0).take(count);
    let decreases = all
        .iter()
        .rev()
        .take_while(|d| d.per_call < 0.0)
        .take(count);
    increases.chain(decreases).cloned().collect()
}

/// The instructions each function of a callgrind profile executes itself, by name.
///
/// Callgrind's format: `fn=` names the function the cost lines below belong to, `cfn=` and
/// `calls=` announce a call, and the cost line right after `calls=` is that call's inclusive
/// cost (the callee's, counted again under it), which is skipped. A name is given once with
/// a number, `(12) name`, and as `(12)` afterwards. A cost line is a position (a number,
/// `+N`, `-N` or `*`) and then the event counts, instructions first.
fn self_costs(profile: &str) -> HashMap<String, i128> {
    let mut names = HashMap::new();
    let mut costs: HashMap<String, i128> = HashMap::new();
    let mut function: Option<&str> = None;
    let mut inclusive_next = false;
    for line in profile.lines() {
        if let Some(spec) = line.strip_prefix("fn=") {
            function = Some(function_name(&mut names, spec));
        } else if let Some(spec) = line.strip_prefix("cfn=") {
            // Only to learn the callee's name where it is given first.
            function_name(&mut names, spec);
        } else if line.starts_with("calls=") {
            inclusive_next = true;
        } else if line.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '+' | '-' | '*')) {
            if std::mem::take(&mut inclusive_next) {
                continue;
            }
            let instructions = line
                .split_whitespace()
                .nth(1)
                .and_then(|count| count.parse::<i128>().ok());
            if let (Some(function), Some(instructions)) = (function, instructions) {
                *costs
                    .entry(recursion_level_dropped(function).to_owned())
                    .or_insert(0) += instructions;
            }
        }
    }
    costs
}

/// `name` without the recursion level callgrind appends to a function called from itself
/// (`parse'2`): a function's own instructions are one figure, however deep it ran.
fn recursion_level_dropped(name: &str) -> &str {
    match name.rsplit_once('\'') {
        Some((base, level)) if !level.is_empty() && level.bytes().all(|b| b.is_ascii_digit()) => {
            base
        }
        _ => name,
    }
}

/// The function a `fn=` or `cfn=` line names, learning its number when it is given with one.
fn function_name<'a>(names: &mut HashMap<&'a str, &'a str>, spec: &'a str) -> &'a str {
    let spec = spec.trim();
    match spec.strip_prefix('(').and_then(|rest| rest.split_once(')')) {
        Some((id, "")) => names.get(id).copied().unwrap_or(spec),
        Some((id, name)) => {
            let name = name.trim_start();
            names.insert(id, name);
            name
        }
        None => spec,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_quoted_for_the_shell() {
        assert_eq!(shell_quoted(Path::new("/tmp/a b")), "'/tmp/a b'");
        assert_eq!(shell_quoted(Path::new("/tmp/it's")), "'/tmp/it'\\''s'");
        let quoted = shell_quoted(Path::new("/tmp/it's $HOME"));
        let echoed = Command::new("sh")
            .args(["-c", &format!("printf %s {quoted}")])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&echoed.stdout), "/tmp/it's $HOME");
    }

    /// A profile as callgrind writes one, with its name compression and a call's inclusive
    /// cost under the caller.
    const PROFILE: &str = "version: 1\ncreator: callgrind-3.19.0\npositions: line\nevents: Ir\n\
        summary: 1000\n\nob=(1) /bin/gateway\nfl=(1) src/a.rs\nfn=(1) outer\n10 100\n+2 50\n\
        cfl=(1)\ncfn=(2) inner\ncalls=3 20\n* 700\n-1 5\n\nfn=(2)\n20 600\n21 100\n\
        fn=(3) other\n5 45\nfn=(4) other'2\n6 5\ntotals: 1000\n";

    #[test]
    fn a_profile_gives_each_function_its_own_instructions() {
        let costs = self_costs(PROFILE);
        assert_eq!(
            costs.get("outer"),
            Some(&155),
            "the call's 700 are inner's, not outer's"
        );
        assert_eq!(costs.get("inner"), Some(&700));
        assert_eq!(
            costs.get("other"),
            Some(&50),
            "its recursion counts as itself"
        );
        assert_eq!(costs.values().sum::<i128>(), 905);
        assert_eq!(recursion_level_dropped("<T as Tr>::f'2"), "<T as Tr>::f");
        assert_eq!(recursion_level_dropped("f'"), "f'");
        assert_eq!(recursion_level_dropped("f'x1"), "f'x1");
    }

    #[test]
    fn software_sha256_is_counted_apart() {
        // A MAC's caller, then SHA-256's compression as callgrind names it (the portable path
        // inlined into the dispatcher), across two files.
        let profile = "version: 1\nevents: Ir\n\nob=(1) /bin/gateway\nfl=(1) src/chain.rs\n\
            fn=(1) toolgate_secrets::chain_key::hmac_sha256\n1 40\n\
            cfl=(2) soft.rs\ncfn=(2) sha2::sha256::compress256\ncalls=2 1\n1 900\n\
            fl=(2)\nfn=(2)\n1 600\nfl=(3) uint_macros.rs\nfn=(2)\n7 300\n\
            fn=(3) sha2::sha256::x86::digest_blocks\n1 20\nfn=(4) sha2_like::other\n1 5\n\
            totals: 965\n";
        assert_eq!(
            hashing_per_call(&self_costs(profile), 10),
            92.0,
            "(600 + 300 + 20) / 10"
        );
        let counted = Instructions {
            calls: 10,
            base: 1000.0,
            measured: 1100.0,
            names: ("plain", "observed"),
            hashing: (200.0, 200.0),
        };
        assert!((counted.added() - 0.1).abs() < 1e-9);
        assert!(
            (counted.added_without_hashing() - 0.125).abs() < 1e-9,
            "900 over 800"
        );
        assert!(
            counted
                .summary()
                .contains("without it 800 and 900 (+12.5%)")
        );
    }

    #[test]
    fn differences_are_per_call_largest_first_increases_then_decreases() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.out");
        let measured = dir.path().join("measured.out");
        std::fs::write(&base, PROFILE).unwrap();
        let more = PROFILE
            .replace("20 600", "20 800")
            .replace("10 100", "10 110")
            .replace("5 45", "5 5");
        std::fs::write(&measured, more).unwrap();
        let (base_costs, measured_costs) =
            (read_costs(&base).unwrap(), read_costs(&measured).unwrap());
        let found = differences(&base_costs, measured_costs.clone(), 10, 5);
        let found: Vec<(&str, f64)> = found
            .iter()
            .map(|d| (d.function.as_str(), d.per_call))
            .collect();
        assert_eq!(found, [("inner", 20.0), ("outer", 1.0), ("other", -4.0)]);
        assert_eq!(differences(&base_costs, measured_costs, 10, 1).len(), 2);
        let missing = read_costs(&dir.path().join("none.out")).unwrap_err();
        assert!(format!("{missing:#}").contains("none.out"), "{missing:#}");
    }
}
