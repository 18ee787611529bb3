//! Metadata images for the controller's unit tests.

use strom_raft::{BrokerState, MetadataImage, MetadataRecord};

/// An image with brokers `registered` registered (fenced) and `active` of them unfenced.
pub fn image_with_brokers(registered: impl IntoIterator<Item = i32>, active: &[i32]) -> MetadataImage {
    let mut img = MetadataImage::default();
    for b in registered {
        img.apply(&MetadataRecord::RegisterBroker {
            broker_id: b,
            incarnation_id: 1,
            kafka: String::new(),
            admin: String::new(),
            raft: String::new(),
        })
        .expect("register");
        if active.contains(&b) {
            img.apply(&MetadataRecord::BrokerRegistrationChange { broker_id: b, state: BrokerState::Active })
                .expect("activate");
        }
    }
    img
}
