//! `strom quorum describe|add-voter ID|remove-voter ID`: the metadata
//! quorum's membership through the admin API.

use clap::Subcommand;
use serde_json::{json, Value};

use super::table::Table;
use super::{print_json, s, AdminArgs, Api, CliResult};

#[derive(Debug, Subcommand)]
pub enum QuorumCommand {
    /// Leader, term, voters and observers with their lag.
    Describe,
    /// Promote a caught-up observer to voter.
    AddVoter {
        /// The observer's node id.
        id: u64,
    },
    /// Turn a voter into an observer.
    RemoveVoter {
        /// The voter's node id.
        id: u64,
    },
}

fn print_quorum(q: &Value) {
    outln!("Leader: {}  term: {}  commit index: {}", s(&q["leader_id"]), s(&q["term"]), s(&q["commit_index"]));
    let mut table = Table::new(&["ID", "ROLE", "RAFT", "MATCH-INDEX", "LAG"]);
    for (role, key) in [("voter", "voters"), ("observer", "observers")] {
        for m in q[key].as_array().into_iter().flatten() {
            table.row(vec![s(&m["id"]), role.into(), s(&m["raft"]), s(&m["match_index"]), s(&m["lag"])]);
        }
    }
    out!("{table}");
}

pub async fn quorum(args: AdminArgs, command: QuorumCommand) -> CliResult {
    let api = Api::new(&args);
    let q = match command {
        QuorumCommand::Describe => api.get("/v1/quorum").await?,
        QuorumCommand::AddVoter { id } => {
            api.call(reqwest::Method::POST, "/v1/quorum/voters", Some(json!({"id": id}))).await?
        }
        QuorumCommand::RemoveVoter { id } => {
            api.call(reqwest::Method::DELETE, &format!("/v1/quorum/voters/{id}"), None).await?
        }
    };
    if args.json {
        print_json(&q);
    } else {
        print_quorum(&q);
    }
    Ok(())
}
