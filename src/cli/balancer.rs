//! `strom balancer status`: the balancer's plan and the counts it evens out.

use clap::Subcommand;

use super::table::Table;
use super::{print_json, s, AdminArgs, Api, CliResult};

#[derive(Debug, Subcommand)]
pub enum BalancerCommand {
    /// Mode, next moves, and replica and leader counts per broker.
    Status,
}

pub async fn balancer(args: AdminArgs, command: BalancerCommand) -> CliResult {
    let api = Api::new(&args);
    let BalancerCommand::Status = command;
    let b = api.get("/v1/balancer").await?;
    if args.json {
        print_json(&b);
        return Ok(());
    }
    outln!("Mode: {}  last run: {}", s(&b["mode"]), s(&b["last_run_ms"]));
    let mut counts = Table::new(&["BROKER", "REPLICAS", "LEADERS"]);
    for (broker, n) in b["imbalance"]["replicas"].as_object().into_iter().flatten() {
        counts.row(vec![broker.clone(), s(n), s(&b["imbalance"]["leaders"][broker])]);
    }
    out!("{counts}");
    let mut moves = Table::new(&["TOPIC", "PARTITION", "FROM", "TO", "REASON"]);
    for m in b["moves"].as_array().into_iter().flatten() {
        moves.row(vec![s(&m["topic"]), s(&m["partition"]), s(&m["from"]), s(&m["to"]), s(&m["reason"])]);
    }
    out!("{moves}");
    Ok(())
}
