//! ACLs in Kafka's model and the authorizer that reads them.
//!
//! An ACL says that a principal, from a host, is allowed or denied an
//! operation on resources of one type whose names match a literal name, the
//! wildcard `*`, or a prefix. A request is authorized as Kafka's
//! StandardAuthorizer decides:
//! 1. a super user (`super.users`) may do anything;
//! 2. a matching DENY (for the operation or ALL) refuses;
//! 3. a matching ALLOW (for the operation, ALL, or one that implies it:
//!    READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies
//!    DESCRIBE_CONFIGS) permits;
//! 4. no ACL at all for the resource: `allow.everyone.if.no.acl.found`;
//! 5. otherwise refused.
//!
//! The ACLs are metadata records. Their index is built once per set of ACLs
//! (and kept in the image that has them), so a decision is hash lookups, with
//! no lock and no allocation.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use strom_raft::records::AclBinding;
use strom_raft::MetadataImage;

use crate::config::Settings;

macro_rules! codes {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $code:literal, $text:literal;)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($variant = $code,)* }

        impl $name {
            pub const ALL_VALUES: &'static [$name] = &[$($name::$variant,)*];

            pub fn code(self) -> i8 {
                self as i8
            }

            pub fn from_code(code: i8) -> Option<Self> {
                match code {
                    $($code => Some($name::$variant),)*
                    _ => None,
                }
            }

            /// The admin API's name (lowercase, as CONTRACT's ACL object spells it).
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            pub fn from_name(name: &str) -> Option<Self> {
                let name = name.to_ascii_lowercase();
                Self::ALL_VALUES.iter().copied().find(|v| v.name() == name)
            }
        }
    };
}

codes! {
    /// Kafka's ResourceType codes, of the types Strom has.
    ResourceType {
        Topic = 2, "topic";
        Group = 3, "group";
        Cluster = 4, "cluster";
        TransactionalId = 5, "transactional_id";
    }
}

codes! {
    /// Kafka's PatternType codes of stored ACLs.
    PatternType {
        Literal = 3, "literal";
        Prefixed = 4, "prefixed";
    }
}

codes! {
    /// Kafka's AclOperation codes.
    Operation {
        All = 2, "all";
        Read = 3, "read";
        Write = 4, "write";
        Create = 5, "create";
        Delete = 6, "delete";
        Alter = 7, "alter";
        Describe = 8, "describe";
        ClusterAction = 9, "cluster_action";
        DescribeConfigs = 10, "describe_configs";
        AlterConfigs = 11, "alter_configs";
        IdempotentWrite = 12, "idempotent_write";
    }
}

codes! {
    /// Kafka's AclPermissionType codes.
    Permission {
        Deny = 2, "deny";
        Allow = 3, "allow";
    }
}

/// The one resource name of the cluster resource (Kafka's `kafka-cluster`).
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// Kafka's codes for "any" in filters (resource type, pattern, operation, permission).
pub const ANY: i8 = 1;
/// Kafka's MATCH pattern type in filters: every ACL that would apply to the name.
pub const MATCH: i8 = 2;

impl Operation {
    /// Whether an ALLOW for `self` permits `wanted`.
    fn allows(self, wanted: Operation) -> bool {
        use Operation::*;
        self == wanted
            || self == All
            || (wanted == Describe && matches!(self, Read | Write | Delete | Alter))
            || (wanted == DescribeConfigs && self == AlterConfigs)
    }
}

/// Checks a binding's fields, with Kafka's rules; the reason otherwise.
pub fn check_binding(b: &AclBinding) -> Result<(), String> {
    let rt = ResourceType::from_code(b.resource_type).ok_or("unknown resource type")?;
    PatternType::from_code(b.pattern_type).ok_or("pattern type must be literal or prefixed")?;
    Operation::from_code(b.operation).ok_or("unknown operation")?;
    Permission::from_code(b.permission).ok_or("permission must be allow or deny")?;
    if b.resource_name.is_empty() {
        return Err("the resource name must not be empty".into());
    }
    if rt == ResourceType::Cluster && b.resource_name != CLUSTER_NAME {
        return Err(format!("the cluster resource is named {CLUSTER_NAME}"));
    }
    match b.principal.split_once(':') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
        _ => return Err(format!("principal `{}` is not TYPE:NAME (e.g. User:alice or User:*)", b.principal)),
    }
    if b.host != "*" && b.host.parse::<IpAddr>().is_err() {
        return Err(format!("host `{}` is not an IP address or *", b.host));
    }
    Ok(())
}

/// A filter of DescribeAcls / DeleteAcls: `None` fields match anything;
/// the pattern type may be ANY or MATCH (Kafka's filter semantics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: Option<i8>,
    pub resource_name: Option<String>,
    pub pattern_type: Option<i8>,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Option<i8>,
    pub permission: Option<i8>,
}

impl AclFilter {
    pub fn matches(&self, b: &AclBinding) -> bool {
        let eq = |f: &Option<i8>, v: i8| f.is_none_or(|f| f == ANY || f == v);
        let name_ok = match (self.pattern_type, &self.resource_name) {
            // MATCH: every ACL that applies to the name: literal equal, the
            // wildcard, or a prefix of it.
            (Some(MATCH), Some(name)) => match PatternType::from_code(b.pattern_type) {
                Some(PatternType::Literal) => b.resource_name == *name || b.resource_name == "*",
                Some(PatternType::Prefixed) => name.starts_with(&b.resource_name),
                None => false,
            },
            (Some(MATCH), None) => true,
            (pattern, name) => eq(&pattern, b.pattern_type) && name.as_ref().is_none_or(|n| *n == b.resource_name),
        };
        name_ok
            && eq(&self.resource_type, b.resource_type)
            && self.principal.as_ref().is_none_or(|p| *p == b.principal)
            && self.host.as_ref().is_none_or(|h| *h == b.host)
            && eq(&self.operation, b.operation)
            && eq(&self.permission, b.permission)
    }
}

/// One ACL as the index keeps it.
#[derive(Debug)]
struct Entry {
    principal: String,
    /// `None`: any host.
    host: Option<IpAddr>,
    operation: Operation,
    permission: Permission,
}

#[derive(Debug, Default)]
struct TypeIndex {
    literal: HashMap<String, Vec<Entry>>,
    prefixed: HashMap<String, Vec<Entry>>,
    /// The lengths of the prefixes, so a lookup tries only those.
    prefix_lengths: Vec<usize>,
}

/// Every ACL by resource type and name, for decisions.
#[derive(Debug, Default)]
pub struct AclIndex {
    types: HashMap<ResourceType, TypeIndex>,
}

/// What the ACLs say about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
    /// No ACL names the resource at all.
    NoAcls,
}

impl AclIndex {
    pub fn build(acls: &BTreeSet<AclBinding>) -> Self {
        let mut index = AclIndex::default();
        for b in acls {
            let (Some(rt), Some(pattern), Some(operation), Some(permission)) = (
                ResourceType::from_code(b.resource_type),
                PatternType::from_code(b.pattern_type),
                Operation::from_code(b.operation),
                Permission::from_code(b.permission),
            ) else {
                continue;
            };
            let host = match b.host.as_str() {
                "*" => None,
                h => match h.parse() {
                    Ok(ip) => Some(ip),
                    Err(_) => continue,
                },
            };
            let entry = Entry { principal: b.principal.clone(), host, operation, permission };
            let t = index.types.entry(rt).or_default();
            match pattern {
                PatternType::Literal => t.literal.entry(b.resource_name.clone()).or_default().push(entry),
                PatternType::Prefixed => {
                    t.prefixed.entry(b.resource_name.clone()).or_default().push(entry);
                    if !t.prefix_lengths.contains(&b.resource_name.len()) {
                        t.prefix_lengths.push(b.resource_name.len());
                    }
                }
            }
        }
        index
    }

    fn has(&self, rt: ResourceType) -> bool {
        self.types.contains_key(&rt)
    }

    /// Whether an ALLOW of WRITE (or ALL) on some topic names `principal`
    /// from `host`, and no DENY of it on every topic (`*` literal).
    fn may_write_some_topic(&self, principal: &str, host: IpAddr) -> bool {
        let Some(t) = self.types.get(&ResourceType::Topic) else { return false };
        let who = |e: &Entry| (e.principal == principal || e.principal == "User:*") && e.host.is_none_or(|h| h == host);
        let denied_everywhere = t.literal.get("*").into_iter().flatten().any(|e| {
            who(e) && e.permission == Permission::Deny && matches!(e.operation, Operation::Write | Operation::All)
        });
        !denied_everywhere
            && t.literal
                .values()
                .chain(t.prefixed.values())
                .flatten()
                .any(|e| who(e) && e.permission == Permission::Allow && e.operation.allows(Operation::Write))
    }

    /// What the ACLs say about `principal` from `host` doing `op` on a resource.
    pub fn decide(&self, principal: &str, host: IpAddr, op: Operation, rt: ResourceType, name: &str) -> Decision {
        let Some(t) = self.types.get(&rt) else { return Decision::NoAcls };
        let literal = t.literal.get(name).into_iter().chain(t.literal.get("*"));
        let prefixed =
            t.prefix_lengths.iter().filter_map(|&len| name.get(..len)).filter_map(|prefix| t.prefixed.get(prefix));
        let mut any = false;
        let mut allowed = false;
        for entry in literal.chain(prefixed).flatten() {
            any = true;
            let who =
                (entry.principal == principal || entry.principal == "User:*") && entry.host.is_none_or(|h| h == host);
            if !who {
                continue;
            }
            match entry.permission {
                Permission::Deny if entry.operation == op || entry.operation == Operation::All => {
                    return Decision::Deny
                }
                Permission::Allow if entry.operation.allows(op) => allowed = true,
                _ => {}
            }
        }
        match (any, allowed) {
            (false, _) => Decision::NoAcls,
            (true, true) => Decision::Allow,
            (true, false) => Decision::Deny,
        }
    }
}

/// Kafka's authorizer class names that turn the authorizer on.
pub const AUTHORIZER_CLASSES: &[&str] =
    &["", "org.apache.kafka.metadata.authorizer.StandardAuthorizer", "kafka.security.authorizer.AclAuthorizer"];

/// The authorizer: off unless `authorizer.class.name` names one.
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    enabled: bool,
    super_users: Vec<String>,
    allow_if_no_acl: bool,
}

impl Authorizer {
    pub fn from_settings(settings: &Settings) -> Self {
        let enabled = settings.get("authorizer.class.name").is_some_and(|c| !c.is_empty());
        let super_users = settings
            .get("super.users")
            .unwrap_or_default()
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        Self { enabled, super_users, allow_if_no_acl: settings.bool("allow.everyone.if.no.acl.found") }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    pub fn is_super_user(&self, principal: &str) -> bool {
        self.super_users.iter().any(|s| s == principal)
    }

    /// Whether some ACL lets `principal` from `host` write to some topic
    /// (Kafka's `authorizeByResourceType`, used for idempotent producers).
    pub fn may_write_some_topic(&self, image: &MetadataImage, principal: &str, host: IpAddr) -> bool {
        if !self.enabled || self.is_super_user(principal) {
            return true;
        }
        let Some(index) = image.acl_cache.get_or_init(|| AclIndex::build(&image.acls)) else {
            return false;
        };
        index.may_write_some_topic(principal, host) || (self.allow_if_no_acl && !index.has(ResourceType::Topic))
    }

    /// Whether `principal` from `host` may do `op` on the resource.
    pub fn authorize(
        &self,
        image: &MetadataImage,
        principal: &str,
        host: IpAddr,
        op: Operation,
        rt: ResourceType,
        name: &str,
    ) -> bool {
        if !self.enabled || self.is_super_user(principal) {
            return true;
        }
        let Some(index) = image.acl_cache.get_or_init(|| AclIndex::build(&image.acls)) else {
            return false;
        };
        match index.decide(principal, host, op, rt, name) {
            Decision::Allow => true,
            Decision::Deny => false,
            Decision::NoAcls => self.allow_if_no_acl,
        }
    }
}

/// Checks an `authorizer.class.name` value.
pub fn validate_authorizer(value: &str) -> Result<String, String> {
    let v = value.trim();
    if AUTHORIZER_CLASSES.contains(&v) {
        return Ok(v.to_string());
    }
    Err(format!("Strom's authorizer answers to {} (or empty: none)", AUTHORIZER_CLASSES[1..].join(" or ")))
}

/// Checks a `super.users` value: `User:NAME;User:OTHER`.
pub fn validate_super_users(value: &str) -> Result<String, String> {
    for p in value.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        if !p.split_once(':').is_some_and(|(k, n)| !k.is_empty() && !n.is_empty()) {
            return Err(format!("`{p}` is not a principal TYPE:NAME (e.g. User:admin)"));
        }
    }
    Ok(value.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(
        rt: ResourceType,
        name: &str,
        pattern: PatternType,
        principal: &str,
        op: Operation,
        perm: Permission,
    ) -> AclBinding {
        AclBinding {
            resource_type: rt.code(),
            resource_name: name.into(),
            pattern_type: pattern.code(),
            principal: principal.into(),
            host: "*".into(),
            operation: op.code(),
            permission: perm.code(),
        }
    }

    fn image(acls: Vec<AclBinding>) -> MetadataImage {
        MetadataImage { acls: acls.into_iter().collect(), ..MetadataImage::default() }
    }

    fn on() -> Authorizer {
        Authorizer { enabled: true, super_users: vec!["User:admin".into()], allow_if_no_acl: false }
    }

    const HOST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn prefixed_allow_deny_wins_and_implied_describe() {
        use Operation::*;
        use PatternType::*;
        use ResourceType::*;
        let img = image(vec![
            acl(Topic, "a-", Prefixed, "User:alice", Write, Permission::Allow),
            acl(Topic, "a-secret", Literal, "User:alice", Write, Permission::Deny),
            acl(Group, "g", Literal, "User:alice", Read, Permission::Allow),
            acl(Topic, "*", Literal, "User:*", Describe, Permission::Allow),
        ]);
        let a = on();
        let can = |p: &str, op, rt, name: &str| a.authorize(&img, p, HOST, op, rt, name);
        assert!(can("User:alice", Write, Topic, "a-1"));
        assert!(!can("User:alice", Write, Topic, "b-1"), "no ACL for b-1 but the wildcard describe");
        assert!(!can("User:alice", Write, Topic, "a-secret"), "a DENY beats an ALLOW");
        assert!(can("User:alice", Describe, Topic, "a-secret"), "a DENY of WRITE does not deny DESCRIBE");
        assert!(can("User:bob", Describe, Topic, "anything"), "the wildcard resource and principal");
        assert!(!can("User:bob", Read, Topic, "a-1"));
        assert!(can("User:alice", Read, Group, "g"));
        assert!(can("User:alice", Describe, Group, "g"), "READ implies DESCRIBE");
        assert!(!can("User:alice", Delete, Group, "g"));
        assert!(!can("User:alice", Read, Group, "other"), "no ACL: allow.everyone.if.no.acl.found=false");
        assert!(can("User:admin", Delete, Cluster, CLUSTER_NAME), "super users may do anything");
        let everyone = Authorizer { allow_if_no_acl: true, ..on() };
        assert!(everyone.authorize(&img, "User:x", HOST, Read, Group, "other"));
        assert!(!everyone.authorize(&img, "User:x", HOST, Read, Group, "g"), "an ACL exists for g");
        assert!(Authorizer::default().authorize(&img, "User:x", HOST, Write, Topic, "a-secret"), "off: all allowed");
    }

    #[test]
    fn hosts_and_all_and_configs() {
        use Operation::*;
        let mut from_host = acl(ResourceType::Topic, "t", PatternType::Literal, "User:u", All, Permission::Allow);
        from_host.host = "10.0.0.1".into();
        let img = image(vec![
            from_host,
            acl(ResourceType::Cluster, CLUSTER_NAME, PatternType::Literal, "User:u", AlterConfigs, Permission::Allow),
        ]);
        let a = on();
        let other: IpAddr = "10.0.0.2".parse().expect("ip");
        let ten: IpAddr = "10.0.0.1".parse().expect("ip");
        assert!(a.authorize(&img, "User:u", ten, Write, ResourceType::Topic, "t"));
        assert!(!a.authorize(&img, "User:u", other, Write, ResourceType::Topic, "t"));
        assert!(a.authorize(&img, "User:u", other, DescribeConfigs, ResourceType::Cluster, CLUSTER_NAME));
        assert!(!a.authorize(&img, "User:u", other, Alter, ResourceType::Cluster, CLUSTER_NAME));
    }

    #[test]
    fn the_index_is_built_once_per_set_of_acls() {
        let mut img = image(vec![]);
        img.apply(&strom_raft::MetadataRecord::Acl {
            binding: acl(ResourceType::Topic, "t", PatternType::Literal, "User:u", Operation::Read, Permission::Allow),
        })
        .expect("applies");
        let a = on();
        assert!(a.authorize(&img, "User:u", HOST, Operation::Read, ResourceType::Topic, "t"));
        let copy = img.clone();
        let first = copy.acl_cache.get_or_init(|| -> AclIndex { unreachable!("built already") }).map(|i| i as *const _);
        assert!(first.is_some(), "a clone shares the built index");
        img.apply(&strom_raft::MetadataRecord::RemoveAcl {
            binding: acl(ResourceType::Topic, "t", PatternType::Literal, "User:u", Operation::Read, Permission::Allow),
        })
        .expect("applies");
        assert!(!a.authorize(&img, "User:u", HOST, Operation::Read, ResourceType::Topic, "t"), "rebuilt without it");
    }

    #[test]
    fn filters_match_as_kafkas_do() {
        let b =
            acl(ResourceType::Topic, "a-", PatternType::Prefixed, "User:alice", Operation::Write, Permission::Allow);
        assert!(AclFilter::default().matches(&b));
        let by_match = AclFilter { resource_name: Some("a-1".into()), pattern_type: Some(MATCH), ..Default::default() };
        assert!(by_match.matches(&b));
        let literal = AclFilter { resource_name: Some("a-1".into()), pattern_type: Some(3), ..Default::default() };
        assert!(!literal.matches(&b));
        let any = AclFilter { resource_name: Some("a-".into()), pattern_type: Some(ANY), ..Default::default() };
        assert!(any.matches(&b));
        assert!(!AclFilter { principal: Some("User:bob".into()), ..Default::default() }.matches(&b));
        assert!(check_binding(&b).is_ok());
        for bad in [
            AclBinding { operation: 99, ..b.clone() },
            AclBinding { host: "example.com".into(), ..b.clone() },
            AclBinding { principal: "alice".into(), ..b.clone() },
            AclBinding { resource_name: String::new(), ..b.clone() },
            AclBinding { resource_type: ResourceType::Cluster.code(), ..b.clone() },
        ] {
            assert!(check_binding(&bad).is_err(), "{bad:?}");
        }
    }
}
