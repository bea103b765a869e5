//! Project automation, run as `cargo xtask <command>`:
//! - `ci`: everything CI checks, in order (format, lints, the proto contract, the Rust suites, the Python contract
//!   tests); the one command that says whether main is green. It finds or starts the
//!   PostgreSQL the end-to-end tests need (`pg.rs`) and fails without one.
//! - `contract`: buf lint and breaking-change check of the gRPC contract in `proto/` (see
//!   `contract.rs`); also a step of `ci`.
//! - `bench`: the gateway's overhead benchmark (see `bench.rs`).
//! - `fuzz`: the cargo-fuzz targets, each for a bounded time (see `fuzz.rs`).

#![allow(clippy::print_stdout, reason = "xtask reports to its user on stdout")]

mod bench;
mod ci;
mod contract;
mod fuzz;
mod pg;

use std::process::ExitCode;

/// The gateway's allocator (`crates/toolgate/src/main.rs`), so that the bench's own processes
/// (load client, echo floor, trace sink) are built as the gateway is. With glibc's malloc the
/// trace sink, which shares the machine's cores with the gateways it measures, page-faulted
/// on every export: each request's buffers were fresh pages, handed back to the kernel when
/// freed (50,444 faults in 12 s of the observed phase; 258 with jemalloc, and 37% less of the
/// sink's CPU).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci::run(&args[1..]),
        Some("contract") => contract::run(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask <ci|contract|bench|fuzz> [options]\n  ci        format, lints, the proto contract check, every test suite (Rust and Python)\n  contract  buf lint and breaking-change check of proto/ (--against REV, default HEAD~1)\n  bench     gateway overhead benchmark; writes target/bench/results.json\n  fuzz      runs each fuzz target for a bounded time (--seconds N, default 60)"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}
