//! CreateAcls, DescribeAcls and DeleteAcls (KIP-140, with the prefixed
//! patterns of KIP-290).

use std::collections::BTreeMap;

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest,
    DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;
use strom_raft::records::AclBinding;

use super::str_bytes;
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;
use crate::security::acl::{self, AclFilter};

fn opt(s: &Option<StrBytes>) -> Option<String> {
    s.as_ref().map(|s| s.to_string())
}

fn filter(
    resource_type: i8,
    name: &Option<StrBytes>,
    pattern_type: i8,
    principal: &Option<StrBytes>,
    host: &Option<StrBytes>,
    operation: i8,
    permission: i8,
) -> Result<AclFilter, ApiError> {
    // UNKNOWN (0) in a filter matches nothing Kafka would store: refused.
    if [resource_type, pattern_type, operation, permission].contains(&0) {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "a filter field is UNKNOWN (0)"));
    }
    let any = |v: i8| (v != acl::ANY).then_some(v);
    Ok(AclFilter {
        resource_type: any(resource_type),
        resource_name: opt(name),
        pattern_type: any(pattern_type),
        principal: opt(principal),
        host: opt(host),
        operation: any(operation),
        permission: any(permission),
    })
}

pub async fn create(ctx: &NodeContext, request: CreateAclsRequest) -> CreateAclsResponse {
    let checked: Vec<Result<AclBinding, ApiError>> = request
        .creations
        .iter()
        .map(|c| {
            let binding = AclBinding {
                resource_type: c.resource_type,
                resource_name: c.resource_name.to_string(),
                pattern_type: c.resource_pattern_type,
                principal: c.principal.to_string(),
                host: c.host.to_string(),
                operation: c.operation,
                permission: c.permission_type,
            };
            acl::check_binding(&binding)
                .map(|()| binding)
                .map_err(|reason| ApiError::new(ErrorCode::InvalidRequest, format!("Invalid ACL: {reason}")))
        })
        .collect();
    let add: Vec<AclBinding> = checked.iter().filter_map(|r| r.as_ref().ok().cloned()).collect();
    let written = match add.is_empty() {
        true => Ok(()),
        false => crate::admin::controller_write(ctx, ControllerRequest::AlterAcls { add, remove: vec![] }).await,
    };
    let results = checked
        .into_iter()
        .map(|r| {
            let error = r.err().or_else(|| written.clone().err());
            AclCreationResult::default()
                .with_error_code(error.as_ref().map_or(0, |e| e.code.kafka_code()))
                .with_error_message(error.map(|e| str_bytes(e.message)))
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

pub fn describe(ctx: &NodeContext, request: DescribeAclsRequest) -> DescribeAclsResponse {
    let f = match filter(
        request.resource_type_filter,
        &request.resource_name_filter,
        request.pattern_type_filter,
        &request.principal_filter,
        &request.host_filter,
        request.operation,
        request.permission_type,
    ) {
        Ok(f) => f,
        Err(e) => {
            return DescribeAclsResponse::default()
                .with_error_code(e.code.kafka_code())
                .with_error_message(Some(str_bytes(e.message)))
        }
    };
    let image = ctx.quorum.image();
    let mut by_resource: BTreeMap<(i8, &str, i8), Vec<AclDescription>> = BTreeMap::new();
    for b in image.acls.iter().filter(|b| f.matches(b)) {
        by_resource.entry((b.resource_type, &b.resource_name, b.pattern_type)).or_default().push(
            AclDescription::default()
                .with_principal(str_bytes(&b.principal))
                .with_host(str_bytes(&b.host))
                .with_operation(b.operation)
                .with_permission_type(b.permission),
        );
    }
    let resources = by_resource
        .into_iter()
        .map(|((rt, name, pattern), acls)| {
            DescribeAclsResource::default()
                .with_resource_type(rt)
                .with_resource_name(str_bytes(name))
                .with_pattern_type(pattern)
                .with_acls(acls)
        })
        .collect();
    DescribeAclsResponse::default().with_resources(resources)
}

pub async fn delete(ctx: &NodeContext, request: DeleteAclsRequest) -> DeleteAclsResponse {
    let image = ctx.quorum.image();
    let matched: Vec<Result<Vec<AclBinding>, ApiError>> = request
        .filters
        .iter()
        .map(|d| {
            let f = filter(
                d.resource_type_filter,
                &d.resource_name_filter,
                d.pattern_type_filter,
                &d.principal_filter,
                &d.host_filter,
                d.operation,
                d.permission_type,
            )?;
            Ok(image.acls.iter().filter(|b| f.matches(b)).cloned().collect())
        })
        .collect();
    let mut remove: Vec<AclBinding> = matched.iter().filter_map(|m| m.as_ref().ok()).flatten().cloned().collect();
    remove.sort();
    remove.dedup();
    let written = match remove.is_empty() {
        true => Ok(()),
        false => crate::admin::controller_write(ctx, ControllerRequest::AlterAcls { add: vec![], remove }).await,
    };
    let results = matched
        .into_iter()
        .map(|m| match m.and_then(|bindings| written.clone().map(|()| bindings)) {
            Err(e) => DeleteAclsFilterResult::default()
                .with_error_code(e.code.kafka_code())
                .with_error_message(Some(str_bytes(e.message))),
            Ok(bindings) => DeleteAclsFilterResult::default().with_matching_acls(
                bindings
                    .into_iter()
                    .map(|b| {
                        DeleteAclsMatchingAcl::default()
                            .with_resource_type(b.resource_type)
                            .with_resource_name(str_bytes(b.resource_name))
                            .with_pattern_type(b.pattern_type)
                            .with_principal(str_bytes(b.principal))
                            .with_host(str_bytes(b.host))
                            .with_operation(b.operation)
                            .with_permission_type(b.permission)
                    })
                    .collect(),
            ),
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}
