//! EC2 tools: instances, volumes, security groups, NAT gateways, Elastic IPs.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::{Filter, IpPermission};
use serde_json::{Map, Value, json};
use toolgate_core::ToolError;

use crate::errors::{Operation, sdk_error};
use crate::session::Session;
use crate::tools::{
    Capped, fan_out, finding, invalid, limit, optional_string, page_size, regions, settle, time,
};

const INSTANCE_STATES: &[&str] = &[
    "pending",
    "running",
    "shutting-down",
    "terminated",
    "stopping",
    "stopped",
];

/// Ports whose exposure to the internet is a high-severity finding.
const SENSITIVE_PORTS: &[(i32, &str)] = &[
    (22, "SSH"),
    (23, "Telnet"),
    (3389, "RDP"),
    (5900, "VNC"),
    (3306, "MySQL"),
    (5432, "PostgreSQL"),
    (1433, "SQL Server"),
    (1521, "Oracle"),
    (27017, "MongoDB"),
    (6379, "Redis"),
    (11211, "Memcached"),
    (9200, "Elasticsearch"),
    (5601, "Kibana"),
    (2375, "Docker API"),
    (445, "SMB"),
];

/// A field some implementations send as an empty string when it is absent.
fn present(value: Option<&str>) -> Option<&str> {
    value.filter(|v| !v.is_empty())
}

fn tags_map(tags: &[aws_sdk_ec2::types::Tag]) -> Map<String, Value> {
    tags.iter()
        .take(20)
        .filter_map(|t| Some((t.key()?.to_owned(), json!(t.value().unwrap_or("")))))
        .collect()
}

fn name_tag(tags: &[aws_sdk_ec2::types::Tag]) -> Value {
    tags.iter()
        .find(|t| t.key() == Some("Name"))
        .and_then(|t| t.value())
        .map_or(Value::Null, |v| json!(v))
}

/// Merges per-region capped lists into one capped list.
fn merge(per_region: Vec<(String, Capped<Value>)>, limit: usize) -> (Vec<Value>, bool) {
    let mut items = Vec::new();
    let mut truncated = false;
    for (_, capped) in per_region {
        truncated |= capped.truncated;
        for item in capped.items {
            if items.len() == limit {
                truncated = true;
                break;
            }
            items.push(item);
        }
    }
    (items, truncated)
}

fn count_by(items: &[Value], field: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for item in items {
        let key = item[field].as_str().unwrap_or("unknown").to_owned();
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

/// `aws.ec2_inventory`.
pub(crate) async fn ec2_inventory(
    session: &Session,
    arguments: &Value,
) -> Result<Value, ToolError> {
    let regions = regions(arguments, session)?;
    let limit = limit(arguments, 100, super::MAX_LIMIT)?;
    let mut filters = Vec::new();
    if let Some(states) = arguments.get("states").filter(|v| !v.is_null()) {
        let list = states
            .as_array()
            .filter(|l| !l.is_empty())
            .ok_or_else(|| invalid("`states` must be a non-empty list of instance states"))?;
        let mut values = Vec::new();
        for state in list {
            match state.as_str() {
                Some(s) if INSTANCE_STATES.contains(&s) => values.push(s.to_owned()),
                _ => {
                    return Err(invalid(format!(
                        "`states` may hold only {}",
                        INSTANCE_STATES.join(", ")
                    )));
                }
            }
        }
        filters.push(
            Filter::builder()
                .name("instance-state-name")
                .set_values(Some(values))
                .build(),
        );
    }
    let tag_key = optional_string(arguments, "tag_key", 128)?;
    let tag_value = optional_string(arguments, "tag_value", 256)?;
    match (&tag_key, &tag_value) {
        (Some(key), Some(value)) => filters.push(
            Filter::builder()
                .name(format!("tag:{key}"))
                .values(value)
                .build(),
        ),
        (Some(key), None) => filters.push(Filter::builder().name("tag-key").values(key).build()),
        (None, Some(_)) => return Err(invalid("`tag_value` needs `tag_key`")),
        (None, None) => {}
    }
    let op = Operation {
        action: "ec2:DescribeInstances",
    };
    let results =
        fan_out(session, &regions, |region| {
            let filters = filters.clone();
            async move {
                let client = session.ec2(&region)?;
                let mut capped = Capped::new(limit);
                let mut pages = client
                    .describe_instances()
                    .set_filters(if filters.is_empty() {
                        None
                    } else {
                        Some(filters)
                    })
                    .into_paginator()
                    .page_size(page_size(session, limit, 5, 1000))
                    .send();
                while let Some(page) = pages.next().await {
                    let page = page.map_err(|e| sdk_error(op, &e))?;
                    let more = page.next_token().is_some_and(|t| !t.is_empty());
                    let items = page.reservations().iter().flat_map(|r| r.instances()).map(|i| {
                    json!({
                        "instance_id": i.instance_id(),
                        "name": name_tag(i.tags()),
                        "instance_type": i.instance_type().map(|t| t.as_str()),
                        "state": i.state().and_then(|s| s.name()).map(|n| n.as_str()),
                        "region": region,
                        "availability_zone": i.placement().and_then(|p| p.availability_zone()),
                        "launch_time": time(i.launch_time()),
                        "private_ip": i.private_ip_address(),
                        "public_ip": i.public_ip_address(),
                        "platform": i.platform_details(),
                        "vpc_id": i.vpc_id(),
                        "tags": tags_map(i.tags()),
                    })
                });
                    let items: Vec<Value> = items.collect();
                    if capped.extend(items, more) {
                        break;
                    }
                }
                Ok(capped)
            }
        })
        .await;
    let (ok, region_errors) = settle(results)?;
    let (items, truncated) = merge(ok, limit);
    Ok(json!({
        "regions": regions,
        "count": items.len(),
        "truncated": truncated,
        "by_state": count_by(&items, "state"),
        "by_type": count_by(&items, "instance_type"),
        "items": items,
        "region_errors": region_errors,
    }))
}

/// `aws.ebs_inventory`.
pub(crate) async fn ebs_inventory(
    session: &Session,
    arguments: &Value,
) -> Result<Value, ToolError> {
    let regions = regions(arguments, session)?;
    let limit = limit(arguments, 100, super::MAX_LIMIT)?;
    let only_unattached = match arguments.get("only_unattached") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("`only_unattached` must be true or false")),
    };
    let op = Operation {
        action: "ec2:DescribeVolumes",
    };
    let results = fan_out(session, &regions, |region| async move {
        let client = session.ec2(&region)?;
        let mut capped = Capped::new(limit);
        let filters = only_unattached.then(|| vec![Filter::builder().name("status").values("available").build()]);
        let mut pages = client
            .describe_volumes()
            .set_filters(filters)
            .into_paginator()
            .page_size(page_size(session, limit, 5, 500))
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error(op, &e))?;
            let more = page.next_token().is_some_and(|t| !t.is_empty());
            let items: Vec<Value> = page
                .volumes()
                .iter()
                .map(|v| {
                    json!({
                        "volume_id": v.volume_id(),
                        "name": name_tag(v.tags()),
                        "size_gib": v.size(),
                        "volume_type": v.volume_type().map(|t| t.as_str()),
                        "state": v.state().map(|s| s.as_str()),
                        "region": region,
                        "availability_zone": v.availability_zone(),
                        "encrypted": v.encrypted(),
                        "attached_to": v.attachments().iter().filter_map(|a| a.instance_id()).collect::<Vec<_>>(),
                        "created": time(v.create_time()),
                    })
                })
                .collect();
            if capped.extend(items, more) {
                break;
            }
        }
        Ok(capped)
    })
    .await;
    let (ok, region_errors) = settle(results)?;
    let (items, truncated) = merge(ok, limit);
    let mut findings = Vec::new();
    let mut unattached_gib = 0i64;
    for volume in &items {
        let id = volume["volume_id"].as_str().unwrap_or("");
        let region = volume["region"].as_str();
        if volume["state"] == "available" {
            let size = volume["size_gib"].as_i64().unwrap_or(0);
            unattached_gib += size;
            findings.push(finding("unattached_volume", "medium", id, region, format!("{size} GiB volume attached to nothing and still billed; snapshot and delete it if unused")));
        }
        if volume["encrypted"] == false {
            findings.push(finding(
                "unencrypted_volume",
                "low",
                id,
                region,
                "volume is not encrypted at rest".to_owned(),
            ));
        }
    }
    Ok(json!({
        "regions": regions,
        "count": items.len(),
        "truncated": truncated,
        "by_state": count_by(&items, "state"),
        "unattached_gib": unattached_gib,
        "findings": findings,
        "items": items,
        "region_errors": region_errors,
    }))
}

/// The internet-open ingress rules of one permission: `(cidr, protocol, ports)`.
pub(crate) fn open_ingress(
    permission: &IpPermission,
) -> Vec<(String, String, String, &'static str)> {
    let protocol = permission.ip_protocol().unwrap_or("-1");
    let all_traffic = protocol == "-1";
    let from = permission.from_port();
    let to = permission.to_port();
    let ports = match (all_traffic, from, to) {
        (true, _, _) | (false, Some(-1) | None, _) => "all".to_owned(),
        (false, Some(f), Some(t)) if f == t => f.to_string(),
        (false, Some(f), Some(t)) => format!("{f}-{t}"),
        (false, Some(f), None) => f.to_string(),
    };
    let severity = severity(protocol, from, to);
    let mut open = Vec::new();
    for range in permission.ip_ranges() {
        if range.cidr_ip() == Some("0.0.0.0/0") {
            open.push((
                "0.0.0.0/0".to_owned(),
                protocol_name(protocol),
                ports.clone(),
                severity,
            ));
        }
    }
    for range in permission.ipv6_ranges() {
        if range.cidr_ipv6() == Some("::/0") {
            open.push((
                "::/0".to_owned(),
                protocol_name(protocol),
                ports.clone(),
                severity,
            ));
        }
    }
    open
}

fn protocol_name(protocol: &str) -> String {
    match protocol {
        "-1" => "all".to_owned(),
        "6" => "tcp".to_owned(),
        "17" => "udp".to_owned(),
        "1" => "icmp".to_owned(),
        other => other.to_owned(),
    }
}

/// High for every port or a sensitive one in range; medium otherwise; low for ICMP.
fn severity(protocol: &str, from: Option<i32>, to: Option<i32>) -> &'static str {
    if protocol == "-1" {
        return "high";
    }
    if protocol == "icmp" || protocol == "1" || protocol == "icmpv6" || protocol == "58" {
        return "low";
    }
    let (from, to) = match (from, to) {
        (Some(f), Some(t)) if f >= 0 && t >= f => (f, t),
        _ => return "high",
    };
    if to - from >= 1000 || SENSITIVE_PORTS.iter().any(|(p, _)| (from..=to).contains(p)) {
        "high"
    } else {
        "medium"
    }
}

fn sensitive_names(from: Option<i32>, to: Option<i32>, protocol: &str) -> Vec<&'static str> {
    if protocol == "-1" {
        return vec!["all ports"];
    }
    match (from, to) {
        (Some(f), Some(t)) => SENSITIVE_PORTS
            .iter()
            .filter(|(p, _)| (f..=t).contains(p))
            .map(|(_, n)| *n)
            .collect(),
        _ => Vec::new(),
    }
}

/// `aws.security_groups_audit`.
pub(crate) async fn security_groups_audit(
    session: &Session,
    arguments: &Value,
) -> Result<Value, ToolError> {
    let regions = regions(arguments, session)?;
    let limit = limit(arguments, 200, super::MAX_LIMIT)?;
    let op = Operation {
        action: "ec2:DescribeSecurityGroups",
    };
    let results = fan_out(session, &regions, |region| async move {
        let client = session.ec2(&region)?;
        let mut capped = Capped::new(limit);
        let mut findings = Vec::new();
        let mut pages = client
            .describe_security_groups()
            .into_paginator()
            .page_size(page_size(session, limit, 5, 1000))
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error(op, &e))?;
            let more = page.next_token().is_some_and(|t| !t.is_empty());
            let mut items = Vec::new();
            for group in page.security_groups() {
                let id = group.group_id().unwrap_or("");
                let mut open_rules = Vec::new();
                for permission in group.ip_permissions() {
                    for (cidr, protocol, ports, severity) in open_ingress(permission) {
                        let names = sensitive_names(permission.from_port(), permission.to_port(), permission.ip_protocol().unwrap_or("-1"));
                        let what = if names.is_empty() { String::new() } else { format!(" ({})", names.join(", ")) };
                        open_rules.push(json!({"cidr": cidr, "protocol": protocol, "ports": ports}));
                        findings.push(json!({
                            "kind": "ingress_open_to_internet",
                            "severity": severity,
                            "resource": id,
                            "region": region,
                            "group_name": group.group_name(),
                            "vpc_id": group.vpc_id(),
                            "cidr": cidr,
                            "protocol": protocol,
                            "ports": ports,
                            "detail": format!("{protocol} {ports}{what} open to {cidr}; restrict the source to known addresses"),
                        }));
                    }
                }
                items.push(json!({
                    "group_id": id,
                    "group_name": group.group_name(),
                    "vpc_id": group.vpc_id(),
                    "region": region,
                    "description": group.description(),
                    "ingress_rules": group.ip_permissions().len(),
                    "open_to_internet": open_rules,
                }));
            }
            let full = capped.extend(items, more);
            if full {
                break;
            }
        }
        Ok((capped, findings))
    })
    .await;
    let (ok, region_errors) = settle(results)?;
    let mut all_findings = Vec::new();
    let mut per_region = Vec::new();
    for (region, (capped, findings)) in ok {
        // Findings only for the groups that are returned.
        let kept: Vec<&str> = capped
            .items
            .iter()
            .filter_map(|g| g["group_id"].as_str())
            .collect();
        all_findings.extend(
            findings
                .into_iter()
                .filter(|f| f["resource"].as_str().is_some_and(|id| kept.contains(&id))),
        );
        per_region.push((region, capped));
    }
    let (items, truncated) = merge(per_region, limit);
    let kept: Vec<String> = items
        .iter()
        .filter_map(|g| g["group_id"].as_str().map(str::to_owned))
        .collect();
    all_findings.retain(|f| {
        f["resource"]
            .as_str()
            .is_some_and(|id| kept.iter().any(|k| k == id))
    });
    let high = all_findings
        .iter()
        .filter(|f| f["severity"] == "high")
        .count();
    Ok(json!({
        "regions": regions,
        "count": items.len(),
        "truncated": truncated,
        "groups_open_to_internet": items.iter().filter(|g| g["open_to_internet"].as_array().is_some_and(|a| !a.is_empty())).count(),
        "high_findings": high,
        "findings": all_findings,
        "items": items,
        "region_errors": region_errors,
    }))
}

/// `aws.nat_gateways_audit`.
pub(crate) async fn nat_gateways_audit(
    session: &Session,
    arguments: &Value,
) -> Result<Value, ToolError> {
    let regions = regions(arguments, session)?;
    let limit = limit(arguments, 100, super::MAX_LIMIT)?;
    let op = Operation {
        action: "ec2:DescribeNatGateways",
    };
    let results = fan_out(session, &regions, |region| async move {
        let client = session.ec2(&region)?;
        let mut capped = Capped::new(limit);
        let mut pages = client
            .describe_nat_gateways()
            .into_paginator()
            .page_size(page_size(session, limit, 5, 1000))
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error(op, &e))?;
            let more = page.next_token().is_some_and(|t| !t.is_empty());
            let items: Vec<Value> = page
                .nat_gateways()
                .iter()
                .map(|g| {
                    json!({
                        "nat_gateway_id": g.nat_gateway_id(),
                        "name": name_tag(g.tags()),
                        "state": g.state().map(|s| s.as_str()),
                        "region": region,
                        "vpc_id": g.vpc_id(),
                        "subnet_id": g.subnet_id(),
                        "connectivity": g.connectivity_type().map(|c| c.as_str()),
                        "public_ips": g.nat_gateway_addresses().iter().filter_map(|a| a.public_ip()).collect::<Vec<_>>(),
                        "created": time(g.create_time()),
                        "failure": g.failure_message(),
                    })
                })
                .collect();
            if capped.extend(items, more) {
                break;
            }
        }
        Ok(capped)
    })
    .await;
    let (ok, region_errors) = settle(results)?;
    let (items, truncated) = merge(ok, limit);
    let mut per_vpc: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut findings = Vec::new();
    for gateway in &items {
        let id = gateway["nat_gateway_id"].as_str().unwrap_or("").to_owned();
        let region = gateway["region"].as_str().unwrap_or("").to_owned();
        match gateway["state"].as_str() {
            Some("available") => {
                let vpc = gateway["vpc_id"].as_str().unwrap_or("").to_owned();
                per_vpc.entry((region, vpc)).or_default().push(id);
            }
            Some("failed") => findings.push(finding(
                "failed_nat_gateway",
                "low",
                &id,
                Some(&region),
                "the NAT gateway failed to create; delete it".to_owned(),
            )),
            _ => {}
        }
    }
    let mut vpcs = Vec::new();
    for ((region, vpc), ids) in &per_vpc {
        if ids.len() > 1 {
            findings.push(finding("several_nat_gateways_in_vpc", "medium", vpc, Some(region), format!("{} available NAT gateways ({}) in one VPC, each billed per hour; one per availability zone in use is usually enough", ids.len(), ids.join(", "))));
        }
        vpcs.push(json!({"region": region, "vpc_id": vpc, "available_nat_gateways": ids.len()}));
    }
    Ok(json!({
        "regions": regions,
        "count": items.len(),
        "truncated": truncated,
        "by_state": count_by(&items, "state"),
        "per_vpc": vpcs,
        "findings": findings,
        "items": items,
        "region_errors": region_errors,
    }))
}

/// `aws.eips_audit`.
pub(crate) async fn eips_audit(session: &Session, arguments: &Value) -> Result<Value, ToolError> {
    let regions = regions(arguments, session)?;
    let limit = limit(arguments, 200, super::MAX_LIMIT)?;
    let op = Operation {
        action: "ec2:DescribeAddresses",
    };
    let results = fan_out(session, &regions, |region| async move {
        let client = session.ec2(&region)?;
        // DescribeAddresses has no pagination: one answer holds every address.
        let output = client
            .describe_addresses()
            .send()
            .await
            .map_err(|e| sdk_error(op, &e))?;
        let mut capped = Capped::new(limit);
        let items: Vec<Value> = output
            .addresses()
            .iter()
            .map(|a| {
                json!({
                    "public_ip": a.public_ip(),
                    "allocation_id": a.allocation_id(),
                    "association_id": present(a.association_id()),
                    "instance_id": present(a.instance_id()),
                    "network_interface_id": present(a.network_interface_id()),
                    "domain": a.domain().map(|d| d.as_str()),
                    "region": region,
                    "name": name_tag(a.tags()),
                })
            })
            .collect();
        capped.extend(items, false);
        Ok(capped)
    })
    .await;
    let (ok, region_errors) = settle(results)?;
    let (items, truncated) = merge(ok, limit);
    let findings: Vec<Value> = items
        .iter()
        .filter(|a| {
            a["association_id"].is_null()
                && a["instance_id"].is_null()
                && a["network_interface_id"].is_null()
        })
        .map(|a| {
            let ip = a["public_ip"].as_str().unwrap_or("");
            let id = a["allocation_id"].as_str().unwrap_or(ip);
            finding(
                "unassociated_address",
                "medium",
                id,
                a["region"].as_str(),
                format!(
                    "Elastic IP {ip} is associated with nothing and billed; release it or attach it"
                ),
            )
        })
        .collect();
    Ok(json!({
        "regions": regions,
        "count": items.len(),
        "truncated": truncated,
        "unassociated": findings.len(),
        "findings": findings,
        "items": items,
        "region_errors": region_errors,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{IpRange, Ipv6Range};

    fn permission(
        protocol: &str,
        from: Option<i32>,
        to: Option<i32>,
        v4: &[&str],
        v6: &[&str],
    ) -> IpPermission {
        let mut builder = IpPermission::builder().ip_protocol(protocol);
        builder = builder.set_from_port(from).set_to_port(to);
        for cidr in v4 {
            builder = builder.ip_ranges(IpRange::builder().cidr_ip(*cidr).build());
        }
        for cidr in v6 {
            builder = builder.ipv6_ranges(Ipv6Range::builder().cidr_ipv6(*cidr).build());
        }
        builder.build()
    }

    #[test]
    fn open_ingress_is_found_with_ports_and_severity() {
        type Open<'a> = Vec<(&'a str, &'a str, &'a str, &'a str)>;
        let cases: Vec<(IpPermission, Open<'_>)> = vec![
            (
                permission("tcp", Some(22), Some(22), &["0.0.0.0/0"], &[]),
                vec![("0.0.0.0/0", "tcp", "22", "high")],
            ),
            (
                permission("tcp", Some(443), Some(443), &["0.0.0.0/0"], &["::/0"]),
                vec![
                    ("0.0.0.0/0", "tcp", "443", "medium"),
                    ("::/0", "tcp", "443", "medium"),
                ],
            ),
            (
                permission("-1", None, None, &[], &["::/0"]),
                vec![("::/0", "all", "all", "high")],
            ),
            (
                permission("tcp", Some(8000), Some(8100), &["0.0.0.0/0"], &[]),
                vec![("0.0.0.0/0", "tcp", "8000-8100", "medium")],
            ),
            (
                permission("tcp", Some(5000), Some(5500), &["0.0.0.0/0"], &[]),
                vec![("0.0.0.0/0", "tcp", "5000-5500", "high")],
            ),
            (
                permission("tcp", Some(3000), Some(6000), &["0.0.0.0/0"], &[]),
                vec![("0.0.0.0/0", "tcp", "3000-6000", "high")],
            ),
            (
                permission("icmp", Some(-1), Some(-1), &["0.0.0.0/0"], &[]),
                vec![("0.0.0.0/0", "icmp", "all", "low")],
            ),
            (
                permission(
                    "tcp",
                    Some(22),
                    Some(22),
                    &["10.0.0.0/8"],
                    &["2001:db8::/32"],
                ),
                vec![],
            ),
        ];
        for (permission, expected) in cases {
            let found = open_ingress(&permission);
            let found: Vec<(&str, &str, &str, &str)> = found
                .iter()
                .map(|(c, p, ports, s)| (c.as_str(), p.as_str(), ports.as_str(), *s))
                .collect();
            assert_eq!(found, expected, "{permission:?}");
        }
    }

    #[test]
    fn capped_lists_know_when_more_exist() {
        let mut capped = Capped::new(3);
        assert!(!capped.extend(vec![1, 2], true));
        assert!(capped.extend(vec![3, 4], true));
        assert_eq!(capped.items, vec![1, 2, 3]);
        assert!(capped.truncated);
        let mut exact = Capped::new(2);
        assert!(exact.extend(vec![1, 2], false));
        assert!(!exact.truncated);
    }
}
