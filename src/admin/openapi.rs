//! The OpenAPI 3 description of the admin API, served at `/v1/openapi.json`.

use axum::Json;
use serde_json::{json, Value};

fn op(summary: &str, responses: &[(&str, &str)]) -> Value {
    let responses: serde_json::Map<String, Value> = responses
        .iter()
        .map(|(code, desc)| {
            let body = if code.starts_with('2') && *code != "204" {
                json!({"description": desc, "content": {"application/json": {}}})
            } else if *code == "204" {
                json!({"description": desc})
            } else {
                json!({"description": desc, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
            };
            (code.to_string(), body)
        })
        .collect();
    json!({"summary": summary, "responses": responses})
}

fn with_body(mut operation: Value, schema: &str) -> Value {
    operation["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}});
    operation
}

fn path_param(name: &str, kind: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": kind}})
}

/// An integer path parameter with the bounds the server parses it within
/// (a number outside them is answered 400 `INVALID_REQUEST`).
fn int_param(name: &str, min: i64, max: i64) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "integer", "minimum": min, "maximum": max}})
}

/// A config value as the server takes it: a string, a number or a boolean
/// (sent on as its text).
fn config_value() -> Value {
    json!({"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]})
}

/// `{key: value or null}` over exactly `keys` (any other key is answered 400).
fn config_changes(keys: &[&str], description: &str) -> Value {
    let mut value = config_value();
    value["nullable"] = json!(true);
    let properties: serde_json::Map<String, Value> = keys.iter().map(|k| (k.to_string(), value.clone())).collect();
    json!({"type": "object", "additionalProperties": false, "properties": properties, "description": description})
}

/// Marks a schema nullable. OpenAPI 3.0 wants null listed in an enum too.
fn nullable(schema: &mut Value) {
    schema["nullable"] = json!(true);
    if let Some(values) = schema.get_mut("enum").and_then(Value::as_array_mut) {
        values.push(Value::Null);
    }
}

/// An ACL's fields. Those a missing value defaults (host, pattern_type) take
/// null for the default; in a filter every field does, null matching anything.
fn acl_properties(filter: bool) -> Value {
    let mut properties = json!({
        "principal": {"type": "string", "pattern": "^[^:]+:.+$", "example": "User:alice"},
        "host": {"anyOf": [{"type": "string", "enum": ["*"]}, {"type": "string", "format": "ipv4"}, {"type": "string", "format": "ipv6"}], "description": "an IP address, or * (the default)"},
        "resource_type": {"type": "string", "enum": ["topic", "group", "cluster", "transactional_id"]},
        "resource_name": {"type": "string", "minLength": 1, "description": "a name, * for all; kafka-cluster for the cluster"},
        "pattern_type": {"type": "string", "enum": ["literal", "prefixed"]},
        "operation": {"type": "string", "enum": ["all", "read", "write", "create", "delete", "alter", "describe", "cluster_action", "describe_configs", "alter_configs", "idempotent_write"]},
        "permission": {"type": "string", "enum": ["allow", "deny"]},
    });
    let defaulted = ["host", "pattern_type"];
    for (name, schema) in properties.as_object_mut().into_iter().flatten() {
        if filter && name == "host" {
            // A filter's host is matched as given.
            *schema = json!({"type": "string", "description": "an IP address, or *"});
        }
        if filter && matches!(name.as_str(), "resource_name" | "principal") {
            // A filter's name and principal are matched as given too: "" or a
            // principal without a type match no ACL.
            if let Some(o) = schema.as_object_mut() {
                o.remove("minLength");
                o.remove("pattern");
            }
        }
        if filter || defaulted.contains(&name.as_str()) {
            nullable(schema);
        }
    }
    properties
}

/// Every topic-level config key the server takes.
fn topic_config_keys() -> Vec<&'static str> {
    crate::config::topic::TOPIC_CONFIGS
        .iter()
        .map(|d| d.name)
        .filter(|name| crate::config::topic::topic_def(name).is_some())
        .collect()
}

fn topic_config_values() -> Value {
    Value::Object(topic_config_keys().into_iter().map(|k| (k.to_string(), config_value())).collect())
}

/// The broker settings that can change at runtime.
fn dynamic_broker_keys() -> Vec<&'static str> {
    crate::config::BROKER_SETTINGS.iter().filter(|d| d.dynamic).map(|d| d.name).collect()
}

pub fn spec() -> Value {
    let topic = path_param("name", "string");
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Strom admin API", "version": env!("CARGO_PKG_VERSION")},
        "paths": {
            "/health": {"get": op("200 while the process serves", &[("200", "serving")])},
            "/ready": {"get": {"summary": "Caught up with the metadata log and an unfenced broker", "responses": {
                "200": {"description": "ready", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Readiness"}}}},
                "503": {"description": "not ready (yet): catching up, fenced, or not a registered broker", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Readiness"}}}}}}},
            "/metrics": {"get": {"summary": "Prometheus text format", "responses": {"200": {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/v1/cluster": {"get": op("Controller, quorum and brokers", &[("200", "cluster")])},
            "/v1/brokers": {"get": op("Registered brokers", &[("200", "brokers")])},
            "/v1/brokers/{id}": {
                "parameters": [int_param("id", i64::from(i32::MIN), i64::from(i32::MAX))],
                "get": op("One broker: state, replica and leader counts, maintenance, drain progress", &[("200", "broker"), ("400", "invalid"), ("404", "BROKER_ID_NOT_REGISTERED")]),
                "delete": op("Unregister a broker that is fenced or drained and holds no replica", &[("204", "unregistered"), ("400", "invalid"), ("404", "BROKER_ID_NOT_REGISTERED"), ("409", "BROKER_NOT_EMPTY: holds replicas, or alive and not drained"), ("503", "no controller")]),
            },
            "/v1/brokers/{id}/decommission": {
                "parameters": [int_param("id", i64::from(i32::MIN), i64::from(i32::MAX))],
                "post": op("Drain the broker: leaderships, then replicas move away; it is unregistered once empty", &[("202", "broker, with its decommission progress"), ("400", "invalid"), ("404", "BROKER_ID_NOT_REGISTERED"), ("409", "NOT_ENOUGH_BROKERS: the others cannot hold the replication factors"), ("503", "no controller")]),
                "delete": op("Stop a drain", &[("200", "broker"), ("400", "invalid"), ("404", "BROKER_ID_NOT_REGISTERED"), ("503", "no controller")]),
            },
            "/v1/brokers/{id}/maintenance": {
                "parameters": [int_param("id", i64::from(i32::MIN), i64::from(i32::MAX))],
                "put": op("Enter maintenance: the broker keeps its replicas and leads nothing", &[("200", "broker"), ("400", "invalid"), ("404", "BROKER_ID_NOT_REGISTERED"), ("503", "no controller")]),
                "delete": op("Leave maintenance", &[("200", "broker"), ("400", "invalid"), ("404", "BROKER_ID_NOT_REGISTERED"), ("503", "no controller")]),
            },
            "/v1/brokers/configs": {
                "get": op("Dynamic broker settings with their cluster-wide values in force", &[("200", "settings")]),
                "patch": with_body(op("Set (value) or reset (null) cluster-wide dynamic broker settings, applied at runtime on every broker", &[("200", "settings"), ("400", "INVALID_CONFIG (unknown key) or INVALID_REQUEST (not dynamic, bad value)"), ("503", "no controller")]), "BrokerConfigChanges"),
            },
            "/v1/topics": {
                "get": op("List topics", &[("200", "topics")]),
                "post": with_body(op("Create a topic", &[("201", "created"), ("400", "invalid"), ("409", "exists"), ("503", "no controller")]), "CreateTopic"),
            },
            "/v1/topics/{name}": {
                "parameters": [topic],
                "get": op("Describe a topic", &[("200", "topic"), ("404", "unknown")]),
                "delete": op("Delete a topic", &[("204", "deleted"), ("404", "unknown"), ("503", "no controller")]),
            },
            "/v1/topics/{name}/partitions": {
                "parameters": [topic],
                "post": with_body(op("Grow the partition count to a new total", &[("200", "topic"), ("400", "not larger"), ("404", "unknown")]), "AddPartitions"),
            },
            "/v1/topics/{name}/configs": {
                "parameters": [topic],
                "get": op("Effective topic configs", &[("200", "configs"), ("404", "unknown")]),
                "patch": with_body(op("Set (value) or reset (null) topic configs", &[("200", "configs"), ("400", "invalid"), ("404", "unknown")]), "TopicConfigChanges"),
            },
            "/v1/partitions/{topic}/{partition}/elect-leader": {
                "parameters": [path_param("topic", "string"), int_param("partition", 0, i64::from(i32::MAX))],
                "post": with_body(op("Elect the preferred leader, or any live replica (unclean)", &[("200", "partition"), ("400", "invalid"), ("404", "unknown"), ("409", "ELECTION_NOT_NEEDED or ELIGIBLE_LEADERS_NOT_AVAILABLE"), ("503", "no controller")]), "ElectLeader"),
            },
            "/v1/partitions/{topic}/{partition}/reassign": {
                "parameters": [path_param("topic", "string"), int_param("partition", 0, i64::from(i32::MAX))],
                "post": with_body(op("Move the partition to these replicas (KIP-455), replacing a running move", &[("202", "partition, with its reassignment"), ("400", "INVALID_REPLICA_ASSIGNMENT or INVALID_REQUEST"), ("404", "unknown"), ("409", "ELIGIBLE_LEADERS_NOT_AVAILABLE"), ("503", "no controller")]), "Reassign"),
                "delete": op("Cancel the running move: the original replicas return", &[("200", "partition"), ("400", "invalid"), ("404", "unknown"), ("409", "NO_REASSIGNMENT_IN_PROGRESS or ELIGIBLE_LEADERS_NOT_AVAILABLE"), ("503", "no controller")]),
            },
            "/v1/reassignments": {"get": op("Running reassignments, with the bytes left to copy", &[("200", "reassignments")])},
            "/v1/balancer": {"get": op("The balancer: mode, the moves it would start next, when it last ran and how many moves it started on the controller (null elsewhere), replica and leader counts per broker, and bytes per broker from the partition sizes leaders report (on the controller; null elsewhere)", &[("200", "balancer")])},
            "/v1/quorum": {"get": op("The metadata quorum: leader, term, voters and observers with their match index and lag (as the leader reports them; null when it does not answer)", &[("200", "quorum")])},
            "/v1/quorum/voters": {
                "post": with_body(op("Promote a caught-up observer to voter (KIP-853)", &[("200", "quorum"), ("400", "invalid"), ("404", "VOTER_NOT_FOUND: not an observer"), ("409", "DUPLICATE_VOTER, or INVALID_QUORUM_CHANGE: not caught up, or no live majority"), ("503", "no controller")]), "AddVoter"),
            },
            "/v1/quorum/voters/{id}": {
                "parameters": [int_param("id", 0, i64::MAX)],
                "delete": op("Turn a voter into an observer", &[("200", "quorum"), ("400", "invalid"), ("404", "VOTER_NOT_FOUND"), ("409", "INVALID_QUORUM_CHANGE: the last voter, or no live majority"), ("503", "no controller")]),
            },
            "/v1/groups": {"get": op("Consumer groups", &[("200", "groups")])},
            "/v1/groups/{id}": {
                "parameters": [path_param("id", "string")],
                "get": op("Describe a consumer group", &[("200", "group"), ("404", "unknown")]),
            },
            "/v1/users": {
                "get": op("SCRAM users with their mechanisms (never a password or key)", &[("200", "users")]),
                "post": with_body(op("Create a SCRAM user, or set a new password: credentials for one mechanism, or both when none is named", &[("201", "user"), ("400", "UNACCEPTABLE_CREDENTIAL (a name empty, over 255 characters or with control characters; an empty password; iterations out of 4096..16384), UNSUPPORTED_SASL_MECHANISM, or INVALID_REQUEST (malformed body)"), ("503", "no controller")]), "NewUser"),
            },
            "/v1/users/{name}": {
                "parameters": [path_param("name", "string")],
                "delete": op("Remove a user's credentials", &[("204", "removed"), ("404", "RESOURCE_NOT_FOUND"), ("503", "no controller")]),
            },
            "/v1/acls": {
                "get": op("Every ACL", &[("200", "ACLs")]),
                "post": with_body(op("Add an ACL (host defaults to *, pattern_type to literal, a cluster resource's name to kafka-cluster); adding one that exists changes nothing", &[("201", "the ACL"), ("400", "INVALID_REQUEST: a missing field, an unknown value, a host that is not an IP address or *, a principal that is not TYPE:NAME"), ("503", "no controller")]), "Acl"),
                "delete": {
                    "summary": "Remove every ACL the filter matches (a missing field, or no body, matches any)",
                    "requestBody": {"required": false, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/AclFilter"}}}},
                    "responses": op("", &[("200", "the ACLs removed"), ("400", "INVALID_REQUEST: an unknown value or a malformed body"), ("503", "no controller")])["responses"].clone(),
                },
            },
            "/v1/quotas": {
                "get": op("Client quotas by entity (user and/or client id; \"<default>\" for the default)", &[("200", "quotas")]),
                "patch": with_body(op("Set (number) or remove (null) one entity's quotas, all or nothing", &[("200", "every entity's quotas"), ("400", "INVALID_REQUEST: no entity, an unknown key, a value that is not positive, a malformed body"), ("503", "no controller")]), "QuotaChanges"),
            },
            "/v1/openapi.json": {"get": op("This document", &[("200", "OpenAPI 3")])},
        },
        "components": {"schemas": {
            "Readiness": {"type": "object", "required": ["ready", "applied_index", "broker_state", "controller_id"], "properties": {
                "ready": {"type": "boolean"},
                "applied_index": {"type": "integer", "description": "metadata log index applied on this node"},
                "broker_state": {"type": "string", "nullable": true, "description": "active, fenced or shutting_down; null when not registered"},
                "controller_id": {"type": "integer", "nullable": true}}},
            "Error": {"type": "object", "required": ["error", "message"], "properties": {
                "error": {"type": "string", "description": "Kafka-style error code"},
                "message": {"type": "string"}}},
            "CreateTopic": {"type": "object", "required": ["name"], "additionalProperties": false, "properties": {
                "name": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$", "not": {"enum": [".", ".."]}},
                "partitions": {"type": "integer", "minimum": 1, "maximum": crate::controller::topics::PARTITIONS_MAX, "nullable": true, "description": "null or missing: num.partitions"},
                "replication_factor": {"type": "integer", "minimum": 1, "maximum": i16::MAX, "nullable": true, "description": "null or missing: default.replication.factor; at most the active brokers (else 400 INVALID_REPLICATION_FACTOR)"},
                "configs": {"type": "object", "additionalProperties": false, "properties": topic_config_values()}}},
            "AddPartitions": {"type": "object", "required": ["count"], "additionalProperties": false, "properties": {"count": {"type": "integer", "minimum": 1, "maximum": crate::controller::topics::PARTITIONS_MAX, "description": "the new total: more than the topic has (else 400 INVALID_PARTITIONS)"}}},
            "TopicConfigChanges": config_changes(&topic_config_keys(), "topic configs to set (a value) or reset (null)"),
            "BrokerConfigChanges": config_changes(&dynamic_broker_keys(), "dynamic broker settings to set (a value) or reset (null)"),
            "ElectLeader": {"type": "object", "required": ["type"], "additionalProperties": false, "properties": {"type": {"type": "string", "enum": ["preferred", "unclean"]}}},
            "NewUser": {"type": "object", "required": ["name", "password"], "additionalProperties": false, "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$", "description": "no control characters"},
                "password": {"type": "string", "minLength": 1},
                "mechanism": {"type": "string", "enum": ["SCRAM-SHA-256", "SCRAM-SHA-512", null], "nullable": true, "description": "null or missing: both"},
                "iterations": {"type": "integer", "minimum": 4096, "maximum": 16384, "default": 4096, "nullable": true, "description": "null or missing: 4096"}}},
            "QuotaChanges": {"type": "object", "required": ["quotas"], "additionalProperties": false, "properties": {
                "user": {"type": "string", "nullable": true, "description": "a user name, or <default>; at least one of user and client_id is not null (else 400)"},
                "client_id": {"type": "string", "nullable": true, "description": "a client id, or <default>"},
                "quotas": {"type": "object", "minProperties": 1, "additionalProperties": false, "properties": {
                        "producer_byte_rate": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "nullable": true},
                        "consumer_byte_rate": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "nullable": true},
                        "request_percentage": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "nullable": true}},
                    "description": "producer_byte_rate, consumer_byte_rate (bytes/s), request_percentage (percent of one thread)"}}},
            "Acl": {"type": "object", "required": ["principal", "resource_type", "operation", "permission"], "additionalProperties": false, "properties": acl_properties(false)},
            "AclFilter": {"type": "object", "additionalProperties": false, "properties": acl_properties(true)},
            "AddVoter": {"type": "object", "required": ["id"], "additionalProperties": false, "properties": {"id": {"type": "integer", "minimum": 0, "maximum": i64::MAX}}},
            "Reassign": {"type": "object", "required": ["replicas"], "additionalProperties": false, "properties": {
                "replicas": {"type": "array", "minItems": 1, "uniqueItems": true, "items": {"type": "integer", "format": "int32"}}}},
        }},
    })
}

/// With `admin.authentication.enabled`, every path but `/health` and
/// `/ready` may answer 401 and 403 (`/metrics` too, unless `admin.metrics.public`).
fn with_access_errors(mut spec: Value) -> Value {
    let error = |text: &str| json!({"description": text, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    if let Some(paths) = spec["paths"].as_object_mut() {
        for (_, item) in paths.iter_mut().filter(|(p, _)| !matches!(p.as_str(), "/health" | "/ready")) {
            for (method, operation) in item.as_object_mut().into_iter().flatten() {
                if method == "parameters" {
                    continue;
                }
                let responses = &mut operation["responses"];
                responses["401"] = error("SASL_AUTHENTICATION_FAILED: admin authentication is on and the request has no valid HTTP Basic credentials or client certificate");
                responses["403"] = error("CLUSTER_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED or GROUP_AUTHORIZATION_FAILED: the ACLs do not allow it");
            }
        }
    }
    spec["components"]["securitySchemes"] = json!({"basic": {"type": "http", "scheme": "basic", "description": "a SCRAM user's name and password; needed when admin.authentication.enabled"}});
    spec["security"] = json!([{}, {"basic": []}]);
    spec
}

pub async fn document() -> Json<Value> {
    Json(with_access_errors(spec()))
}
