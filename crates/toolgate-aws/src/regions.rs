//! Region names: the public AWS regions, checked before any request so a typo is an
//! `INVALID_ARGUMENTS` answer naming it, not a DNS failure or a silent empty result.

/// Every region the connector accepts (commercial, GovCloud and China partitions).
pub const KNOWN_REGIONS: &[&str] = &[
    "af-south-1",
    "ap-east-1",
    "ap-east-2",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-northeast-3",
    "ap-south-1",
    "ap-south-2",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-southeast-3",
    "ap-southeast-4",
    "ap-southeast-5",
    "ap-southeast-6",
    "ap-southeast-7",
    "ca-central-1",
    "ca-west-1",
    "cn-north-1",
    "cn-northwest-1",
    "eu-central-1",
    "eu-central-2",
    "eu-north-1",
    "eu-south-1",
    "eu-south-2",
    "eu-west-1",
    "eu-west-2",
    "eu-west-3",
    "il-central-1",
    "me-central-1",
    "me-south-1",
    "mx-central-1",
    "sa-east-1",
    "us-east-1",
    "us-east-2",
    "us-gov-east-1",
    "us-gov-west-1",
    "us-west-1",
    "us-west-2",
];

/// The most regions one call may fan out to.
pub const MAX_REGIONS: usize = 40;

/// Accepts a known region name; the error names the value (a region name is not a secret)
/// and the closest known one when there is one.
pub(crate) fn check_region(name: &str) -> Result<(), String> {
    if KNOWN_REGIONS.contains(&name) {
        return Ok(());
    }
    let shown: String = name.chars().take(40).collect();
    let closest = KNOWN_REGIONS
        .iter()
        .map(|known| (distance(known, name), *known))
        .min()
        .filter(|(d, _)| *d <= 2)
        .map(|(_, known)| format!(" (did you mean `{known}`?)"))
        .unwrap_or_default();
    Err(format!(
        "`{shown}` is not an AWS region{closest}; regions look like us-east-1 or eu-west-3"
    ))
}

/// Levenshtein distance, for suggestions only.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_checked_with_suggestions() {
        assert!(check_region("eu-west-3").is_ok());
        let err = check_region("us-east-7").unwrap_err();
        assert!(err.contains("did you mean `us-east-1`"), "{err}");
        let err = check_region("narnia").unwrap_err();
        assert!(
            err.contains("not an AWS region") && !err.contains("did you mean"),
            "{err}"
        );
    }
}
