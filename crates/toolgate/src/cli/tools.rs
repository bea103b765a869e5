//! `toolgate tools`: the tools this build serves, as a table or as the definitions
//! `ListTools` answers.

use std::process::ExitCode;

use toolgate_engine::Catalog;
use toolgate_proto::v1 as pb;

use super::output::{print_message, print_text};
use toolgate_server::convert;

/// Runs `toolgate tools`.
pub(crate) fn tools(as_json: bool) -> anyhow::Result<ExitCode> {
    let registry = toolgate_server::build_registry(
        &[],
        &toolgate_server::config::SlackSettings::default(),
        &toolgate_server::config::ShopifySettings::default(),
        &toolgate_server::config::AwsSettings::default(),
    )?;
    let catalog = Catalog::new(registry)?;
    let definitions: Vec<pb::ToolDefinition> = catalog
        .registry()
        .specs()
        .map(|spec| convert::tool_definition(spec))
        .collect();
    if as_json {
        print_message(&definitions)?;
    } else if definitions.is_empty() {
        print_text("no tools: this build has no connectors enabled");
    } else {
        for d in &definitions {
            print_text(&format!(
                "{:<32} {:<6} {}",
                d.name, d.risk_level, d.description
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}
