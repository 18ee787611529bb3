//! DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554).

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
};

use strom_raft::records::ScramCredential;

use super::str_bytes;
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;
use crate::security::scram::{self, ScramMechanism};
use crate::security::users;

pub fn describe(
    ctx: &NodeContext,
    request: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let image = ctx.quorum.image();
    let all = users::list(&image);
    let result = |name: &str, error: Option<ApiError>, mechanisms: &[(ScramMechanism, u32)]| {
        DescribeUserScramCredentialsResult::default()
            .with_user(str_bytes(name))
            .with_error_code(error.as_ref().map_or(0, |e| e.code.kafka_code()))
            .with_error_message(error.map(|e| str_bytes(e.message)))
            .with_credential_infos(
                mechanisms
                    .iter()
                    .map(|(m, i)| CredentialInfo::default().with_mechanism(m.kafka_code()).with_iterations(*i as i32))
                    .collect(),
            )
    };
    let results = match request.users.filter(|u| !u.is_empty()) {
        None => all.iter().map(|(name, mechanisms)| result(name, None, mechanisms)).collect(),
        Some(asked) => {
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for u in &asked {
                *counts.entry(u.name.as_str()).or_default() += 1;
            }
            counts
                .into_iter()
                .map(|(name, count)| {
                    if count > 1 {
                        let e = ApiError::new(ErrorCode::DuplicateResource, "the user is named more than once");
                        return result(name, Some(e), &[]);
                    }
                    match all.iter().find(|(n, _)| n == name) {
                        Some((_, mechanisms)) => result(name, None, mechanisms),
                        None => {
                            let e = ApiError::new(ErrorCode::ResourceNotFound, "Attempt to describe nonexistent user.");
                            result(name, Some(e), &[])
                        }
                    }
                })
                .collect()
        }
    };
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

/// One credential set (`Some`) or removed: user, mechanism code, credential.
type Change = (String, i8, Option<ScramCredential>);

pub async fn alter(ctx: &NodeContext, request: AlterUserScramCredentialsRequest) -> AlterUserScramCredentialsResponse {
    let image = ctx.quorum.image();
    // Each user's changes, or the first reason to refuse them all.
    let mut per_user: BTreeMap<String, Result<Vec<Change>, ApiError>> = BTreeMap::new();
    let mut seen: BTreeSet<(String, i8)> = BTreeSet::new();
    let deletions = request.deletions.iter().map(|d| (d.name.to_string(), d.mechanism, None));
    let upsertions = request.upsertions.iter().map(|u| (u.name.to_string(), u.mechanism, Some(u)));
    for (name, mechanism, upsertion) in deletions.chain(upsertions) {
        let checked = (|| {
            users::check_name(&name)?;
            let m = ScramMechanism::from_kafka_code(mechanism).ok_or_else(|| {
                ApiError::new(ErrorCode::UnsupportedSaslMechanism, format!("unknown SCRAM mechanism {mechanism}"))
            })?;
            if !seen.insert((name.clone(), mechanism)) {
                return Err(ApiError::new(
                    ErrorCode::DuplicateResource,
                    "A user credential cannot be altered twice in the same request",
                ));
            }
            let Some(u) = upsertion else {
                if crate::security::sasl::credential(&image, &name, m).is_none() {
                    return Err(ApiError::new(
                        ErrorCode::ResourceNotFound,
                        format!("Attempt to delete a user credential that does not exist: {} {name}", m.name()),
                    ));
                }
                return Ok(None);
            };
            let iterations = users::check_iterations(u.iterations as i64)?;
            if u.salt.is_empty() || u.salted_password.is_empty() {
                return Err(ApiError::new(ErrorCode::UnacceptableCredential, "salt and salted password are required"));
            }
            let credential = scram::credential_from_salted(m, &u.salted_password, &u.salt, iterations);
            Ok(Some(users::to_record(credential)))
        })();
        let entry = per_user.entry(name.clone()).or_insert_with(|| Ok(Vec::new()));
        match (entry.as_mut(), checked) {
            (Ok(changes), Ok(credential)) => changes.push((name, mechanism, credential)),
            (Ok(_), Err(e)) => *entry = Err(e),
            (Err(_), _) => {}
        }
    }
    let changes: Vec<_> = per_user.values().filter_map(|r| r.as_ref().ok()).flatten().cloned().collect();
    let written = if changes.is_empty() {
        Ok(())
    } else {
        crate::admin::controller_write(ctx, ControllerRequest::AlterScramCredentials { changes }).await
    };
    let results = per_user
        .into_iter()
        .map(|(user, r)| {
            let error = r.err().or_else(|| written.clone().err());
            AlterUserScramCredentialsResult::default()
                .with_user(str_bytes(user))
                .with_error_code(error.as_ref().map_or(0, |e| e.code.kafka_code()))
                .with_error_message(error.map(|e| str_bytes(e.message)))
        })
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}
