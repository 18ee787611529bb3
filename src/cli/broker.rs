//! `strom broker decommission|maintenance|unregister ID`: a broker's role
//! through the admin API.

use clap::Subcommand;
use serde_json::Value;

use super::table::Table;
use super::{print_json, s, AdminArgs, Api, CliResult};

#[derive(Debug, Subcommand)]
pub enum BrokerCommand {
    /// Drain a broker (leaderships, then replicas); it is unregistered once empty.
    Decommission {
        /// The broker's node id.
        id: i32,
        /// Stop a running drain instead.
        #[arg(long)]
        stop: bool,
    },
    /// Put a broker in maintenance: it keeps its replicas and leads nothing.
    Maintenance {
        /// The broker's node id.
        id: i32,
        /// Take it out of maintenance instead.
        #[arg(long)]
        off: bool,
    },
    /// Unregister a broker that is dead or drained and holds no replica.
    Unregister {
        /// The broker's node id.
        id: i32,
    },
}

fn print_broker(b: &Value) {
    let mut table = Table::new(&["ID", "STATE", "REPLICAS", "LEADERS", "MAINTENANCE", "DECOMMISSION", "REPLICAS-LEFT"]);
    table.row(vec![
        s(&b["id"]),
        s(&b["state"]),
        s(&b["replicas"]),
        s(&b["leaders"]),
        s(&b["maintenance"]),
        s(&b["decommission"]["state"]),
        s(&b["decommission"]["replicas_left"]),
    ]);
    out!("{table}");
}

pub async fn broker(args: AdminArgs, command: BrokerCommand) -> CliResult {
    let api = Api::new(&args);
    let (method, path) = match &command {
        BrokerCommand::Decommission { id, stop: false } => {
            (reqwest::Method::POST, format!("/v1/brokers/{id}/decommission"))
        }
        BrokerCommand::Decommission { id, stop: true } => {
            (reqwest::Method::DELETE, format!("/v1/brokers/{id}/decommission"))
        }
        BrokerCommand::Maintenance { id, off: false } => {
            (reqwest::Method::PUT, format!("/v1/brokers/{id}/maintenance"))
        }
        BrokerCommand::Maintenance { id, off: true } => {
            (reqwest::Method::DELETE, format!("/v1/brokers/{id}/maintenance"))
        }
        BrokerCommand::Unregister { id } => (reqwest::Method::DELETE, format!("/v1/brokers/{id}")),
    };
    let b = api.call(method, &path, None).await?;
    if let BrokerCommand::Unregister { id } = command {
        if !args.json {
            outln!("Unregistered broker {id}");
        }
        return Ok(());
    }
    if args.json {
        print_json(&b);
    } else {
        print_broker(&b);
    }
    Ok(())
}
