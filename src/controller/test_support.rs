//! Metadata images for the controller's unit tests.

use strom_raft::{BrokerState, MetadataImage, MetadataRecord, TopicId};

/// An image with brokers `registered` registered (fenced) and `active` of them unfenced.
pub fn image_with_brokers(registered: impl IntoIterator<Item = i32>, active: &[i32]) -> MetadataImage {
    let racked: Vec<(i32, Option<&str>)> = registered.into_iter().map(|b| (b, None)).collect();
    image_with_racks(&racked, active)
}

/// As [`image_with_brokers`], each broker with its `broker.rack`.
pub fn image_with_racks(registered: &[(i32, Option<&str>)], active: &[i32]) -> MetadataImage {
    let mut img = MetadataImage::default();
    for &(b, rack) in registered {
        img.apply(&MetadataRecord::RegisterBroker {
            broker_id: b,
            incarnation_id: 1,
            kafka: String::new(),
            admin: String::new(),
            raft: String::new(),
            rack: rack.map(str::to_string),
            listeners: vec![],
        })
        .expect("register");
        if active.contains(&b) {
            img.apply(&MetadataRecord::BrokerRegistrationChange { broker_id: b, state: BrokerState::Active })
                .expect("activate");
        }
    }
    img
}

/// Adds topic `name` with one partition per replica list, each led by its
/// first replica with every replica in sync.
pub fn add_topic(img: &mut MetadataImage, name: &str, topic_id: TopicId, partitions: &[Vec<i32>]) {
    img.apply(&MetadataRecord::Topic { name: name.into(), topic_id }).expect("topic");
    for (i, replicas) in partitions.iter().enumerate() {
        img.apply(&MetadataRecord::Partition {
            topic_id,
            partition: i as i32,
            replicas: replicas.clone(),
            isr: replicas.clone(),
            leader: replicas.first().copied(),
        })
        .expect("partition");
    }
}
