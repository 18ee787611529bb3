//! `strom cluster --secure`: a CA and a node certificate, a super user
//! `admin` with a random password, the settings that turn everything on, and
//! the files clients need (CONTRACT §6).

use std::path::Path;

use rand::distributions::{Alphanumeric, DistString};

use super::NodeEntry;
use crate::security::certs::Authority;

pub const CA: &str = "ca.pem";
/// The nodes' key and certificate (one for all: they run on one host).
pub const NODE_KEYSTORE: &str = "node.pem";
pub const CREDENTIALS: &str = "credentials.json";
/// The subject of the node certificate: other nodes see `User:CN=strom-node,O=Strom`.
const NODE_NAME: &str = "strom-node";

/// Every node's settings but its listeners.
pub fn node_settings(dir: &Path) -> Vec<String> {
    let at = |f: &str| dir.join(f).display().to_string();
    vec![
        "inter.broker.listener.name=SSL".into(),
        format!("ssl.keystore.location={}", at(NODE_KEYSTORE)),
        format!("ssl.truststore.location={}", at(CA)),
        "ssl.client.auth=requested".into(),
        "quorum.security.protocol=SSL".into(),
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer".into(),
        format!("super.users=User:admin;User:CN={NODE_NAME},O=Strom"),
        "allow.everyone.if.no.acl.found=false".into(),
        "admin.tls.enabled=true".into(),
        "admin.authentication.enabled=true".into(),
        format!("admin.client.credentials={}", at(CREDENTIALS)),
    ]
}

fn fail(e: impl std::fmt::Display) -> String {
    format!("generating certificates: {e}")
}

/// Writes the CA, the node keystore and the admin credentials (0600).
pub fn prepare(dir: &Path, nodes: &[NodeEntry]) -> Result<(), String> {
    let ca = Authority::generate("Strom cluster CA").map_err(fail)?;
    let mut hosts = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    for n in nodes {
        if let Some((host, _)) = n.kafka.rsplit_once(':') {
            if !hosts.iter().any(|h| h == host) {
                hosts.push(host.to_string());
            }
        }
    }
    let names: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let node = ca.issue_node(NODE_NAME, &names).map_err(fail)?;
    crate::cli::write_file(&dir.join(CA), &ca.cert_pem(), false)?;
    crate::cli::write_file(&dir.join(NODE_KEYSTORE), &node.keystore_pem(), true)?;
    let password = Alphanumeric.sample_string(&mut rand::thread_rng(), 24);
    let credentials = serde_json::json!({
        "user": "admin",
        "password": password,
        "mechanism": "SCRAM-SHA-512",
        "ca": dir.join(CA).display().to_string(),
    });
    let text = serde_json::to_string_pretty(&credentials).map_err(|e| e.to_string())?;
    crate::cli::write_file(&dir.join(CREDENTIALS), &text, true)
}

/// `client.properties` (Java client, Kafka's tools) and `librdkafka.conf`
/// (`kcat -F`), both 0600: they hold the admin password.
pub fn write_client_files(dir: &Path, bootstrap: &str) -> Result<(), String> {
    let c = crate::admin::auth::read_credentials(&dir.join(CREDENTIALS).display().to_string())?;
    let ca = dir.join(CA).display().to_string();
    let java = format!(
        "bootstrap.servers={bootstrap}\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n\
         sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"{}\" password=\"{}\";\n\
         ssl.truststore.type=PEM\nssl.truststore.location={ca}\n",
        c.user, c.password
    );
    crate::cli::write_file(&dir.join("client.properties"), &java, true)?;
    let rdkafka = format!(
        "bootstrap.servers={bootstrap}\nsecurity.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-512\n\
         sasl.username={}\nsasl.password={}\nssl.ca.location={ca}\n",
        c.user, c.password
    );
    crate::cli::write_file(&dir.join("librdkafka.conf"), &rdkafka, true)
}

/// What `strom cluster --secure` prints after the cluster is up.
pub fn how_to_connect(dir: &Path, bootstrap: &str, admin: &str) -> String {
    let d = dir.display();
    format!(
        "secure: SASL_SSL (SCRAM-SHA-256/512, PLAIN) on {bootstrap}; TLS between nodes; ACLs on; HTTPS admin API with authentication.\n\
         The super user is `admin`; its password is in {d}/{CREDENTIALS} (mode 0600).\n\
         \x20 kcat -F {d}/librdkafka.conf -L\n\
         \x20 STROM_ADMIN_CREDENTIALS={d}/{CREDENTIALS} strom cluster-info --admin-url https://{admin}\n\
         \x20 curl --cacert {d}/{CA} -u admin:\"$(jq -r .password {d}/{CREDENTIALS})\" https://{admin}/v1/cluster\n\
         \x20 kafka-topics.sh --bootstrap-server {bootstrap} --command-config {d}/client.properties --list"
    )
}
