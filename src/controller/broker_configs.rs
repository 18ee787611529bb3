//! Dynamic broker config decisions (pure): validate a change to the
//! cluster-wide defaults (KIP-226's default broker resource) or to one
//! broker's configs, and return the Config records that carry it out. Brokers apply the records from the image
//! ([`crate::config::Settings::layered`]); nothing here touches a broker.
//!
//! Errors follow Kafka: an unknown name is INVALID_CONFIG; a setting Kafka
//! does not let change at runtime, or a bad value, is INVALID_REQUEST
//! ("Cannot update these configs dynamically", "Invalid config value").

use std::collections::BTreeMap;

use strom_raft::{ConfigResource, MetadataImage, MetadataRecord};

use crate::config::{validate_dynamic, DynamicError};
use crate::error::{ApiError, ErrorCode};

/// A refused dynamic change as Kafka answers it.
pub fn dynamic_error(e: DynamicError) -> ApiError {
    match e {
        DynamicError::Unknown(_) => ApiError::new(ErrorCode::InvalidConfig, e.to_string()),
        DynamicError::ReadOnly(_) => ApiError::new(ErrorCode::InvalidRequest, e.to_string()),
        DynamicError::Invalid(_) => {
            ApiError::new(ErrorCode::InvalidRequest, format!("invalid broker config value: {e}"))
        }
    }
}

/// Validates every change first: all or nothing, as Kafka does per resource.
pub fn alter(
    image: &MetadataImage,
    broker_id: Option<i32>,
    changes: &BTreeMap<String, Option<String>>,
) -> Result<Vec<MetadataRecord>, ApiError> {
    let resource = match broker_id {
        None => ConfigResource::Broker,
        Some(id) if image.brokers.contains_key(&id) => ConfigResource::BrokerId(id),
        Some(id) => return Err(ApiError::new(ErrorCode::InvalidRequest, format!("broker {id} is not registered"))),
    };
    changes
        .iter()
        .map(|(key, value)| {
            let value = validate_dynamic(key, value.as_deref()).map_err(dynamic_error)?;
            Ok(MetadataRecord::Config { resource: resource.clone(), key: key.clone(), value })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::test_support::image_with_brokers;

    #[test]
    fn changes_become_broker_config_records() {
        let mut img = image_with_brokers([1, 2], &[1, 2]);
        let set = BTreeMap::from([("log.retention.ms".to_string(), Some("60000".to_string()))]);
        for broker in [None, Some(2)] {
            for r in alter(&img, broker, &set).expect("set") {
                img.apply(&r).expect("apply");
            }
        }
        assert_eq!(img.broker_configs["log.retention.ms"], "60000");
        assert_eq!(img.per_broker_configs[&2]["log.retention.ms"], "60000");
        let reset = BTreeMap::from([("log.retention.ms".to_string(), None)]);
        for broker in [None, Some(2)] {
            for r in alter(&img, broker, &reset).expect("reset") {
                img.apply(&r).expect("apply");
            }
        }
        assert!(img.broker_configs.is_empty() && img.per_broker_configs.is_empty());
        assert_eq!(alter(&img, Some(9), &set).expect_err("unknown broker").code, ErrorCode::InvalidRequest);
    }

    #[test]
    fn refusals_use_kafkas_codes() {
        let img = image_with_brokers([1], &[1]);
        let one = |k: &str, v: &str| alter(&img, None, &BTreeMap::from([(k.to_string(), Some(v.to_string()))]));
        assert_eq!(one("num.partitions", "3").expect_err("read-only").code, ErrorCode::InvalidRequest);
        assert_eq!(one("message.max.bytes", "big").expect_err("bad").code, ErrorCode::InvalidRequest);
        assert_eq!(one("no.such.config", "1").expect_err("unknown").code, ErrorCode::InvalidConfig);
        let mixed = BTreeMap::from([
            ("log.retention.ms".to_string(), Some("1".to_string())),
            ("num.partitions".to_string(), Some("3".to_string())),
        ]);
        assert!(alter(&img, Some(1), &mixed).is_err(), "nothing is written when one change is refused");
    }
}
