//! Cost tools: Cost Explorer spend and anomalies, Compute Optimizer rightsizing.

use std::cmp::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_costexplorer::types::{
    AnomalyDateInterval, DateInterval, Granularity, GroupDefinition, GroupDefinitionType,
    NumericOperator, TotalImpactFilter,
};
use serde_json::{Value, json};
use toolgate_core::ToolError;

use crate::errors::{Operation, sdk_error};
use crate::session::Session;
use crate::tools::{Capped, fan_out, invalid, limit, optional_string, page_size, regions, settle};

/// The most Cost Explorer pages one call follows.
const MAX_PAGES: usize = 20;

/// The longest range `aws.cost_breakdown` accepts.
const MAX_RANGE_DAYS: i64 = 366;

/// Days since 1970-01-01 of a `YYYY-MM-DD` date, or `None` when it is not a real date.
pub(crate) fn parse_date(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return None;
    }
    let year: i64 = text.get(0..4)?.parse().ok()?;
    let month: i64 = text.get(5..7)?.parse().ok()?;
    let day: i64 = text.get(8..10)?.parse().ok()?;
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if !(1..=days_in_month).contains(&day) || year < 1970 {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

/// Today (UTC) as `YYYY-MM-DD`.
fn today() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    // civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

fn date_argument(arguments: &Value, name: &str) -> Result<Option<(String, i64)>, ToolError> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => match parse_date(text) {
            Some(days) => Ok(Some((text.clone(), days))),
            None => Err(invalid(format!(
                "`{name}` must be a real date written YYYY-MM-DD, such as 2026-11-01"
            ))),
        },
        Some(_) => Err(invalid(format!(
            "`{name}` must be a date string YYYY-MM-DD"
        ))),
    }
}

fn choice<'a>(
    arguments: &Value,
    name: &str,
    allowed: &[&'a str],
    default: &'a str,
) -> Result<&'a str, ToolError> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::String(text)) => allowed
            .iter()
            .find(|a| **a == text.as_str())
            .copied()
            .ok_or_else(|| invalid(format!("`{name}` must be one of {}", allowed.join(", ")))),
        Some(_) => Err(invalid(format!(
            "`{name}` must be one of {}",
            allowed.join(", ")
        ))),
    }
}

fn amount(value: Option<&str>) -> f64 {
    value.and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

/// `aws.cost_breakdown`.
pub(crate) async fn cost_breakdown(
    session: &Session,
    arguments: &Value,
) -> Result<Value, ToolError> {
    let (start, start_day) = date_argument(arguments, "start")?
        .ok_or_else(|| invalid("`start` is missing; give the first day as YYYY-MM-DD"))?;
    let (end, end_day) = date_argument(arguments, "end")?
        .ok_or_else(|| invalid("`end` is missing; give the day after the last as YYYY-MM-DD"))?;
    if end_day <= start_day {
        return Err(invalid("`end` must be after `start` (end is exclusive)"));
    }
    if end_day - start_day > MAX_RANGE_DAYS {
        return Err(invalid(format!(
            "the range spans {} days; at most {MAX_RANGE_DAYS}",
            end_day - start_day
        )));
    }
    let granularity = choice(arguments, "granularity", &["DAILY", "MONTHLY"], "MONTHLY")?;
    let group_by = choice(
        arguments,
        "group_by",
        &[
            "SERVICE",
            "LINKED_ACCOUNT",
            "REGION",
            "USAGE_TYPE",
            "INSTANCE_TYPE",
            "PURCHASE_TYPE",
            "NONE",
        ],
        "SERVICE",
    )?;
    let metric = choice(
        arguments,
        "metric",
        &[
            "UnblendedCost",
            "BlendedCost",
            "AmortizedCost",
            "NetUnblendedCost",
            "NetAmortizedCost",
            "UsageQuantity",
        ],
        "UnblendedCost",
    )?;
    let tag_key = optional_string(arguments, "tag_key", 128)?;
    let limit = limit(arguments, 20, super::MAX_LIMIT)?;
    let interval = DateInterval::builder()
        .start(&start)
        .end(&end)
        .build()
        .map_err(|_| invalid("`start` and `end` are required"))?;
    let group = match (&tag_key, group_by) {
        (Some(key), _) => Some(
            GroupDefinition::builder()
                .r#type(GroupDefinitionType::Tag)
                .key(key)
                .build(),
        ),
        (None, "NONE") => None,
        (None, dimension) => Some(
            GroupDefinition::builder()
                .r#type(GroupDefinitionType::Dimension)
                .key(dimension)
                .build(),
        ),
    };
    let client = session.cost_explorer()?;
    let op = Operation {
        action: "ce:GetCostAndUsage",
    };
    let mut periods: Vec<Value> = Vec::new();
    let mut token: Option<String> = None;
    let mut pages_truncated = false;
    for page_number in 0..MAX_PAGES {
        let output = client
            .get_cost_and_usage()
            .time_period(interval.clone())
            .granularity(Granularity::from(granularity))
            .metrics(metric)
            .set_group_by(group.clone().map(|g| vec![g]))
            .set_next_page_token(token.clone())
            .send()
            .await
            .map_err(|e| sdk_error(op, &e))?;
        for result in output.results_by_time() {
            let period_start = result
                .time_period()
                .map(|p| p.start().to_owned())
                .unwrap_or_default();
            let period_end = result
                .time_period()
                .map(|p| p.end().to_owned())
                .unwrap_or_default();
            let total = result.total().and_then(|t| t.get(metric));
            let mut groups: Vec<(String, f64, Option<String>)> = result
                .groups()
                .iter()
                .map(|g| {
                    let value = g.metrics().and_then(|m| m.get(metric));
                    (
                        g.keys().join(" / "),
                        amount(value.and_then(|v| v.amount())),
                        value.and_then(|v| v.unit()).map(str::to_owned),
                    )
                })
                .collect();
            let existing = periods
                .iter_mut()
                .find(|p| p["start"] == period_start.as_str());
            let period = match existing {
                Some(period) => period,
                None => {
                    periods.push(json!({
                        "start": period_start,
                        "end": period_end,
                        "estimated": result.estimated(),
                        "total": total.map(|t| json!({"amount": amount(t.amount()), "unit": t.unit()})),
                        "groups": [],
                    }));
                    periods.last_mut().expect("just pushed")
                }
            };
            let list = period["groups"].as_array_mut().expect("groups is an array");
            for (keys, value, unit) in groups.drain(..) {
                list.push(json!({"keys": keys, "amount": value, "unit": unit}));
            }
        }
        token = output
            .next_page_token()
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        if token.is_none() {
            break;
        }
        if page_number + 1 == MAX_PAGES {
            pages_truncated = true;
        }
    }
    let mut truncated = pages_truncated;
    for period in &mut periods {
        let groups = period["groups"].as_array_mut().expect("groups is an array");
        groups.sort_by(|a, b| {
            b["amount"]
                .as_f64()
                .partial_cmp(&a["amount"].as_f64())
                .unwrap_or(Ordering::Equal)
        });
        let total_groups = groups.len();
        if total_groups > limit {
            groups.truncate(limit);
            truncated = true;
        }
        // Without a Total (grouped queries), the sum of the groups is the period's total.
        if period["total"].is_null() && total_groups > 0 {
            let sum: f64 = period["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|g| g["amount"].as_f64())
                .sum();
            period["group_count"] = json!(total_groups);
            period["sum_of_returned_groups"] = json!(sum);
        } else {
            period["group_count"] = json!(total_groups);
        }
    }
    Ok(json!({
        "start": start,
        "end": end,
        "granularity": granularity,
        "group_by": tag_key.map_or_else(|| group_by.to_owned(), |k| format!("TAG:{k}")),
        "metric": metric,
        "count": periods.len(),
        "truncated": truncated,
        "periods": periods,
    }))
}

/// `aws.cost_anomalies`.
pub(crate) async fn cost_anomalies(
    session: &Session,
    arguments: &Value,
) -> Result<Value, ToolError> {
    let (start, start_day) = date_argument(arguments, "start")?
        .ok_or_else(|| invalid("`start` is missing; give the first day as YYYY-MM-DD"))?;
    let (end, end_day) = date_argument(arguments, "end")?.unwrap_or_else(|| {
        let today = today();
        let days = parse_date(&today).unwrap_or(start_day);
        (today, days)
    });
    if end_day < start_day {
        return Err(invalid("`end` must not be before `start`"));
    }
    let monitor_arn = optional_string(arguments, "monitor_arn", 2048)?;
    if let Some(arn) = &monitor_arn
        && !(arn.starts_with("arn:aws")
            && arn.contains(":ce::")
            && arn.contains(":anomalymonitor/"))
    {
        return Err(invalid(
            "`monitor_arn` must be a cost anomaly monitor ARN such as arn:aws:ce::123456789012:anomalymonitor/1a2b3c4d",
        ));
    }
    let min_impact = match arguments.get("min_total_impact") {
        None | Some(Value::Null) => None,
        Some(value) => match value.as_f64() {
            Some(n) if n >= 0.0 && n.is_finite() => Some(n),
            _ => return Err(invalid("`min_total_impact` must be a number of at least 0")),
        },
    };
    let limit = limit(arguments, 50, super::MAX_LIMIT)?;
    let interval = AnomalyDateInterval::builder()
        .start_date(&start)
        .end_date(&end)
        .build()
        .map_err(|_| invalid("`start` is required"))?;
    let impact = match min_impact {
        Some(value) => Some(
            TotalImpactFilter::builder()
                .numeric_operator(NumericOperator::GreaterThanOrEqual)
                .start_value(value)
                .build()
                .map_err(|_| invalid("`min_total_impact` is malformed"))?,
        ),
        None => None,
    };
    let client = session.cost_explorer()?;
    let op = Operation {
        action: "ce:GetAnomalies",
    };
    let mut capped = Capped::new(limit);
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let output = client
            .get_anomalies()
            .date_interval(interval.clone())
            .set_monitor_arn(monitor_arn.clone())
            .set_total_impact(impact.clone())
            .max_results(page_size(session, limit, 1, 100))
            .set_next_page_token(token.clone())
            .send()
            .await
            .map_err(|e| sdk_error(op, &e))?;
        token = output
            .next_page_token()
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        let items: Vec<Value> = output
            .anomalies()
            .iter()
            .map(|a| {
                let impact = a.impact();
                json!({
                    "anomaly_id": a.anomaly_id(),
                    "start": a.anomaly_start_date(),
                    "end": a.anomaly_end_date(),
                    "dimension_value": a.dimension_value(),
                    "monitor_arn": a.monitor_arn(),
                    "total_impact_usd": impact.map(|i| i.total_impact()),
                    "max_impact_usd": impact.map(|i| i.max_impact()),
                    "total_actual_spend_usd": impact.and_then(|i| i.total_actual_spend()),
                    "total_expected_spend_usd": impact.and_then(|i| i.total_expected_spend()),
                    "total_impact_percentage": impact.and_then(|i| i.total_impact_percentage()),
                    "max_score": a.anomaly_score().map(|s| s.max_score()),
                    "feedback": a.feedback().map(|f| f.as_str()),
                    "root_causes": a.root_causes().iter().take(5).map(|c| json!({
                        "service": c.service(),
                        "region": c.region(),
                        "usage_type": c.usage_type(),
                        "linked_account": c.linked_account(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        if capped.extend(items, token.is_some()) || token.is_none() {
            break;
        }
    }
    let total_impact: f64 = capped
        .items
        .iter()
        .filter_map(|a| a["total_impact_usd"].as_f64())
        .sum();
    Ok(json!({
        "start": start,
        "end": end,
        "count": capped.items.len(),
        "truncated": capped.truncated,
        "total_impact_usd": total_impact,
        "items": capped.items,
    }))
}

const FINDINGS: &[&str] = &[
    "Overprovisioned",
    "Underprovisioned",
    "Optimized",
    "NotOptimized",
];

/// `aws.compute_optimizer_recs`.
pub(crate) async fn compute_optimizer_recs(
    session: &Session,
    arguments: &Value,
) -> Result<Value, ToolError> {
    let regions = regions(arguments, session)?;
    let limit = limit(arguments, 50, super::MAX_LIMIT)?;
    let wanted: Option<Vec<String>> = match arguments.get("findings") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) if !list.is_empty() => {
            let mut names = Vec::new();
            for entry in list {
                match entry.as_str() {
                    Some(name) if FINDINGS.contains(&name) => names.push(name.to_owned()),
                    _ => {
                        return Err(invalid(format!(
                            "`findings` may hold only {}",
                            FINDINGS.join(", ")
                        )));
                    }
                }
            }
            Some(names)
        }
        Some(_) => return Err(invalid("`findings` must be a non-empty list")),
    };
    let op = Operation {
        action: "compute-optimizer:GetEC2InstanceRecommendations",
    };
    let wanted = &wanted;
    let results = fan_out(session, &regions, |region| async move {
        let client = session.compute_optimizer(&region)?;
        let mut capped = Capped::new(limit);
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let output = client
                .get_ec2_instance_recommendations()
                .max_results(page_size(session, limit, 1, 1000))
                .set_next_token(token.clone())
                .send()
                .await
                .map_err(|e| sdk_error(op, &e))?;
            token = output.next_token().filter(|t| !t.is_empty()).map(str::to_owned);
            let items: Vec<Value> = output
                .instance_recommendations()
                .iter()
                .filter(|r| {
                    let finding = r.finding().map(|f| f.as_str().to_owned()).unwrap_or_default();
                    wanted.as_ref().is_none_or(|w| w.iter().any(|x| x.eq_ignore_ascii_case(&finding)))
                })
                .map(|r| {
                    let best = r.recommendation_options().iter().min_by_key(|o| o.rank());
                    let savings = best.and_then(|o| o.savings_opportunity());
                    json!({
                        "instance_arn": r.instance_arn(),
                        "instance_name": r.instance_name(),
                        "region": region,
                        "current_instance_type": r.current_instance_type(),
                        "finding": r.finding().map(|f| f.as_str()),
                        "reasons": r.finding_reason_codes().iter().map(|c| c.as_str()).collect::<Vec<_>>(),
                        "recommended_instance_type": best.and_then(|o| o.instance_type()),
                        "estimated_monthly_savings": savings.and_then(|s| s.estimated_monthly_savings()).map(|m| json!({
                            "amount": m.value(),
                            "currency": m.currency().map(|c| c.as_str()),
                        })),
                        "savings_percentage": savings.map(|s| s.savings_opportunity_percentage()),
                    })
                })
                .collect();
            if capped.extend(items, token.is_some()) || token.is_none() {
                break;
            }
        }
        Ok(capped)
    })
    .await;
    let (ok, region_errors) = settle(results)?;
    let mut items = Vec::new();
    let mut truncated = false;
    for (_, capped) in ok {
        truncated |= capped.truncated;
        for item in capped.items {
            if items.len() == limit {
                truncated = true;
                break;
            }
            items.push(item);
        }
    }
    let savings: f64 = items
        .iter()
        .filter_map(|i| i["estimated_monthly_savings"]["amount"].as_f64())
        .sum();
    Ok(json!({
        "regions": regions,
        "count": items.len(),
        "truncated": truncated,
        "estimated_monthly_savings_total": savings,
        "items": items,
        "region_errors": region_errors,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_real_dates() {
        assert_eq!(parse_date("1970-01-01"), Some(0));
        assert_eq!(
            parse_date("2024-03-01").unwrap() - parse_date("2024-02-01").unwrap(),
            29
        );
        assert_eq!(
            parse_date("2025-03-01").unwrap() - parse_date("2025-02-01").unwrap(),
            28
        );
        for bad in [
            "2025-02-29",
            "2025-13-01",
            "2025-1-01",
            "20250101",
            "2025-00-10",
            "abcd-ef-gh",
        ] {
            assert_eq!(parse_date(bad), None, "{bad}");
        }
        assert!(parse_date(&today()).is_some());
    }
}
