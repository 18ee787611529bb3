//! The broker-side assignors of KIP-848 (`group.consumer.assignors`):
//! `uniform` and `range`. Both are pure: members' subscriptions (already
//! resolved to topic names that exist) and the topics in, a target
//! assignment per member out.

use std::collections::{BTreeMap, BTreeSet};

use super::{Assignment, Topics};

/// The assignors this broker knows, by name.
pub const KNOWN: &[&str] = &["uniform", "range"];

/// One member as an assignor sees it.
#[derive(Debug, Clone)]
pub struct AssignorMember<'a> {
    pub id: &'a str,
    /// Topics it subscribes to that exist.
    pub topics: BTreeSet<String>,
    /// Its current target, for stickiness.
    pub previous: Option<&'a Assignment>,
}

/// Runs assignor `name` (one of [`KNOWN`]; anything else is `uniform`).
pub fn assign(name: &str, members: &[AssignorMember<'_>], topics: &Topics) -> BTreeMap<String, Assignment> {
    match name {
        "range" => range(members, topics),
        _ => uniform(members, topics),
    }
}

/// Kafka's range assignor, per topic: the members subscribed to it, sorted
/// by id, take its partitions in order, `P / C` each and one more for the
/// first `P % C` of them. With every member subscribed to the same topics,
/// members at the same position get the same partitions of every topic
/// (co-partitioning), and 8 partitions over 3 members give 3, 3 and 2.
pub fn range(members: &[AssignorMember<'_>], topics: &Topics) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members.iter().map(|m| (m.id.to_string(), Assignment::new())).collect();
    for (name, topic) in topics {
        let mut subscribers: Vec<&str> = members.iter().filter(|m| m.topics.contains(name)).map(|m| m.id).collect();
        if subscribers.is_empty() || topic.partitions <= 0 {
            continue;
        }
        subscribers.sort_unstable();
        let (count, members) = (topic.partitions as usize, subscribers.len());
        let (each, extra) = (count / members, count % members);
        let mut next = 0usize;
        for (i, member) in subscribers.iter().enumerate() {
            let take = each + usize::from(i < extra);
            if take == 0 {
                continue;
            }
            let partitions: BTreeSet<i32> = (next..next + take).map(|p| p as i32).collect();
            next += take;
            if let Some(a) = out.get_mut(*member) {
                a.insert(topic.id, partitions);
            }
        }
    }
    out
}

/// A balanced, sticky assignment: every member ends with as many
/// partitions as it may (at most one more than any other member that could
/// take them), and keeps what it had as far as that allows. Partitions are
/// handed out one at a time, each to the subscribed member holding fewest.
pub fn uniform(members: &[AssignorMember<'_>], topics: &Topics) -> BTreeMap<String, Assignment> {
    let mut sorted: Vec<&AssignorMember<'_>> = members.iter().collect();
    sorted.sort_by_key(|m| m.id);
    let by_id: BTreeMap<&str, &AssignorMember<'_>> = sorted.iter().map(|m| (m.id, *m)).collect();
    // Every partition someone subscribes to, in (topic, partition) order.
    let all: Vec<(&String, i32)> = topics
        .iter()
        .filter(|(name, _)| sorted.iter().any(|m| m.topics.contains(*name)))
        .flat_map(|(name, t)| (0..t.partitions.max(0)).map(move |p| (name, p)))
        .collect();
    let quota = if sorted.is_empty() { 0 } else { all.len().div_ceil(sorted.len()) };
    let mut held: BTreeMap<&str, BTreeSet<(&String, i32)>> = sorted.iter().map(|m| (m.id, BTreeSet::new())).collect();
    let mut taken: BTreeSet<(&String, i32)> = BTreeSet::new();
    // Keep: what a member had and still subscribes to, up to the quota.
    for m in &sorted {
        let Some(previous) = m.previous else { continue };
        for &(name, p) in &all {
            let had = previous.get(&topics[name].id).is_some_and(|ps| ps.contains(&p));
            let Some(h) = held.get_mut(m.id) else { continue };
            if had && h.len() < quota && m.topics.contains(name) && taken.insert((name, p)) {
                h.insert((name, p));
            }
        }
    }
    // Hand out the rest, each to the subscriber holding fewest.
    for &(name, p) in &all {
        if taken.contains(&(name, p)) {
            continue;
        }
        let fewest = held
            .iter()
            .filter(|(id, _)| by_id.get(*id).is_some_and(|m| m.topics.contains(name)))
            .min_by_key(|(id, h)| (h.len(), **id))
            .map(|(id, _)| *id);
        if let Some(id) = fewest {
            taken.insert((name, p));
            if let Some(h) = held.get_mut(id) {
                h.insert((name, p));
            }
        }
    }
    // Even out: move from the fullest to the emptiest member that could
    // take it, while they differ by more than one.
    loop {
        let most = held.iter().max_by_key(|(id, h)| (h.len(), std::cmp::Reverse(**id))).map(|(id, h)| (*id, h.len()));
        let Some((from, most_len)) = most else { break };
        let candidate = held.get(from).and_then(|h| {
            h.iter().rev().find_map(|&(name, p)| {
                held.iter()
                    .filter(|(id, other)| {
                        other.len() + 1 < most_len && by_id.get(*id).is_some_and(|m| m.topics.contains(name))
                    })
                    .min_by_key(|(id, other)| (other.len(), **id))
                    .map(|(id, _)| (*id, name, p))
            })
        });
        let Some((to, name, p)) = candidate else { break };
        if let Some(h) = held.get_mut(from) {
            h.remove(&(name, p));
        }
        if let Some(h) = held.get_mut(to) {
            h.insert((name, p));
        }
    }
    held.into_iter()
        .map(|(id, parts)| {
            let mut a = Assignment::new();
            for (name, p) in parts {
                a.entry(topics[name].id).or_default().insert(p);
            }
            (id.to_string(), a)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::TopicInfo;
    use super::*;
    use strom_raft::TopicId;

    fn topics(specs: &[(&str, i32)]) -> Topics {
        specs
            .iter()
            .enumerate()
            .map(|(i, (n, p))| (n.to_string(), TopicInfo { id: TopicId(i as u128 + 1), partitions: *p }))
            .collect()
    }

    fn member<'a>(id: &'a str, subs: &[&str], previous: Option<&'a Assignment>) -> AssignorMember<'a> {
        AssignorMember { id, topics: subs.iter().map(|s| s.to_string()).collect(), previous }
    }

    fn counts(out: &BTreeMap<String, Assignment>) -> Vec<usize> {
        out.values().map(|a| a.values().map(BTreeSet::len).sum()).collect()
    }

    fn owners_are_unique(out: &BTreeMap<String, Assignment>, total: usize) {
        let mut seen = BTreeSet::new();
        for a in out.values() {
            for (t, ps) in a {
                for p in ps {
                    assert!(seen.insert((*t, *p)), "partition {t:?}/{p} assigned twice");
                }
            }
        }
        assert_eq!(seen.len(), total, "every partition assigned");
    }

    #[test]
    fn range_gives_eight_partitions_over_three_members_as_three_three_two() {
        let t = topics(&[("orders", 8)]);
        let ms = [member("c", &["orders"], None), member("a", &["orders"], None), member("b", &["orders"], None)];
        let out = range(&ms, &t);
        let id = t["orders"].id;
        assert_eq!(out["a"][&id], (0..3).collect());
        assert_eq!(out["b"][&id], (3..6).collect());
        assert_eq!(out["c"][&id], (6..8).collect());
        owners_are_unique(&out, 8);
    }

    #[test]
    fn range_co_partitions_topics_and_skips_non_subscribers() {
        let t = topics(&[("a", 4), ("b", 4), ("c", 2)]);
        let ms = [member("m1", &["a", "b"], None), member("m2", &["a", "b", "c"], None)];
        let out = range(&ms, &t);
        let (a, b, c) = (t["a"].id, t["b"].id, t["c"].id);
        assert_eq!(out["m1"][&a], out["m1"][&b], "the same partitions of both topics");
        assert_eq!(out["m2"][&c], (0..2).collect(), "only m2 subscribes to c");
        assert!(!out["m1"].contains_key(&c));
        owners_are_unique(&out, 10);
        assert_eq!(range(&ms[..0], &t), BTreeMap::new());
    }

    #[test]
    fn uniform_balances_and_keeps_what_members_had() {
        let t = topics(&[("x", 5), ("y", 4)]);
        let ms = [member("a", &["x", "y"], None), member("b", &["x", "y"], None)];
        let first = uniform(&ms, &t);
        assert_eq!(counts(&first), vec![5, 4]);
        owners_are_unique(&first, 9);
        // A third member joins: the first two give up only what they must.
        let ms = [
            member("a", &["x", "y"], first.get("a")),
            member("b", &["x", "y"], first.get("b")),
            member("c", &["x", "y"], None),
        ];
        let second = uniform(&ms, &t);
        assert_eq!(counts(&second), vec![3, 3, 3]);
        owners_are_unique(&second, 9);
        for id in ["a", "b"] {
            for (topic, ps) in &second[id] {
                assert!(ps.is_subset(&first[id][topic]), "{id} only lost partitions, gained none");
            }
        }
    }

    #[test]
    fn uniform_respects_subscriptions_that_differ() {
        let t = topics(&[("x", 6), ("y", 2)]);
        let ms = [member("a", &["x"], None), member("b", &["x", "y"], None), member("c", &["y"], None)];
        let out = uniform(&ms, &t);
        owners_are_unique(&out, 8);
        let (x, y) = (t["x"].id, t["y"].id);
        assert!(!out["a"].contains_key(&y) && !out["c"].contains_key(&x));
        let max = counts(&out).into_iter().max().unwrap_or(0);
        assert!(max <= 4, "{out:?}");
    }
}
