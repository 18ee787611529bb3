//! Users: SCRAM credentials in the metadata quorum, shared by the Kafka
//! APIs (DescribeUserScramCredentials, AlterUserScramCredentials), the
//! admin API (`/v1/users`) and the SASL exchange.

use strom_raft::records::ScramCredential;
use strom_raft::{MetadataImage, MetadataRecord};

use super::scram::{self, ScramMechanism, StoredCredential};
use crate::error::{ApiError, ErrorCode};

/// Longest user name accepted, in characters (the OpenAPI document's maxLength).
pub const MAX_NAME_CHARS: usize = 255;

/// Checks a user name: 1 to 255 characters, no control characters.
pub fn check_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS || name.chars().any(char::is_control) {
        return Err(ApiError::new(
            ErrorCode::UnacceptableCredential,
            format!("a user name is 1 to {MAX_NAME_CHARS} characters without control characters"),
        ));
    }
    Ok(())
}

/// Checks an iteration count against Kafka's bounds.
pub fn check_iterations(iterations: i64) -> Result<u32, ApiError> {
    if iterations < scram::MIN_ITERATIONS as i64 || iterations > scram::MAX_ITERATIONS as i64 {
        return Err(ApiError::new(
            ErrorCode::UnacceptableCredential,
            format!(
                "iterations must be between {} and {}, got {iterations}",
                scram::MIN_ITERATIONS,
                scram::MAX_ITERATIONS
            ),
        ));
    }
    Ok(iterations as u32)
}

pub fn to_record(c: StoredCredential) -> ScramCredential {
    ScramCredential { salt: c.salt, stored_key: c.stored_key, server_key: c.server_key, iterations: c.iterations }
}

/// The records of a credential change: one per (user, mechanism); removing
/// a credential that does not exist writes nothing.
pub fn records(changes: &[(String, i8, Option<ScramCredential>)]) -> Result<Vec<MetadataRecord>, ApiError> {
    let mut out = Vec::with_capacity(changes.len());
    for (name, mechanism, credential) in changes {
        check_name(name)?;
        if ScramMechanism::from_kafka_code(*mechanism).is_none() {
            return Err(ApiError::new(ErrorCode::UnsupportedSaslMechanism, format!("no SCRAM mechanism {mechanism}")));
        }
        out.push(match credential {
            Some(c) => {
                check_iterations(c.iterations as i64)?;
                MetadataRecord::UserScramCredential { name: name.clone(), mechanism: *mechanism, credential: c.clone() }
            }
            None => MetadataRecord::RemoveUserScramCredential { name: name.clone(), mechanism: *mechanism },
        });
    }
    Ok(out)
}

/// Every user with their mechanisms and iteration counts, by name.
pub fn list(image: &MetadataImage) -> Vec<(String, Vec<(ScramMechanism, u32)>)> {
    image
        .scram_credentials
        .iter()
        .map(|(name, creds)| {
            let mechanisms = creds
                .iter()
                .filter_map(|(code, c)| Some((ScramMechanism::from_kafka_code(*code)?, c.iterations)))
                .collect();
            (name.clone(), mechanisms)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_changes_become_records_and_bad_ones_are_refused() {
        let cred = to_record(scram::credential_from_password(ScramMechanism::Sha256, b"pw", 4096));
        let ok = records(&[("alice".into(), 1, Some(cred.clone())), ("bob".into(), 2, None)]).expect("valid");
        assert!(matches!(&ok[0], MetadataRecord::UserScramCredential { name, mechanism: 1, .. } if name == "alice"));
        assert!(matches!(&ok[1], MetadataRecord::RemoveUserScramCredential { name, mechanism: 2 } if name == "bob"));
        let mut image = MetadataImage::default();
        for r in &ok {
            image.apply(r).expect("applies");
        }
        assert_eq!(list(&image), vec![("alice".to_string(), vec![(ScramMechanism::Sha256, 4096)])]);
        image.apply(&MetadataRecord::RemoveUserScramCredential { name: "alice".into(), mechanism: 1 }).expect("ok");
        assert!(image.scram_credentials.is_empty(), "a user without credentials is gone");

        let code = |r: Result<Vec<MetadataRecord>, ApiError>| r.expect_err("refused").code;
        assert_eq!(code(records(&[("".into(), 1, None)])), ErrorCode::UnacceptableCredential);
        assert_eq!(code(records(&[("a\n".into(), 1, None)])), ErrorCode::UnacceptableCredential);
        assert_eq!(code(records(&[("a".into(), 3, None)])), ErrorCode::UnsupportedSaslMechanism);
        let weak = ScramCredential { iterations: 10, ..cred };
        assert_eq!(code(records(&[("a".into(), 1, Some(weak))])), ErrorCode::UnacceptableCredential);
    }
}
