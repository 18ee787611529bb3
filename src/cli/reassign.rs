//! `strom partition reassign|cancel-reassignment` and `strom reassignments`:
//! partition moves through the admin API.

use clap::Subcommand;
use serde_json::{json, Value};

use super::table::Table;
use super::{print_json, s, AdminArgs, Api, CliResult};

#[derive(Debug, Subcommand)]
pub enum PartitionCommand {
    /// Move a partition to new replicas (the first is the preferred leader).
    Reassign {
        /// The topic.
        topic: String,
        /// The partition's index.
        partition: i32,
        /// Target broker ids, comma-separated, e.g. 4,1,2.
        #[arg(long, value_delimiter = ',', required = true)]
        replicas: Vec<i32>,
    },
    /// Cancel a partition's running move: the original replicas return.
    CancelReassignment {
        /// The topic.
        topic: String,
        /// The partition's index.
        partition: i32,
    },
}

fn print_partition(p: &Value) {
    let mut table =
        Table::new(&["PARTITION", "LEADER", "REPLICAS", "ISR", "TARGET", "ADDING", "REMOVING", "BYTES-LEFT"]);
    let r = &p["reassignment"];
    table.row(vec![
        s(&p["partition"]),
        s(&p["leader"]),
        s(&p["replicas"]),
        s(&p["isr"]),
        s(&r["target"]),
        s(&r["adding"]),
        s(&r["removing"]),
        s(&r["bytes_left"]),
    ]);
    out!("{table}");
}

pub async fn partition(args: AdminArgs, command: PartitionCommand) -> CliResult {
    let api = Api::new(&args);
    let p = match command {
        PartitionCommand::Reassign { topic, partition, replicas } => {
            let path = format!("/v1/partitions/{topic}/{partition}/reassign");
            api.call(reqwest::Method::POST, &path, Some(json!({"replicas": replicas}))).await?
        }
        PartitionCommand::CancelReassignment { topic, partition } => {
            api.call(reqwest::Method::DELETE, &format!("/v1/partitions/{topic}/{partition}/reassign"), None).await?
        }
    };
    if args.json {
        print_json(&p);
    } else {
        print_partition(&p);
    }
    Ok(())
}

pub async fn reassignments(args: AdminArgs) -> CliResult {
    let api = Api::new(&args);
    let rows = api.get("/v1/reassignments").await?;
    if args.json {
        print_json(&rows);
        return Ok(());
    }
    let mut table = Table::new(&["TOPIC", "PARTITION", "REPLICAS", "TARGET", "ADDING", "REMOVING", "BYTES-LEFT"]);
    for r in rows.as_array().into_iter().flatten() {
        table.row(vec![
            s(&r["topic"]),
            s(&r["partition"]),
            s(&r["replicas"]),
            s(&r["target"]),
            s(&r["adding"]),
            s(&r["removing"]),
            s(&r["bytes_left"]),
        ]);
    }
    out!("{table}");
    Ok(())
}
