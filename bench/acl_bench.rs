//! The cost of an ACL decision: `cargo run --release --example acl_bench`.
//!
//! Builds an image with N ACLs (literal and prefixed, over many topics and
//! principals), then times `Authorizer::authorize` for topics that match a
//! literal ACL, a prefixed one, and none, and prints nanoseconds per decision.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use strom::config::Settings;
use strom::security::acl::{Authorizer, Operation, PatternType, Permission, ResourceType};
use strom_raft::records::AclBinding;
use strom_raft::{MetadataImage, MetadataRecord};

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let mut image = MetadataImage::default();
    for i in 0..n {
        let (name, pattern) = match i % 2 {
            0 => (format!("topic-{i}"), PatternType::Literal),
            _ => (format!("team-{i}-"), PatternType::Prefixed),
        };
        let binding = AclBinding {
            resource_type: ResourceType::Topic.code(),
            resource_name: name,
            pattern_type: pattern.code(),
            principal: format!("User:user-{}", i % 50),
            host: "*".into(),
            operation: Operation::Write.code(),
            permission: Permission::Allow.code(),
        };
        image.apply(&MetadataRecord::Acl { binding }).expect("applies");
    }
    let mut settings = Settings::default();
    settings.set("authorizer.class.name", "org.apache.kafka.metadata.authorizer.StandardAuthorizer").expect("set");
    let authorizer = Authorizer::from_settings(&settings);
    let host = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let cases = [
        ("literal match", "User:user-0", "topic-0"),
        ("prefixed match", "User:user-1", "team-1-orders"),
        ("no acl for the topic", "User:user-0", "unrelated-topic-name"),
    ];
    // The first decision builds the index; it is not timed.
    assert!(authorizer.authorize(&image, "User:user-0", host, Operation::Write, ResourceType::Topic, "topic-0"));
    println!("{n} ACLs");
    for (what, principal, topic) in cases {
        let rounds = 2_000_000u32;
        let started = Instant::now();
        let mut allowed = 0u32;
        for _ in 0..rounds {
            let ok = authorizer.authorize(&image, principal, host, Operation::Write, ResourceType::Topic, topic);
            allowed += u32::from(std::hint::black_box(ok));
        }
        let ns = started.elapsed().as_nanos() as f64 / f64::from(rounds);
        println!("{what:>22}: {ns:6.1} ns per decision ({allowed} of {rounds} allowed)");
    }
}
