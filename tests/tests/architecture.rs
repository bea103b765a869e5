//! The architecture invariants of ARCHITECTURE.md, checked against the real dependency graph
//! (`cargo metadata`) and every source file of the crates they are about: each outside
//! library has one owning crate, core does no I/O and policy is pure (not even through a
//! dependency's dependency), library crates never see the wire types, connectors depend on
//! core and the HTTP client only.
//!
//! What counts as a dependency: the normal dependencies (not dev, not build) a crate under
//! `crates/` declares, optional ones included (a cargo feature turns them on) and
//! target-specific ones included (a dependency on one platform is still a dependency). The
//! end-to-end package and xtask are tools around the product and may use what they need. The
//! transitive checks follow the resolved graph for the host platform (what this machine and
//! CI build); cargo resolves features once for the whole workspace, so a transitive finding
//! may come from another crate turning a feature on: `cargo tree -p CRATE -e normal -i DEP`
//! shows the path.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

/// Which crates may depend on an outside library: one owner each (tonic: the generated
/// clients and servers, the server crate and the binary). `name*` is a family of crates
/// (`tonic-health`, `prost-types`, `pbjson-types`, `aws-sdk-ec2`). An owner listed before it
/// exists allows nothing and breaks nothing.
const OWNERS: &[(&str, &[&str])] = &[
    ("sqlx", &["toolgate-ledger"]),
    ("cedar-policy", &["toolgate-policy"]),
    ("jsonschema", &["toolgate-engine"]),
    ("quick_cache", &["toolgate-engine"]),
    ("tonic*", &["toolgate-proto", "toolgate-server", "toolgate"]),
    ("prost*", &["toolgate-proto"]),
    ("pbjson*", &["toolgate-proto"]),
    // TLS of our own listener and CLI client (reqwest and the AWS SDK bring their own).
    ("rustls*", &["toolgate-server", "toolgate"]),
    ("tokio-rustls", &["toolgate-server", "toolgate"]),
    ("hyper-util", &["toolgate", "toolgate-server"]),
    ("hyper", &["toolgate-server"]),
    ("http-body-util", &["toolgate-server"]),
    // Test certificates: a dev-dependency only, never in a crate's build.
    ("rcgen", &[]),
    ("reqwest", &["toolgate-http"]),
    ("governor", &["toolgate-http"]),
    ("aes-gcm", &["toolgate-secrets"]),
    ("aws-sdk-*", &["toolgate-aws"]),
    ("aws-config", &["toolgate-aws"]),
    ("aws-smithy-*", &["toolgate-aws"]),
    ("aws-credential-types", &["toolgate-aws"]),
    ("aws-types", &["toolgate-aws"]),
    ("aws-runtime", &["toolgate-aws"]),
    ("aws-sigv4", &["toolgate-aws"]),
    // Traces: the exporter belongs to the server, which records spans and sends them; the
    // libraries reach a span's context through `toolgate_core::trace` only.
    ("opentelemetry*", &["toolgate-server"]),
    ("tracing-opentelemetry", &[]),
    ("tracing-subscriber", &["toolgate-server"]),
    ("slab", &["toolgate-server"]),
    ("prometheus-client", &["toolgate-server"]),
    // The approval console: its routes and its templates.
    ("axum", &["toolgate-server"]),
    ("maud", &["toolgate-server"]),
];

/// Libraries that do I/O or run async tasks: core and policy depend on none of them, not even
/// through another dependency.
const IO_LIBRARIES: &[&str] = &[
    "tokio", "mio", "socket2", "sqlx", "reqwest", "hyper", "tonic", "futures",
];

/// Standard library modules that reach outside the process.
const IO_MODULES: &[&str] = &["fs", "net", "env", "process"];

/// The crates that must stay free of I/O; policy must also be free of async code.
const PURE: &[&str] = &["toolgate-core", "toolgate-policy"];

/// The connector crates, and the only crates of ours they may depend on.
const CONNECTORS: &[&str] = &["toolgate-aws", "toolgate-slack", "toolgate-shopify"];
const CONNECTOR_MAY_USE: &[&str] = &["toolgate-core", "toolgate-http"];

/// The crates that may depend on the wire types (they convert them by hand).
const WIRE_OWNERS: &[&str] = &["toolgate-proto", "toolgate-server", "toolgate"];

#[test]
fn each_outside_library_has_one_owner() {
    let workspace = Workspace::get();
    let mut problems = Vec::new();
    for (krate, deps) in &workspace.declared {
        for dep in deps {
            for (library, owners) in OWNERS {
                if matches(library, dep) && !owners.contains(&krate.as_str()) {
                    problems.push(format!("{krate} depends on {dep}; only {owners:?} may"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    // The graph was read: the owners really use what they own.
    for (krate, dep) in [
        ("toolgate-ledger", "sqlx"),
        ("toolgate-policy", "cedar-policy"),
        ("toolgate-proto", "tonic"),
        ("toolgate-http", "reqwest"),
        ("toolgate-aws", "aws-sdk-ec2"),
    ] {
        assert!(
            workspace.declared[krate].contains(dep),
            "{krate}: {:?}",
            workspace.declared[krate]
        );
    }
}

#[test]
fn core_does_no_io_and_policy_is_pure() {
    let workspace = Workspace::get();
    for pure in PURE {
        let declared = &workspace.declared[*pure];
        for dep in declared {
            assert!(
                !IO_LIBRARIES.contains(&dep.as_str()),
                "{pure} depends on {dep}"
            );
        }
        let transitive = workspace.transitive(pure);
        for dep in &transitive {
            assert!(
                !IO_LIBRARIES.contains(&dep.as_str()),
                "{pure} pulls in {dep} through its dependencies (`cargo tree -p {pure} -e normal -i {dep}`)"
            );
        }
        let src = workspace.dirs[*pure].join("src");
        let files = rust_files(&src);
        assert!(files.len() > 1, "no sources found under {}", src.display());
        let problems = source_violations(&files, *pure == "toolgate-policy");
        assert!(problems.is_empty(), "{problems:#?}");
    }
}

#[test]
fn the_transitive_check_sees_through_dependencies() {
    // The engine reaches sqlx only through the ledger: the walk over the resolved graph
    // finds it, as it would find an I/O library under core or policy.
    let workspace = Workspace::get();
    assert!(!workspace.declared["toolgate-engine"].contains("sqlx"));
    let transitive = workspace.transitive("toolgate-engine");
    assert!(
        transitive.contains("sqlx") && transitive.contains("toolgate-ledger"),
        "{transitive:?}"
    );
}

#[test]
fn library_crates_never_see_wire_types() {
    let workspace = Workspace::get();
    for (krate, deps) in &workspace.declared {
        if !WIRE_OWNERS.contains(&krate.as_str()) {
            assert!(
                !deps.contains("toolgate-proto"),
                "{krate} depends on the wire types"
            );
        }
    }
}

#[test]
fn connectors_depend_on_core_and_the_http_client_only() {
    let workspace = Workspace::get();
    for connector in CONNECTORS {
        // A connector depends on core (and the HTTP client) only among our crates: never
        // another connector, the ledger, the engine or the server.
        let ours: Vec<&String> = workspace.declared[*connector]
            .iter()
            .filter(|d| d.starts_with("toolgate"))
            .collect();
        assert!(
            ours.iter().all(|d| CONNECTOR_MAY_USE.contains(&d.as_str())),
            "{connector} depends on {ours:?}"
        );
        assert!(
            ours.iter().any(|d| *d == "toolgate-core"),
            "{connector}: {ours:?}"
        );
    }
}

#[test]
fn the_source_walk_finds_a_violation_in_a_subfolder() {
    let temp = tempfile::tempdir().unwrap();
    let src = temp.path().join("src");
    std::fs::create_dir_all(src.join("deep/deeper")).unwrap();
    std::fs::write(src.join("lib.rs"), "//! Clean.\nmod deep;\n").unwrap();
    std::fs::write(src.join("deep.rs"), "//! Clean.\nmod deeper;\n").unwrap();
    std::fs::write(src.join("notes.txt"), "std::fs is fine in prose\n").unwrap();
    std::fs::write(
        src.join("deep/deeper/io.rs"),
        "//! Not clean.\nuse std::{fmt, net::TcpStream};\n",
    )
    .unwrap();
    std::fs::write(
        src.join("deep/deeper/wait.rs"),
        "//! Async.\npub async fn wait() {}\n",
    )
    .unwrap();
    let files = rust_files(&src);
    assert_eq!(files.len(), 4, "{files:?}");
    let problems = source_violations(&files, true);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].contains("io.rs") && problems[0].contains("std::net"),
        "{problems:#?}"
    );
    assert!(
        problems[1].contains("wait.rs") && problems[1].contains("async"),
        "{problems:#?}"
    );
    // Every way of naming a module is seen.
    for text in [
        "use std::fs;",
        "std::env::var(\"X\")",
        "use ::std::process::Command;",
        "use std::{io, fs::File};",
        "use std::{\n    collections::BTreeMap,\n    env,\n};",
        "use std::{sync::{Arc, Mutex}, net};",
    ] {
        assert!(!std_io_modules(text).is_empty(), "missed in {text:?}");
    }
    for text in [
        "use std::fmt;",
        "use std::{io, sync::{Arc, env_lock}};",
        "my_std::fs",
    ] {
        assert!(std_io_modules(text).is_empty(), "{text:?}");
    }
}

/// The workspace's crates under `crates/` as `cargo metadata` sees them.
struct Workspace {
    /// Declared normal dependencies (package names, not renames) of each crate.
    declared: BTreeMap<String, BTreeSet<String>>,
    /// Each crate's folder.
    dirs: BTreeMap<String, PathBuf>,
    /// Package id -> the ids of its normal dependencies, resolved for the host platform.
    graph: BTreeMap<String, Vec<String>>,
    /// Package id -> name, and our crates' name -> id.
    names: BTreeMap<String, String>,
    ids: BTreeMap<String, String>,
}

impl Workspace {
    /// The workspace, read once for all the tests of this file.
    fn get() -> &'static Workspace {
        static WORKSPACE: OnceLock<Workspace> = OnceLock::new();
        WORKSPACE.get_or_init(Workspace::load)
    }

    fn load() -> Workspace {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root")
            .to_path_buf();
        let metadata = cargo_metadata(&root);
        let members: BTreeSet<&str> = metadata["workspace_members"]
            .as_array()
            .expect("workspace_members")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let crates_dir = root.join("crates");
        let mut workspace = Workspace {
            declared: BTreeMap::new(),
            dirs: BTreeMap::new(),
            graph: BTreeMap::new(),
            names: BTreeMap::new(),
            ids: BTreeMap::new(),
        };
        for package in metadata["packages"].as_array().expect("packages") {
            let id = package["id"].as_str().expect("package id");
            let name = package["name"].as_str().expect("package name");
            workspace.names.insert(id.to_owned(), name.to_owned());
            let manifest = Path::new(package["manifest_path"].as_str().expect("manifest path"));
            let dir = manifest.parent().expect("crate folder");
            if !members.contains(id) || !dir.starts_with(&crates_dir) {
                continue;
            }
            let deps = package["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().expect("dependency name").to_owned())
                .collect();
            workspace.declared.insert(name.to_owned(), deps);
            workspace.dirs.insert(name.to_owned(), dir.to_path_buf());
            workspace.ids.insert(name.to_owned(), id.to_owned());
        }
        for node in metadata["resolve"]["nodes"].as_array().expect("resolve") {
            let deps = node["deps"]
                .as_array()
                .expect("node deps")
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .is_some_and(|kinds| kinds.iter().any(|k| k["kind"].is_null()))
                })
                .map(|d| d["pkg"].as_str().expect("dependency id").to_owned())
                .collect();
            let id = node["id"].as_str().expect("node id").to_owned();
            workspace.graph.insert(id, deps);
        }
        assert!(
            workspace.declared.len() >= 10,
            "too few crates under crates/: {:?}",
            workspace.declared.keys()
        );
        workspace
    }

    /// The names of every package `krate` depends on at run time, directly or not.
    fn transitive(&self, krate: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![self.ids[krate].clone()];
        while let Some(id) = todo.pop() {
            for dep in self.graph.get(&id).into_iter().flatten() {
                if seen.insert(dep.clone()) {
                    todo.push(dep.clone());
                }
            }
        }
        seen.iter().map(|id| self.names[id].clone()).collect()
    }
}

/// `cargo metadata` of the workspace, resolved for the host platform only: the packages of
/// other platforms need not be downloaded, so it works wherever the workspace builds.
fn cargo_metadata(root: &Path) -> Value {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let version = Command::new(&cargo)
        .arg("-vV")
        .output()
        .expect("run cargo -vV");
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    let host = version
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .unwrap_or_else(|| panic!("no host in `cargo -vV`: {version}"));
    let output = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--filter-platform",
            host,
        ])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON")
}

/// Whether `dependency` is `library`, or one of a family (`aws-sdk-*`).
fn matches(library: &str, dependency: &str) -> bool {
    match library.strip_suffix('*') {
        Some(prefix) => dependency.starts_with(prefix),
        None => dependency == library,
    }
}

/// Every `.rs` file under `dir`, in every subfolder, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// What in `files` reaches outside the process through the standard library, or (when
/// `no_async`) is async code.
fn source_violations(files: &[PathBuf], no_async: bool) -> Vec<String> {
    let mut problems = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        for module in std_io_modules(&text) {
            problems.push(format!("{} uses std::{module}", path.display()));
        }
        if no_async && text.contains("async fn") {
            problems.push(format!("{} has async code", path.display()));
        }
    }
    problems
}

/// The I/O modules of std that `text` names: `std::fs`, `::std::env`, and inside grouped
/// imports (`use std::{fmt, net::TcpStream}`), at any nesting.
fn std_io_modules(text: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices("std::") {
        // `my_std::fs` is not std.
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[at + "std::".len()..];
        let heads = match rest.strip_prefix('{') {
            Some(group) => group_heads(group),
            None => vec![identifier(rest)],
        };
        for head in heads {
            if let Some(module) = IO_MODULES.iter().find(|m| **m == head) {
                found.push(*module);
            }
        }
    }
    found
}

/// The first path segment of each item of a `{...}` group (`group` starts after the brace).
fn group_heads(group: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut item_start = true;
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            c if item_start && depth == 0 && !c.is_whitespace() => {
                heads.push(identifier(&group[at..]));
                item_start = false;
            }
            _ => {}
        }
    }
    heads
}

/// The identifier `text` starts with.
fn identifier(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}
