//! `strom acl add|list|remove`: ACLs through the admin API.

use clap::{Args, Subcommand};
use serde_json::{Map, Value};

use super::table::Table;
use super::{print_json, s, AdminArgs, Api, CliResult};

/// The fields of an ACL; all optional for `remove` (a filter), and for
/// `add` host (`*`), pattern (literal) and a cluster resource's name.
#[derive(Debug, Args)]
pub struct AclFields {
    /// User:NAME, or User:* for everyone.
    #[arg(long)]
    principal: Option<String>,
    /// An IP address, or * (any).
    #[arg(long)]
    host: Option<String>,
    /// topic, group, cluster or transactional_id.
    #[arg(long = "resource-type")]
    resource_type: Option<String>,
    /// The resource's name (* for all); a prefix with --pattern prefixed.
    #[arg(long = "resource-name")]
    resource_name: Option<String>,
    /// literal or prefixed.
    #[arg(long)]
    pattern: Option<String>,
    /// all, read, write, create, delete, alter, describe, cluster_action,
    /// describe_configs, alter_configs or idempotent_write.
    #[arg(long)]
    operation: Option<String>,
    /// allow or deny.
    #[arg(long)]
    permission: Option<String>,
}

impl AclFields {
    fn body(&self) -> Value {
        let mut m = Map::new();
        for (k, v) in [
            ("principal", &self.principal),
            ("host", &self.host),
            ("resource_type", &self.resource_type),
            ("resource_name", &self.resource_name),
            ("pattern_type", &self.pattern),
            ("operation", &self.operation),
            ("permission", &self.permission),
        ] {
            if let Some(v) = v {
                m.insert(k.to_string(), Value::String(v.clone()));
            }
        }
        Value::Object(m)
    }
}

#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Add an ACL.
    Add(AclFields),
    /// Every ACL.
    List,
    /// Remove the ACLs matching the given fields (at least one is needed).
    Remove(AclFields),
}

pub async fn acl(args: AdminArgs, command: AclCommand) -> CliResult {
    let api = Api::new(&args);
    let result = match command {
        AclCommand::Add(f) => Value::Array(vec![api.call(reqwest::Method::POST, "/v1/acls", Some(f.body())).await?]),
        AclCommand::List => api.get("/v1/acls").await?,
        AclCommand::Remove(f) => {
            let body = f.body();
            if body.as_object().is_some_and(Map::is_empty) {
                return Err(
                    "give at least one field of the ACLs to remove (the API removes every ACL otherwise)".into()
                );
            }
            api.call(reqwest::Method::DELETE, "/v1/acls", Some(body)).await?
        }
    };
    if args.json {
        print_json(&result);
        return Ok(());
    }
    let mut table =
        Table::new(&["PRINCIPAL", "HOST", "RESOURCE-TYPE", "RESOURCE-NAME", "PATTERN", "OPERATION", "PERMISSION"]);
    for a in result.as_array().into_iter().flatten() {
        table.row(
            ["principal", "host", "resource_type", "resource_name", "pattern_type", "operation", "permission"]
                .iter()
                .map(|k| s(&a[*k]))
                .collect(),
        );
    }
    out!("{table}");
    Ok(())
}
