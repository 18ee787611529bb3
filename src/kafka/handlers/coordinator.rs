//! FindCoordinator. Consumer groups and transactions have no coordinator in
//! Strom yet, so every key is answered COORDINATOR_NOT_AVAILABLE, which
//! clients treat as "retry later". The API is still listed in ApiVersions:
//! librdkafka enables LZ4 only for brokers that list FindCoordinator v0+.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::ResponseError;

use super::str_bytes;

pub fn find(request: FindCoordinatorRequest, version: i16) -> FindCoordinatorResponse {
    let code = ResponseError::CoordinatorNotAvailable.code();
    let message = || Some(str_bytes("consumer group and transaction coordinators are not available yet"));
    let mut r = FindCoordinatorResponse::default();
    if version >= 4 {
        r.coordinators = request
            .coordinator_keys
            .into_iter()
            .map(|key| {
                Coordinator::default()
                    .with_key(key)
                    .with_node_id(BrokerId(-1))
                    .with_port(-1)
                    .with_error_code(code)
                    .with_error_message(message())
            })
            .collect();
    } else {
        r.error_code = code;
        r.node_id = BrokerId(-1);
        r.port = -1;
        if version >= 1 {
            r.error_message = message();
        }
    }
    r
}
