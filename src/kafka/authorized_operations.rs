//! The `authorized_operations` bit fields of Metadata, DescribeCluster and
//! DescribeGroups (KIP-430): which ACL operations the caller may perform on
//! a resource, asked for with `include_*_authorized_operations`.
//!
//! Without an authorizer Kafka answers every operation the resource type
//! supports; with one, those the caller's ACLs allow. Callers pass the
//! authorizer's answer as `allowed`.

use crate::security::acl::Operation;

/// Kafka's ACL operation codes (`org.apache.kafka.common.acl.AclOperation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AclOperation {
    Read = 3,
    Write = 4,
    Create = 5,
    Delete = 6,
    Alter = 7,
    Describe = 8,
    ClusterAction = 9,
    DescribeConfigs = 10,
    AlterConfigs = 11,
    IdempotentWrite = 12,
}

/// The resource types whose operations these APIs report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Topic,
    Group,
    Cluster,
}

/// The value of an `authorized_operations` field the client did not ask for.
pub const NOT_REQUESTED: i32 = i32::MIN;

/// The operations Kafka supports on each resource type (`AclEntry.supportedOperations`).
pub fn supported_operations(resource: Resource) -> &'static [AclOperation] {
    use AclOperation::*;
    match resource {
        Resource::Topic => &[Read, Write, Create, Describe, Delete, Alter, DescribeConfigs, AlterConfigs],
        Resource::Group => &[Read, Describe, Delete],
        Resource::Cluster => &[Create, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, Alter, Describe],
    }
}

/// The field's value: a bit per operation the caller may perform (the
/// supported ones `allowed` says yes to) when `requested`, else [`NOT_REQUESTED`].
pub fn authorized_operations(resource: Resource, requested: bool, allowed: impl Fn(Operation) -> bool) -> i32 {
    if !requested {
        return NOT_REQUESTED;
    }
    supported_operations(resource)
        .iter()
        .filter(|op| Operation::from_code(**op as i8).is_some_and(&allowed))
        .fold(0, |bits, op| bits | 1 << (*op as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(resource: Resource, requested: bool) -> i32 {
        authorized_operations(resource, requested, |_| true)
    }

    #[test]
    fn every_supported_operation_is_one_bit() {
        assert_eq!(all(Resource::Topic, true).count_ones(), 8);
        assert_eq!(all(Resource::Cluster, true).count_ones(), 7);
        assert_eq!(all(Resource::Group, true).count_ones(), 3);
        // READ, DESCRIBE and DELETE: bits 3, 8 and 6.
        assert_eq!(all(Resource::Group, true), (1 << 3) | (1 << 8) | (1 << 6));
    }

    #[test]
    fn the_authorizer_narrows_the_bits() {
        assert_eq!(authorized_operations(Resource::Group, true, |op| op == Operation::Read), 1 << 3);
        assert_eq!(authorized_operations(Resource::Topic, true, |_| false), 0);
    }

    #[test]
    fn not_requested_is_kafkas_sentinel() {
        assert_eq!(all(Resource::Topic, false), i32::MIN);
    }
}
