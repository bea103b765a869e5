//! The gateway starts in a Kubernetes pod: the service-link variables Kubernetes injects for
//! Services named `toolgate` and `toolgate-<something>` are accepted, while a misspelled
//! setting is still refused before any port is bound, with a suggestion.

use std::process::Command;

use toolgate_e2e::{Gateway, gateway_binary};

/// What `kubectl exec POD -- env` shows in a namespace with a Service `toolgate` (ports `grpc`
/// 50051/TCP and `metrics` 9090/TCP) and a Service `toolgate-admin` (one unnamed port
/// 8080/TCP).
const SERVICE_LINKS: &[(&str, &str)] = &[
    ("TOOLGATE_SERVICE_HOST", "10.0.0.1"),
    ("TOOLGATE_SERVICE_PORT", "50051"),
    ("TOOLGATE_SERVICE_PORT_GRPC", "50051"),
    ("TOOLGATE_SERVICE_PORT_METRICS", "9090"),
    ("TOOLGATE_PORT", "tcp://10.0.0.1:50051"),
    ("TOOLGATE_PORT_50051_TCP", "tcp://10.0.0.1:50051"),
    ("TOOLGATE_PORT_50051_TCP_PROTO", "tcp"),
    ("TOOLGATE_PORT_50051_TCP_PORT", "50051"),
    ("TOOLGATE_PORT_50051_TCP_ADDR", "10.0.0.1"),
    ("TOOLGATE_PORT_9090_TCP", "tcp://10.0.0.1:9090"),
    ("TOOLGATE_PORT_9090_TCP_PROTO", "tcp"),
    ("TOOLGATE_PORT_9090_TCP_PORT", "9090"),
    ("TOOLGATE_PORT_9090_TCP_ADDR", "10.0.0.1"),
    ("TOOLGATE_ADMIN_SERVICE_HOST", "10.0.0.2"),
    ("TOOLGATE_ADMIN_SERVICE_PORT", "8080"),
    ("TOOLGATE_ADMIN_PORT", "tcp://10.0.0.2:8080"),
    ("TOOLGATE_ADMIN_PORT_8080_TCP", "tcp://10.0.0.2:8080"),
    ("TOOLGATE_ADMIN_PORT_8080_TCP_PROTO", "tcp"),
    ("TOOLGATE_ADMIN_PORT_8080_TCP_PORT", "8080"),
    ("TOOLGATE_ADMIN_PORT_8080_TCP_ADDR", "10.0.0.2"),
];

#[tokio::test]
async fn the_gateway_starts_with_kubernetes_service_links() {
    let gateway = Gateway::options().envs(SERVICE_LINKS).start();
    // It serves: the variables changed nothing (it listens where it was told, not on 10.0.0.1).
    let token = gateway.tenant("acme", "support", &["testkit.echo"]).await;
    assert!(token.starts_with("tg_agent_"));
}

#[test]
fn a_misspelled_setting_is_still_refused_with_a_suggestion() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        (
            "TOOLGATE_DATABSE",
            "ledger.db",
            "did you mean TOOLGATE_DATABASE?",
        ),
        (
            "TOOLGATE_LISTEN_PORT",
            "50051",
            "did you mean TOOLGATE_LISTEN?",
        ),
        // A service-link name whose value is not what Kubernetes sets is no service link.
        (
            "TOOLGATE_PORT",
            "50051",
            "unknown environment variable TOOLGATE_PORT",
        ),
    ];
    for (name, value, says) in cases {
        let mut command = Command::new(gateway_binary());
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .current_dir(dir.path());
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(|k| k.starts_with("TOOLGATE_")) {
                command.env_remove(&key);
            }
        }
        for (key, link) in SERVICE_LINKS {
            command.env(key, link);
        }
        // The real variable would be overridden by the link set above: drop it first.
        command.env_remove(name).env(name, value);
        let output = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{name}={value} must be refused");
        assert!(stderr.contains(says), "{name}={value}: {stderr}");
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("listening"),
            "{name}: no port bound"
        );
        assert!(
            !dir.path().join("toolgate.db").exists() && !dir.path().join("ledger.db").exists(),
            "{name}: nothing created"
        );
    }
}
