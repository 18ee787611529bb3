//! Leader election and ISR decisions when brokers come and go (pure).
//!
//! Rules (Kafka's KRaft controller): when a broker is fenced, shuts down or
//! re-registers, each partition it leads gets the first live ISR member in
//! replica order as leader; the broker leaves every ISR it is in, except that
//! an ISR is never emptied (the last member stays, so the partition can come
//! back clean when it returns). No live ISR member: the partition goes offline,
//! unless unclean election is enabled, which picks the first live replica and
//! makes it the whole ISR. The leader epoch is bumped by applying the record.

use strom_raft::{LeaderChange, MetadataImage, MetadataRecord, PartitionRegistration, TopicImage};

use super::protocol::ElectionType;
use crate::error::{ApiError, ErrorCode};

fn unclean_enabled(topic: &TopicImage, broker_default: bool) -> bool {
    topic.configs.get("unclean.leader.election.enable").map_or(broker_default, |v| v == "true")
}

/// Records that move leadership and ISR membership away from `gone`.
pub fn elections_without(image: &MetadataImage, gone: i32, unclean_default: bool) -> Vec<MetadataRecord> {
    let live = |b: i32| b != gone && image.is_active(b);
    let mut records = Vec::new();
    for topic in image.topics.values() {
        for (&partition, p) in &topic.partitions {
            if !p.replicas.contains(&gone) {
                continue;
            }
            let mut isr: Vec<i32> = p.isr.iter().copied().filter(|&b| b != gone).collect();
            let leads = p.leader == Some(gone);
            let leader = if leads {
                // A broker in maintenance or being drained leads only when no one else can.
                let candidate = p.replicas.iter().copied().find(|&b| isr.contains(&b) && live(b) && image.can_lead(b));
                match candidate.or_else(|| p.replicas.iter().copied().find(|&b| isr.contains(&b) && live(b))) {
                    Some(b) => LeaderChange::Elect(b),
                    None if unclean_enabled(topic, unclean_default) => {
                        match p.replicas.iter().copied().find(|&b| live(b)) {
                            Some(b) => {
                                isr = vec![b];
                                LeaderChange::Elect(b)
                            }
                            None => LeaderChange::None,
                        }
                    }
                    None => LeaderChange::None,
                }
            } else {
                LeaderChange::Unchanged
            };
            if isr.is_empty() {
                isr = p.isr.clone();
            }
            let isr_changed = isr != p.isr;
            if leader != LeaderChange::Unchanged || isr_changed {
                records.push(MetadataRecord::PartitionChange {
                    topic_id: topic.topic_id,
                    partition,
                    leader,
                    isr: isr_changed.then_some(isr),
                    replicas: None,
                });
            }
        }
    }
    records
}

/// Records that give `returning` (now active) the partitions that have no
/// leader and keep it in their ISR.
pub fn elections_for_returning(image: &MetadataImage, returning: i32) -> Vec<MetadataRecord> {
    let mut records = Vec::new();
    for topic in image.topics.values() {
        for (&partition, p) in &topic.partitions {
            let leaderless = p.leader.is_none_or(|l| !image.is_active(l));
            if leaderless && p.isr.contains(&returning) {
                records.push(MetadataRecord::PartitionChange {
                    topic_id: topic.topic_id,
                    partition,
                    leader: LeaderChange::Elect(returning),
                    isr: None,
                    replicas: None,
                });
            }
        }
    }
    records
}

/// Checks a leader's ISR change request against the image (KIP-497):
/// it must come from the current leader at the current leader and partition
/// epochs, and every member it adds must be an active replica.
pub fn alter_partition(
    image: &MetadataImage,
    broker_id: i32,
    topic: &str,
    partition: i32,
    leader_epoch: i32,
    partition_epoch: i32,
    isr: &[i32],
) -> Result<MetadataRecord, ApiError> {
    let t = image
        .topics
        .get(topic)
        .ok_or_else(|| ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("no topic `{topic}`")))?;
    let p = t.partitions.get(&partition).ok_or_else(|| {
        ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("no partition {topic}-{partition}"))
    })?;
    if p.leader != Some(broker_id) || p.leader_epoch != leader_epoch {
        return Err(ApiError::new(
            ErrorCode::FencedLeaderEpoch,
            format!(
                "broker {broker_id} at epoch {leader_epoch} does not lead {topic}-{partition} (epoch {})",
                p.leader_epoch
            ),
        ));
    }
    if p.partition_epoch != partition_epoch {
        return Err(ApiError::new(
            ErrorCode::InvalidUpdateVersion,
            format!("partition epoch {partition_epoch} is stale (now {})", p.partition_epoch),
        ));
    }
    if !isr.contains(&broker_id) {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "the leader must stay in the ISR"));
    }
    for b in isr {
        if !p.replicas.contains(b) || (!p.isr.contains(b) && !image.is_active(*b)) {
            return Err(ApiError::new(ErrorCode::IneligibleReplica, format!("broker {b} cannot join the ISR")));
        }
    }
    Ok(MetadataRecord::PartitionChange {
        topic_id: t.topic_id,
        partition,
        leader: LeaderChange::Unchanged,
        isr: Some(isr.to_vec()),
        replicas: None,
    })
}

/// Records that move every leadership of `broker` (entering maintenance, or
/// being drained) to the first ISR member in replica order that can lead;
/// a partition no one else can lead keeps its leader.
pub fn leaderships_away_from(image: &MetadataImage, broker: i32) -> Vec<MetadataRecord> {
    let mut records = Vec::new();
    for topic in image.topics.values() {
        for (&partition, p) in topic.partitions.iter().filter(|(_, p)| p.leader == Some(broker)) {
            if let Some(b) =
                p.replicas.iter().copied().find(|&b| b != broker && p.isr.contains(&b) && image.can_lead(b))
            {
                records.push(MetadataRecord::PartitionChange {
                    topic_id: topic.topic_id,
                    partition,
                    leader: LeaderChange::Elect(b),
                    isr: None,
                    replicas: None,
                });
            }
        }
    }
    records
}

/// Preferred-leader elections for every partition whose first replica is an
/// active ISR member that can lead but is not the leader (auto leader rebalance).
pub fn preferred_elections(image: &MetadataImage) -> Vec<MetadataRecord> {
    let mut records = Vec::new();
    for topic in image.topics.values() {
        for (&partition, p) in &topic.partitions {
            if let Some(&preferred) = p.replicas.first() {
                if p.leader != Some(preferred) && p.isr.contains(&preferred) && image.can_lead(preferred) {
                    records.push(MetadataRecord::PartitionChange {
                        topic_id: topic.topic_id,
                        partition,
                        leader: LeaderChange::Elect(preferred),
                        isr: None,
                        replicas: None,
                    });
                }
            }
        }
    }
    records
}

/// An election asked for by an operator.
pub fn elect(
    image: &MetadataImage,
    topic: &TopicImage,
    partition: i32,
    p: &PartitionRegistration,
    election: ElectionType,
) -> Result<MetadataRecord, ApiError> {
    let change = |leader: i32, isr: Option<Vec<i32>>| MetadataRecord::PartitionChange {
        topic_id: topic.topic_id,
        partition,
        leader: LeaderChange::Elect(leader),
        isr,
        replicas: None,
    };
    let leader_live = p.leader.is_some_and(|l| image.is_active(l));
    match election {
        ElectionType::Preferred => {
            let preferred = p.replicas.first().copied().ok_or_else(|| {
                ApiError::new(ErrorCode::EligibleLeadersNotAvailable, "the partition has no replicas")
            })?;
            if p.leader == Some(preferred) && leader_live {
                return Err(ApiError::new(
                    ErrorCode::ElectionNotNeeded,
                    format!("broker {preferred}, the preferred replica, already leads {}-{partition}", topic.name),
                ));
            }
            if !(image.is_active(preferred) && p.isr.contains(&preferred)) {
                return Err(ApiError::new(
                    ErrorCode::EligibleLeadersNotAvailable,
                    format!("the preferred replica {preferred} is not an active ISR member"),
                ));
            }
            Ok(change(preferred, None))
        }
        ElectionType::Unclean => {
            if leader_live {
                return Err(ApiError::new(
                    ErrorCode::ElectionNotNeeded,
                    format!("{}-{partition} has a live leader", topic.name),
                ));
            }
            if let Some(b) = p.replicas.iter().copied().find(|&b| p.isr.contains(&b) && image.is_active(b)) {
                return Ok(change(b, None));
            }
            match p.replicas.iter().copied().find(|&b| image.is_active(b)) {
                Some(b) => Ok(change(b, Some(vec![b]))),
                None => Err(ApiError::new(
                    ErrorCode::EligibleLeadersNotAvailable,
                    format!("no replica of {}-{partition} is on an active broker", topic.name),
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::image_with_brokers;
    use super::*;
    use strom_raft::{BrokerState, TopicId};

    fn image(active: &[i32], partitions: &[(Vec<i32>, Vec<i32>, Option<i32>)]) -> MetadataImage {
        let mut img = image_with_brokers(1..=4, active);
        img.apply(&MetadataRecord::Topic { name: "t".into(), topic_id: TopicId(1) }).expect("topic");
        for (i, (replicas, isr, leader)) in partitions.iter().enumerate() {
            img.apply(&MetadataRecord::Partition {
                topic_id: TopicId(1),
                partition: i as i32,
                replicas: replicas.clone(),
                isr: isr.clone(),
                leader: *leader,
            })
            .expect("partition");
        }
        img
    }

    fn apply_all(img: &mut MetadataImage, records: &[MetadataRecord]) {
        for r in records {
            img.apply(r).expect("apply");
        }
    }

    #[test]
    fn fenced_leader_hands_over_to_first_live_isr_member() {
        let mut img =
            image(&[1, 2, 3], &[(vec![1, 2, 3], vec![1, 3, 2], Some(1)), (vec![2, 1, 3], vec![2, 1], Some(2))]);
        let records = elections_without(&img, 1, false);
        assert_eq!(records.len(), 2);
        apply_all(&mut img, &records);
        let p0 = &img.topics["t"].partitions[&0];
        assert_eq!(p0.leader, Some(2), "replica order decides, not ISR order");
        assert_eq!(p0.isr, vec![3, 2]);
        assert_eq!(p0.leader_epoch, 1);
        let p1 = &img.topics["t"].partitions[&1];
        assert_eq!((p1.leader, p1.leader_epoch), (Some(2), 0), "follower loss keeps the leader epoch");
        assert_eq!(p1.isr, vec![2]);
    }

    #[test]
    fn no_live_isr_member_goes_offline_and_keeps_last_isr() {
        let mut img = image(&[1, 2, 3], &[(vec![1, 2], vec![1], Some(1))]);
        let records = elections_without(&img, 1, false);
        apply_all(&mut img, &records);
        let p = &img.topics["t"].partitions[&0];
        assert_eq!(p.leader, None);
        assert_eq!(p.isr, vec![1], "the ISR is never emptied");
        // Broker 1 comes back: it leads again, clean.
        img.apply(&MetadataRecord::BrokerRegistrationChange { broker_id: 1, state: BrokerState::Fenced }).expect("f");
        img.apply(&MetadataRecord::BrokerRegistrationChange { broker_id: 1, state: BrokerState::Active }).expect("a");
        let back = elections_for_returning(&img, 1);
        apply_all(&mut img, &back);
        assert_eq!(img.topics["t"].partitions[&0].leader, Some(1));
        assert_eq!(img.topics["t"].partitions[&0].leader_epoch, 2);
    }

    #[test]
    fn unclean_election_when_enabled() {
        let mut img = image(&[1, 2, 3], &[(vec![1, 2], vec![1], Some(1))]);
        let records = elections_without(&img, 1, true);
        apply_all(&mut img, &records);
        let p = &img.topics["t"].partitions[&0];
        assert_eq!((p.leader, p.isr.clone()), (Some(2), vec![2]));
    }

    #[test]
    fn untouched_partitions_produce_no_records() {
        let img = image(&[1, 2, 3], &[(vec![2, 3], vec![2, 3], Some(2))]);
        assert!(elections_without(&img, 1, false).is_empty());
    }

    #[test]
    fn alter_partition_checks_epochs_and_eligibility() {
        let img = image(&[1, 2, 3], &[(vec![1, 2, 3], vec![1, 2], Some(1))]);
        let ok = alter_partition(&img, 1, "t", 0, 0, 0, &[1, 2, 3]).expect("expand");
        assert!(matches!(ok, MetadataRecord::PartitionChange { isr: Some(ref i), .. } if i == &vec![1, 2, 3]));
        assert_eq!(
            alter_partition(&img, 2, "t", 0, 0, 0, &[2]).expect_err("not leader").code,
            ErrorCode::FencedLeaderEpoch
        );
        assert_eq!(alter_partition(&img, 1, "t", 0, 1, 0, &[1]).expect_err("epoch").code, ErrorCode::FencedLeaderEpoch);
        assert_eq!(
            alter_partition(&img, 1, "t", 0, 0, 7, &[1]).expect_err("stale").code,
            ErrorCode::InvalidUpdateVersion
        );
        assert_eq!(
            alter_partition(&img, 1, "t", 0, 0, 0, &[1, 4]).expect_err("not a replica").code,
            ErrorCode::IneligibleReplica
        );
        let fenced = image(&[1, 2], &[(vec![1, 2, 3], vec![1, 2], Some(1))]);
        assert_eq!(
            alter_partition(&fenced, 1, "t", 0, 0, 0, &[1, 2, 3]).expect_err("fenced").code,
            ErrorCode::IneligibleReplica
        );
        assert!(alter_partition(&fenced, 1, "t", 0, 0, 0, &[1]).is_ok(), "shrinking is always allowed");
    }

    #[test]
    fn preferred_elections_only_where_eligible() {
        let img = image(
            &[1, 2, 3],
            &[(vec![1, 2], vec![1, 2], Some(2)), (vec![4, 2], vec![4, 2], Some(2)), (vec![3, 1], vec![1], Some(1))],
        );
        let records = preferred_elections(&img);
        assert_eq!(records.len(), 1, "only partition 0: 4 is fenced, 3 is not in the ISR");
        assert!(matches!(
            records[0],
            MetadataRecord::PartitionChange { partition: 0, leader: LeaderChange::Elect(1), .. }
        ));
    }

    #[test]
    fn operator_elections() {
        let img = image(&[1, 2, 3], &[(vec![1, 2, 3], vec![1, 2, 3], Some(2)), (vec![4, 2], vec![4], None)]);
        let t = &img.topics["t"];
        let p0 = &t.partitions[&0];
        let r = elect(&img, t, 0, p0, ElectionType::Preferred).expect("preferred");
        assert!(matches!(r, MetadataRecord::PartitionChange { leader: LeaderChange::Elect(1), .. }));
        assert_eq!(elect(&img, t, 0, p0, ElectionType::Unclean).expect_err("live").code, ErrorCode::ElectionNotNeeded);
        let p1 = &t.partitions[&1];
        assert_eq!(
            elect(&img, t, 1, p1, ElectionType::Preferred).expect_err("4 is fenced").code,
            ErrorCode::EligibleLeadersNotAvailable
        );
        let r = elect(&img, t, 1, p1, ElectionType::Unclean).expect("unclean");
        assert!(
            matches!(r, MetadataRecord::PartitionChange { leader: LeaderChange::Elect(2), isr: Some(ref isr), .. } if isr == &vec![2])
        );
    }
}
