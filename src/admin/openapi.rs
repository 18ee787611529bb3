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

pub fn spec() -> Value {
    let topic = path_param("name", "string");
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Strom admin API", "version": env!("CARGO_PKG_VERSION")},
        "paths": {
            "/health": {"get": op("200 while the process serves", &[("200", "serving")])},
            "/ready": {"get": op("Caught up with the metadata log and an unfenced broker", &[("200", "ready"), ("503", "not ready")])},
            "/metrics": {"get": op("Prometheus text format", &[("200", "metrics")])},
            "/v1/cluster": {"get": op("Controller, quorum and brokers", &[("200", "cluster")])},
            "/v1/brokers": {"get": op("Registered brokers", &[("200", "brokers")])},
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
                "patch": with_body(op("Set (value) or reset (null) topic configs", &[("200", "configs"), ("400", "invalid"), ("404", "unknown")]), "ConfigChanges"),
            },
            "/v1/partitions/{topic}/{partition}/elect-leader": {
                "parameters": [path_param("topic", "string"), path_param("partition", "integer")],
                "post": with_body(op("Elect the preferred leader, or any live replica (unclean)", &[("200", "partition"), ("404", "unknown"), ("409", "ELECTION_NOT_NEEDED or ELIGIBLE_LEADERS_NOT_AVAILABLE")]), "ElectLeader"),
            },
            "/v1/groups": {"get": op("Consumer groups", &[("200", "groups")])},
            "/v1/groups/{id}": {
                "parameters": [path_param("id", "string")],
                "get": op("Describe a consumer group", &[("200", "group"), ("404", "unknown")]),
            },
            "/v1/openapi.json": {"get": op("This document", &[("200", "OpenAPI 3")])},
        },
        "components": {"schemas": {
            "Error": {"type": "object", "required": ["error", "message"], "properties": {
                "error": {"type": "string", "description": "Kafka-style error code"},
                "message": {"type": "string"}}},
            "CreateTopic": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"},
                "partitions": {"type": "integer", "minimum": 1},
                "replication_factor": {"type": "integer", "minimum": 1},
                "configs": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "AddPartitions": {"type": "object", "required": ["count"], "properties": {"count": {"type": "integer"}}},
            "ConfigChanges": {"type": "object", "additionalProperties": {"type": "string", "nullable": true}},
            "ElectLeader": {"type": "object", "required": ["type"], "properties": {"type": {"type": "string", "enum": ["preferred", "unclean"]}}},
        }},
    })
}

pub async fn document() -> Json<Value> {
    Json(spec())
}
