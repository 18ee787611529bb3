//! Runs openraft's storage conformance suite against the sled log store and
//! state machine.

use openraft::testing::{StoreBuilder, Suite};
use strom_raft::durable::Durable;
use strom_raft::log_store::LogStore;
use strom_raft::state_machine::StateMachine;
use strom_raft::types::{StorageError, TypeConfig};

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for SledBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open sled");
        let durable = Durable::open(dir.path()).expect("durable");
        let log = LogStore::open(&db, durable.clone()).expect("log store");
        let (sm, _rx) = StateMachine::open(&db, durable)?;
        Ok((dir, log, sm))
    }
}

#[test]
fn sled_store_passes_openraft_suite() {
    if let Err(e) = Suite::test_all(SledBuilder) {
        panic!("openraft storage suite failed: {e}");
    }
}

#[test]
fn corrupt_state_is_an_error_not_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::open(dir.path()).expect("open sled");
    db.open_tree("sm").expect("tree").insert(b"state", &[0xff, 0xfe, 0x01][..]).expect("insert");
    assert!(StateMachine::open(&db, Durable::open(dir.path()).expect("durable")).is_err());
}
