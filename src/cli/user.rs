//! `strom user create|delete|list`: SCRAM users through the admin API, and
//! `strom certs`: a certificate authority and certificates for TLS listeners.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::json;

use super::table::Table;
use super::{print_json, s, AdminArgs, Api, CliResult};
use crate::security::certs::Authority;

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a user, or set a new password for one.
    Create {
        /// The user's name (the SASL principal `User:NAME`).
        name: String,
        /// The password; read from STROM_USER_PASSWORD when not given.
        #[arg(long, env = "STROM_USER_PASSWORD", hide_env_values = true)]
        password: String,
        /// SCRAM-SHA-256 or SCRAM-SHA-512 (default: both).
        #[arg(long)]
        mechanism: Option<String>,
        /// PBKDF2 iterations (4096 to 16384).
        #[arg(long)]
        iterations: Option<i64>,
    },
    /// Remove a user's credentials.
    Delete {
        /// The user's name.
        name: String,
    },
    /// Users and their mechanisms.
    List,
}

pub async fn user(args: AdminArgs, command: UserCommand) -> CliResult {
    let api = Api::new(&args);
    let result = match command {
        UserCommand::Create { name, password, mechanism, iterations } => {
            let mut body = json!({"name": name, "password": password});
            if let Some(m) = mechanism {
                body["mechanism"] = json!(m);
            }
            if let Some(i) = iterations {
                body["iterations"] = json!(i);
            }
            api.call(reqwest::Method::POST, "/v1/users", Some(body)).await?
        }
        UserCommand::Delete { name } => {
            api.call(reqwest::Method::DELETE, &format!("/v1/users/{name}"), None).await?;
            if !args.json {
                outln!("Deleted user {name}");
            }
            return Ok(());
        }
        UserCommand::List => api.get("/v1/users").await?,
    };
    if args.json {
        print_json(&result);
        return Ok(());
    }
    let mut table = Table::new(&["NAME", "MECHANISMS"]);
    let users = if result.is_array() { result.as_array().cloned().unwrap_or_default() } else { vec![result] };
    for u in &users {
        table.row(vec![s(&u["name"]), s(&u["mechanisms"])]);
    }
    out!("{table}");
    Ok(())
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Where to write ca.pem, server.pem (key and chain, for
    /// ssl.keystore.location) and client-NAME.pem; created if missing.
    #[arg(long)]
    pub dir: PathBuf,
    /// Host names and IP addresses the server certificate is valid for.
    #[arg(long = "host", default_values_t = ["127.0.0.1".to_string(), "localhost".to_string()])]
    pub hosts: Vec<String>,
    /// Also issue a client certificate with subject CN=NAME,O=Strom; repeatable.
    #[arg(long = "client", value_name = "NAME")]
    pub clients: Vec<String>,
}

/// Writes a new CA, a server certificate and client certificates. Key files
/// are readable by the owner only.
pub fn certs(args: CertsArgs) -> CliResult {
    let fail = |e: rcgen::Error| format!("generating certificates: {e}");
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let ca = Authority::generate("Strom CA").map_err(fail)?;
    write(&args.dir.join("ca.pem"), &ca.cert_pem(), false)?;
    let hosts: Vec<&str> = args.hosts.iter().map(String::as_str).collect();
    let server = ca.issue_server(&hosts).map_err(fail)?;
    write(&args.dir.join("server.pem"), &server.keystore_pem(), true)?;
    for name in &args.clients {
        let client = ca.issue_client(name).map_err(fail)?;
        write(&args.dir.join(format!("client-{name}.pem")), &client.cert_pem, false)?;
        write(&args.dir.join(format!("client-{name}.key")), &client.key_pem, true)?;
    }
    outln!(
        "Wrote ca.pem, server.pem{} to {}",
        if args.clients.is_empty() { "" } else { " and client certificates" },
        args.dir.display()
    );
    Ok(())
}

/// Writes a file, mode 0600 when it holds a secret, else 0644.
pub fn write(path: &std::path::Path, contents: &str, secret: bool) -> CliResult {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true).mode(if secret { 0o600 } else { 0o644 });
    let mut file = options.open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    file.write_all(contents.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
}
