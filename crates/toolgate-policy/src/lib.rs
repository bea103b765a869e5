//! Placeholder until the policy crate lands.
