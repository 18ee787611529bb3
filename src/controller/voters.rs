//! Changes to the metadata quorum's voters (KIP-853's semantics), decided as
//! pure functions of what the controller sees; openraft carries them out by
//! joint consensus (`Quorum::set_voters`).
//!
//! A change is refused when it would leave the quorum unable to commit with
//! the voters that are alive now: the new voter set must have a live
//! majority (so must the old one, which joint consensus also needs, and
//! which holds while this controller commits). A node becomes a voter only
//! once it is an observer that has caught up; the last voter stays.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{ApiError, ErrorCode};

/// How far behind the leader's log an observer may be and still be
/// promoted: a few batches in flight, not a backlog.
pub const MAX_PROMOTION_LAG_ENTRIES: u64 = 100;

/// What the controller knows of the quorum when it decides.
#[derive(Debug, Clone, Default)]
pub struct QuorumView {
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
    /// The leader's match index per member.
    pub match_index: BTreeMap<u64, u64>,
    pub last_log_index: u64,
}

fn refused(message: String) -> ApiError {
    ApiError::new(ErrorCode::InvalidQuorumChange, message)
}

/// Whether `voters` can commit with only the `alive` ones.
fn has_live_majority(voters: &BTreeSet<u64>, alive: &impl Fn(u64) -> bool) -> bool {
    voters.iter().filter(|v| alive(**v)).count() * 2 > voters.len()
}

fn check_majority(now: &BTreeSet<u64>, next: &BTreeSet<u64>, alive: &impl Fn(u64) -> bool) -> Result<(), ApiError> {
    for (which, voters) in [("current", now), ("new", next)] {
        if !has_live_majority(voters, alive) {
            let live: Vec<u64> = voters.iter().copied().filter(|v| alive(*v)).collect();
            return Err(refused(format!(
                "the {which} voters {voters:?} would have {} live ({live:?}), not a majority",
                live.len()
            )));
        }
    }
    Ok(())
}

/// The voter set after promoting observer `id`.
pub fn add_voter(view: &QuorumView, id: u64, alive: impl Fn(u64) -> bool) -> Result<BTreeSet<u64>, ApiError> {
    if view.voters.contains(&id) {
        return Err(ApiError::new(ErrorCode::DuplicateVoter, format!("node {id} is a voter already")));
    }
    if !view.learners.contains(&id) {
        return Err(ApiError::new(ErrorCode::VoterNotFound, format!("node {id} is not an observer of the quorum")));
    }
    let matched = view.match_index.get(&id).copied().unwrap_or(0);
    let lag = view.last_log_index.saturating_sub(matched);
    if !alive(id) || lag > MAX_PROMOTION_LAG_ENTRIES {
        return Err(refused(format!(
            "node {id} has not caught up: {lag} entries behind (at most {MAX_PROMOTION_LAG_ENTRIES}){}",
            if alive(id) { "" } else { ", and it is not alive" }
        )));
    }
    let mut next = view.voters.clone();
    next.insert(id);
    check_majority(&view.voters, &next, &alive)?;
    Ok(next)
}

/// The voter set after voter `id` steps down to observer.
pub fn remove_voter(view: &QuorumView, id: u64, alive: impl Fn(u64) -> bool) -> Result<BTreeSet<u64>, ApiError> {
    if !view.voters.contains(&id) {
        return Err(ApiError::new(ErrorCode::VoterNotFound, format!("node {id} is not a voter")));
    }
    if view.voters.len() == 1 {
        return Err(refused(format!("node {id} is the last voter")));
    }
    let mut next = view.voters.clone();
    next.remove(&id);
    check_majority(&view.voters, &next, &alive)?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(voters: &[u64], learners: &[u64]) -> QuorumView {
        let members = voters.iter().chain(learners);
        QuorumView {
            voters: voters.iter().copied().collect(),
            learners: learners.iter().copied().collect(),
            match_index: members.map(|id| (*id, 1_000)).collect(),
            last_log_index: 1_000,
        }
    }

    #[test]
    fn a_caught_up_observer_is_promoted() {
        let next = add_voter(&view(&[1, 2, 3], &[4]), 4, |_| true).expect("promoted");
        assert_eq!(next, BTreeSet::from([1, 2, 3, 4]));
    }

    #[test]
    fn promotion_needs_an_observer_that_caught_up_and_lives() {
        let mut v = view(&[1, 2, 3], &[4]);
        assert_eq!(add_voter(&v, 2, |_| true).expect_err("voter").code, ErrorCode::DuplicateVoter);
        assert_eq!(add_voter(&v, 9, |_| true).expect_err("unknown").code, ErrorCode::VoterNotFound);
        assert_eq!(add_voter(&v, 4, |id| id != 4).expect_err("dead").code, ErrorCode::InvalidQuorumChange);
        v.match_index.insert(4, 1_000 - MAX_PROMOTION_LAG_ENTRIES - 1);
        assert_eq!(add_voter(&v, 4, |_| true).expect_err("behind").code, ErrorCode::InvalidQuorumChange);
    }

    #[test]
    fn promotion_refused_without_a_live_majority_of_the_new_set() {
        // Two of {1,2,3,4} alive is not a majority of four.
        let e = add_voter(&view(&[1, 2, 3], &[4]), 4, |id| id == 1 || id == 4).expect_err("no majority");
        assert_eq!(e.code, ErrorCode::InvalidQuorumChange);
    }

    #[test]
    fn removal_keeps_a_live_majority_and_a_voter() {
        let v = view(&[1, 2, 3], &[]);
        assert_eq!(remove_voter(&v, 3, |_| true).expect("removed"), BTreeSet::from([1, 2]));
        // 3 is down: removing 2 leaves {1, 3} with one live voter.
        let e = remove_voter(&v, 2, |id| id != 3).expect_err("no majority");
        assert_eq!(e.code, ErrorCode::InvalidQuorumChange);
        // Removing the dead one is fine.
        assert_eq!(remove_voter(&v, 3, |id| id != 3).expect("removed"), BTreeSet::from([1, 2]));
        assert_eq!(remove_voter(&view(&[1], &[]), 1, |_| true).expect_err("last").code, ErrorCode::InvalidQuorumChange);
        assert_eq!(remove_voter(&v, 7, |_| true).expect_err("unknown").code, ErrorCode::VoterNotFound);
    }
}
