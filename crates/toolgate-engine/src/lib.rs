//! The chokepoint: every tool call passes through [`Engine::execute`], which applies the
//! pipeline of the design brief in order (audit, kill switch, manifest, resolve, validate,
//! policy, ledger, credentials, hard timeout, normalize, redact, record, return).
//!
//! The engine is transport-free: the gateway converts wire types to the requests here and the
//! outcomes back. It owns the hard timeout, catches connector panics, and keeps the hot-path
//! checks (runs, flags, policies, compiled schemas) in memory.

mod catalog;
mod config;
mod engine;
mod error;
mod invoke;
mod observe;
mod outcome;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
mod trace;

pub use catalog::{Catalog, llm_tool_name, parse_llm_tool_name};
pub use config::EngineConfig;
pub use engine::{Engine, decode_arguments};
pub use error::EngineError;
pub use observe::{CacheKind, CallReport, EngineObserver, NoEngineObserver};
pub use outcome::{
    CreateRun, ExecuteOutcome, ExecuteRequest, ResumeDecision, ResumeOutcome, ResumeRequest,
};

#[cfg(test)]
mod tests;
