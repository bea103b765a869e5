//! The architecture invariants of ARCHITECTURE.md, checked against the crates' manifests and
//! sources: core does no I/O, policy is pure, each outside library has one owning crate.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The normal (not dev, not build) dependency names of every workspace crate under crates/.
fn normal_dependencies() -> BTreeMap<String, Vec<String>> {
    let mut crates = BTreeMap::new();
    for entry in std::fs::read_dir(workspace_root().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let mut in_dependencies = false;
        let mut names = Vec::new();
        for line in manifest.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                in_dependencies = line == "[dependencies]";
                continue;
            }
            if in_dependencies && !line.is_empty() && !line.starts_with('#') {
                let name = line
                    .split(['=', '.', ' '])
                    .next()
                    .unwrap()
                    .trim()
                    .to_owned();
                names.push(name);
            }
        }
        crates.insert(
            dir.file_name().unwrap().to_string_lossy().into_owned(),
            names,
        );
    }
    crates
}

#[test]
fn each_outside_library_has_one_owner() {
    let owners: &[(&str, &[&str])] = &[
        ("sqlx", &["toolgate-ledger"]),
        ("cedar-policy", &["toolgate-policy"]),
        ("jsonschema", &["toolgate-engine"]),
        ("tonic", &["toolgate-proto", "toolgate-server", "toolgate"]),
        ("prost", &["toolgate-proto"]),
        ("reqwest", &["toolgate-http"]),
        ("governor", &["toolgate-http"]),
        ("aes-gcm", &["toolgate-secrets"]),
    ];
    let crates = normal_dependencies();
    assert!(crates.len() >= 6, "{crates:?}");
    for (library, allowed) in owners {
        for (krate, deps) in &crates {
            if deps.iter().any(|d| d == library) {
                assert!(
                    allowed.contains(&krate.as_str()),
                    "{krate} depends on {library}; only {allowed:?} may"
                );
            }
        }
    }
}

#[test]
fn core_does_no_io_and_policy_is_pure() {
    let crates = normal_dependencies();
    let io_crates = ["tokio", "sqlx", "reqwest", "tonic", "hyper", "futures"];
    for pure in ["toolgate-core", "toolgate-policy"] {
        for dep in &crates[pure] {
            assert!(
                !io_crates.contains(&dep.as_str()),
                "{pure} depends on {dep}"
            );
        }
        let src = workspace_root().join("crates").join(pure).join("src");
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for forbidden in ["std::fs", "std::net", "std::env", "std::process"] {
                    assert!(
                        !text.contains(forbidden),
                        "{} uses {forbidden}",
                        path.display()
                    );
                }
                if pure == "toolgate-policy" {
                    assert!(
                        !text.contains("async fn"),
                        "{} has async code",
                        path.display()
                    );
                }
            }
        }
    }
}

#[test]
fn library_crates_never_see_wire_types() {
    let crates = normal_dependencies();
    for (krate, deps) in &crates {
        if krate != "toolgate" && krate != "toolgate-server" {
            assert!(
                !deps.iter().any(|d| d == "toolgate-proto"),
                "{krate} depends on the wire types"
            );
        }
    }
}

#[test]
fn the_aws_sdk_stays_in_the_aws_connector() {
    let crates = normal_dependencies();
    assert!(
        crates["toolgate-aws"].iter().any(|d| d == "aws-sdk-ec2"),
        "{:?}",
        crates["toolgate-aws"]
    );
    for (krate, deps) in &crates {
        for dep in deps {
            if dep.starts_with("aws-") {
                assert_eq!(krate, "toolgate-aws", "{krate} depends on {dep}");
            }
        }
    }
    // A connector depends on core only among our crates (never another connector, the
    // ledger, the engine or the server).
    let ours: Vec<&String> = crates["toolgate-aws"]
        .iter()
        .filter(|d| d.starts_with("toolgate"))
        .collect();
    assert_eq!(ours, ["toolgate-core"]);
}
