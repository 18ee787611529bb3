//! Regular expressions matched against whole names: KIP-848's topic
//! subscriptions and KIP-1152's transactional id filter. Kafka compiles
//! both with RE2/J and calls `matches()`; the `regex` crate speaks the same
//! RE2 syntax. Compiled patterns are cached, since a member's pattern is
//! matched against every topic name at each target refresh.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Compiled patterns (`None`: not valid). Bounded: past
/// `MAX_CACHED_PATTERNS` it starts over.
static PATTERNS: Mutex<BTreeMap<String, Option<regex::Regex>>> = Mutex::new(BTreeMap::new());
const MAX_CACHED_PATTERNS: usize = 1024;

/// `regex` compiled to match a whole name; `None` if it is not valid.
pub fn whole_names(regex: &str) -> Option<regex::Regex> {
    let mut cache = PATTERNS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(compiled) = cache.get(regex) {
        return compiled.clone();
    }
    if cache.len() >= MAX_CACHED_PATTERNS {
        cache.clear();
    }
    // Valid on its own first: `a)|(b` would otherwise slip out of the anchors.
    let compiled = regex::Regex::new(regex).ok().and_then(|_| regex::Regex::new(&format!("^(?:{regex})$")).ok());
    cache.insert(regex.to_string(), compiled.clone());
    compiled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_must_be_valid_alone_and_match_whole_names() {
        assert!(whole_names("a)|(b").is_none(), "it would escape the anchors");
        assert!(whole_names("(").is_none());
        let re = whole_names("orders-.*").expect("valid");
        assert!(re.is_match("orders-eu") && !re.is_match("old-orders-eu"));
        // Cached: the same pattern again is the same answer.
        assert!(whole_names("orders-.*").is_some_and(|again| again.as_str() == re.as_str()));
    }
}
