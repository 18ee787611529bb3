//! The APIs authorized on the cluster resource alone, and their answers when
//! the ACLs say no: CLUSTER_AUTHORIZATION_FAILED in each response's own
//! place for it (top-level, or per item where the response has no
//! top-level error). The registry asks before calling a handler.

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::DeleteAclsFilterResult;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::security::acl::Operation;

/// The cluster operation an API needs, for those authorized on the cluster alone.
pub fn cluster_operation(api: ApiKey) -> Option<Operation> {
    use ApiKey::*;
    match api {
        DescribeCluster
        | ListPartitionReassignments
        | DescribeQuorum
        | DescribeUserScramCredentials
        | DescribeAcls
        | DescribeLogDirs => Some(Operation::Describe),
        DescribeClientQuotas => Some(Operation::DescribeConfigs),
        AlterClientQuotas => Some(Operation::AlterConfigs),
        AlterPartitionReassignments
        | ElectLeaders
        | UnregisterBroker
        | AddRaftVoter
        | RemoveRaftVoter
        | AlterUserScramCredentials
        | CreateAcls
        | DeleteAcls => Some(Operation::Alter),
        WriteTxnMarkers => Some(Operation::ClusterAction),
        _ => None,
    }
}

fn message() -> Option<StrBytes> {
    Some(StrBytes::from_static_str("Cluster authorization failed."))
}

/// The refusal of `body`, or `None` for an API [`cluster_operation`] does not name.
pub fn refusal(body: RequestKind) -> Option<ResponseKind> {
    let code = ResponseError::ClusterAuthorizationFailed.code();
    Some(match body {
        RequestKind::DescribeCluster(_) => ResponseKind::DescribeCluster(
            DescribeClusterResponse::default().with_error_code(code).with_error_message(message()),
        ),
        RequestKind::ListPartitionReassignments(_) => ResponseKind::ListPartitionReassignments(
            ListPartitionReassignmentsResponse::default().with_error_code(code).with_error_message(message()),
        ),
        RequestKind::AlterPartitionReassignments(_) => ResponseKind::AlterPartitionReassignments(
            AlterPartitionReassignmentsResponse::default().with_error_code(code).with_error_message(message()),
        ),
        RequestKind::DescribeLogDirs(_) => {
            ResponseKind::DescribeLogDirs(DescribeLogDirsResponse::default().with_error_code(code))
        }
        RequestKind::ElectLeaders(r) => ResponseKind::ElectLeaders(
            // v0 has no top-level error: every named partition carries it too.
            ElectLeadersResponse::default().with_error_code(code).with_replica_election_results(
                r.topic_partitions
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| {
                        elect_leaders_response::ReplicaElectionResult::default()
                            .with_topic(t.topic)
                            .with_partition_result(
                                t.partitions
                                    .into_iter()
                                    .map(|p| {
                                        elect_leaders_response::PartitionResult::default()
                                            .with_partition_id(p)
                                            .with_error_code(code)
                                            .with_error_message(message())
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            ),
        ),
        RequestKind::DescribeQuorum(_) => {
            ResponseKind::DescribeQuorum(DescribeQuorumResponse::default().with_error_code(code))
        }
        RequestKind::UnregisterBroker(_) => ResponseKind::UnregisterBroker(
            UnregisterBrokerResponse::default().with_error_code(code).with_error_message(message()),
        ),
        RequestKind::AddRaftVoter(_) => ResponseKind::AddRaftVoter(
            AddRaftVoterResponse::default().with_error_code(code).with_error_message(message()),
        ),
        RequestKind::RemoveRaftVoter(_) => ResponseKind::RemoveRaftVoter(
            RemoveRaftVoterResponse::default().with_error_code(code).with_error_message(message()),
        ),
        RequestKind::DescribeUserScramCredentials(_) => ResponseKind::DescribeUserScramCredentials(
            DescribeUserScramCredentialsResponse::default().with_error_code(code).with_error_message(message()),
        ),
        RequestKind::AlterUserScramCredentials(r) => {
            let mut users: Vec<StrBytes> =
                r.deletions.iter().map(|d| d.name.clone()).chain(r.upsertions.iter().map(|u| u.name.clone())).collect();
            users.sort();
            users.dedup();
            ResponseKind::AlterUserScramCredentials(
                AlterUserScramCredentialsResponse::default().with_results(
                    users
                        .into_iter()
                        .map(|u| {
                            AlterUserScramCredentialsResult::default()
                                .with_user(u)
                                .with_error_code(code)
                                .with_error_message(message())
                        })
                        .collect(),
                ),
            )
        }
        RequestKind::CreateAcls(r) => ResponseKind::CreateAcls(
            CreateAclsResponse::default().with_results(
                r.creations
                    .iter()
                    .map(|_| AclCreationResult::default().with_error_code(code).with_error_message(message()))
                    .collect(),
            ),
        ),
        RequestKind::DescribeClientQuotas(_) => ResponseKind::DescribeClientQuotas(
            DescribeClientQuotasResponse::default().with_error_code(code).with_error_message(message()),
        ),
        RequestKind::AlterClientQuotas(r) => ResponseKind::AlterClientQuotas(
            AlterClientQuotasResponse::default().with_entries(
                r.entries
                    .iter()
                    .map(|e| {
                        alter_client_quotas_response::EntryData::default()
                            .with_error_code(code)
                            .with_error_message(message())
                            .with_entity(
                                e.entity
                                    .iter()
                                    .map(|p| {
                                        alter_client_quotas_response::EntityData::default()
                                            .with_entity_type(p.entity_type.clone())
                                            .with_entity_name(p.entity_name.clone())
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            ),
        ),
        RequestKind::DescribeAcls(_) => ResponseKind::DescribeAcls(
            DescribeAclsResponse::default().with_error_code(code).with_error_message(message()),
        ),
        RequestKind::DeleteAcls(r) => ResponseKind::DeleteAcls(
            DeleteAclsResponse::default().with_filter_results(
                r.filters
                    .iter()
                    .map(|_| DeleteAclsFilterResult::default().with_error_code(code).with_error_message(message()))
                    .collect(),
            ),
        ),
        RequestKind::WriteTxnMarkers(r) => ResponseKind::WriteTxnMarkers(super::txn_markers::answer_all(&r, code)),
        _ => return None,
    })
}
