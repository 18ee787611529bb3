//! Unit tests of settings, validation and the dynamic layer.

use super::*;

#[test]
fn defaults_and_overrides() {
    let mut s = Settings::default();
    assert_eq!(s.u64("broker.session.timeout.ms"), 3000);
    assert_eq!(s.get("log.flush.interval.ms"), None);
    s.set_pair("broker.session.timeout.ms=1500").expect("set");
    assert_eq!(s.u64("broker.session.timeout.ms"), 1500);
    s.set("unclean.leader.election.enable", "TRUE").expect("set");
    assert!(s.bool("unclean.leader.election.enable"));
}

#[test]
fn bad_settings_name_the_key() {
    let mut s = Settings::default();
    let e = s.set_pair("no.such.key=1").expect_err("unknown");
    assert_eq!(e.key, "no.such.key");
    let e = s.set("log.segment.bytes", "ten").expect_err("not a number");
    assert!(e.to_string().contains("log.segment.bytes"), "{e}");
    let e = s.set("log.segment.bytes", "3").expect_err("too small");
    assert!(e.reason.contains("between 14"), "{e}");
    assert!(s.set_pair("novalue").is_err());
}

#[test]
fn topic_configs_validate_like_their_broker_setting() {
    let def = topic_def("retention.ms").expect("known");
    assert_eq!(validate(def, "retention.ms", " 1000 ").expect("valid"), "1000");
    assert!(validate(def, "retention.ms", "-2").is_err());
    assert!(topic_def("bogus").is_none());
    let cp = topic_def("cleanup.policy").expect("known");
    assert!(validate(cp, "cleanup.policy", "compact").is_ok());
    assert!(validate(cp, "cleanup.policy", "shred").is_err());
}

#[test]
fn toml_file_nested_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("node.toml");
    std::fs::write(&path, "num.partitions = 3\n[log.retention]\nms = 1000\n").expect("write");
    let mut s = Settings::default();
    s.load_file(&path).expect("load");
    assert_eq!(s.int("num.partitions"), Some(3));
    assert_eq!(s.int("log.retention.ms"), Some(1000));
    std::fs::write(&path, "num.partitions = \"x\"").expect("write");
    assert_eq!(Settings::default().load_file(&path).expect_err("bad").key, "num.partitions");
}

#[test]
fn effective_topic_configs() {
    let s = Settings::default();
    let o = BTreeMap::from([("retention.ms".to_string(), "5".to_string())]);
    let eff = s.topic_effective(&o);
    assert_eq!(eff["retention.ms"], "5");
    assert_eq!(eff["segment.bytes"], "1073741824");
    assert_eq!(eff["cleanup.policy"], "delete");
    assert!(!eff.contains_key("flush.ms"));
}

#[test]
fn dynamic_broker_configs_layer_over_static_ones() {
    let mut s = Settings::default();
    s.set("log.retention.ms", "1000").expect("set");
    let dynamic = BTreeMap::from([
        ("log.retention.ms".to_string(), "2000".to_string()),
        ("num.partitions".to_string(), "9".to_string()),
    ]);
    let l = s.layered(&dynamic);
    assert_eq!(l.int("log.retention.ms"), Some(2000));
    assert_eq!(l.int("num.partitions"), Some(1), "read-only settings ignore dynamic values");
    assert_eq!(l.topic_effective(&BTreeMap::new())["retention.ms"], "2000");
}

#[test]
fn dynamic_changes_are_validated() {
    assert_eq!(validate_dynamic("log.retention.ms", Some(" 5 ")).expect("ok"), Some("5".to_string()));
    assert_eq!(validate_dynamic("log.retention.ms", None).expect("reset"), None);
    assert!(matches!(validate_dynamic("num.partitions", Some("3")), Err(DynamicError::ReadOnly(_))));
    assert!(matches!(validate_dynamic("bogus", Some("3")), Err(DynamicError::Unknown(_))));
    assert!(matches!(validate_dynamic("message.max.bytes", Some("-1")), Err(DynamicError::Invalid(_))));
}

#[test]
fn every_topic_synonym_is_a_broker_setting() {
    for config in TOPIC_CONFIGS {
        assert!(config.setting().is_some(), "{} has no definition", config.name);
    }
}
