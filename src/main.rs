//! The `strom` command line: `serve`, `cluster`, and the admin subcommands.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use strom::cli::{self, AdminArgs, GroupCommand, TopicCommand};
use strom::cluster::ClusterArgs;
use strom::config::Settings;
use strom::node::{self, NodeConfig};

#[derive(Debug, Parser)]
#[command(name = "strom", version, about = "A Kafka-compatible message broker cluster in one binary")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one node.
    Serve(ServeArgs),
    /// Start an N-node cluster of child processes.
    Cluster(ClusterCli),
    /// Manage topics through the admin API.
    Topic {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: TopicCommand,
    },
    /// Inspect consumer groups through the admin API.
    Group {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: GroupCommand,
    },
    /// Controller, quorum and brokers.
    ClusterInfo {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Move partitions between brokers through the admin API.
    Partition {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: cli::PartitionCommand,
    },
    /// Running partition moves, with the bytes left to copy.
    Reassignments {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The balancer's plan and counts through the admin API.
    Balancer {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: cli::BalancerCommand,
    },
    /// Drain, put in maintenance or unregister a broker through the admin API.
    Broker {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: cli::BrokerCommand,
    },
    /// SCRAM users (for SASL) through the admin API.
    User {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: cli::UserCommand,
    },
    /// ACLs through the admin API.
    Acl {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: cli::AclCommand,
    },
    /// Write a new CA and certificates for TLS listeners (for trying TLS out;
    /// production keys come from your own CA).
    Certs(cli::CertsArgs),
    /// The metadata quorum's voters and observers through the admin API.
    Quorum {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: cli::QuorumCommand,
    },
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Positive integer, unique in the cluster.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64))]
    node_id: u64,
    /// Metadata store and partition logs live here; created if missing.
    #[arg(long)]
    data_dir: PathBuf,
    /// Kafka protocol listener, PLAINTEXT [default: 127.0.0.1:9092]; the
    /// `listeners` setting names several instead.
    #[arg(long)]
    kafka: Option<String>,
    /// HTTP admin API.
    #[arg(long, default_value = "127.0.0.1:9644")]
    admin: String,
    /// Internal quorum RPC.
    #[arg(long, default_value = "127.0.0.1:9093")]
    raft: String,
    /// What Metadata responses advertise (default: the --kafka address).
    #[arg(long)]
    advertised_kafka: Option<String>,
    /// Voters of the metadata quorum: ID@HOST:PORT,... (default: this node alone).
    #[arg(long)]
    quorum: Option<String>,
    /// TOML file of settings by their Kafka names.
    #[arg(long)]
    config: Option<PathBuf>,
    /// KEY=VALUE setting; repeatable; wins over --config.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Log lines as text, or as JSON objects (one per line).
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

#[derive(Debug, Args)]
struct ClusterCli {
    #[command(flatten)]
    args: ClusterArgs,
    /// Log lines as text, or as JSON objects (one per line).
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

/// A usage error: one line naming the flag or key, exit code 2.
fn usage_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

fn parse_addr(flag: &str, value: &str) -> Result<String, String> {
    value
        .parse::<std::net::SocketAddr>()
        .map(|_| value.to_string())
        .map_err(|_| format!("--{flag}: `{value}` is not an IP:PORT address"))
}

/// Parses `ID@HOST:PORT,...`.
fn parse_quorum(value: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut voters = BTreeMap::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('@').ok_or_else(|| format!("--quorum: `{part}` is not ID@HOST:PORT"))?;
        let id: u64 =
            id.parse().ok().filter(|i| *i >= 1).ok_or_else(|| format!("--quorum: `{id}` is not a positive node id"))?;
        let addr = parse_addr("quorum", addr)?;
        if voters.insert(id, addr).is_some() {
            return Err(format!("--quorum: node {id} is listed twice"));
        }
    }
    if voters.is_empty() {
        return Err("--quorum: no voters given".into());
    }
    Ok(voters)
}

fn node_config(args: ServeArgs) -> Result<NodeConfig, String> {
    let kafka = args.kafka.as_deref().map(|k| parse_addr("kafka", k)).transpose()?;
    let admin = parse_addr("admin", &args.admin)?;
    let raft = parse_addr("raft", &args.raft)?;
    let advertised_kafka = match args.advertised_kafka {
        Some(a) if a.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) => Some(a),
        Some(a) => return Err(format!("--advertised-kafka: `{a}` is not HOST:PORT")),
        None => None,
    };
    let voters = match args.quorum {
        Some(q) => parse_quorum(&q)?,
        None => BTreeMap::from([(args.node_id, raft.clone())]),
    };
    if let Some(addr) = voters.get(&args.node_id) {
        if *addr != raft {
            return Err(format!("--quorum lists node {} at {addr} but --raft is {raft}", args.node_id));
        }
    }
    let mut settings = Settings::default();
    if let Some(path) = &args.config {
        settings.load_file(path).map_err(|e| e.to_string())?;
    }
    for pair in &args.set {
        settings.set_pair(pair).map_err(|e| format!("--set {e}"))?;
    }
    let listeners = strom::security::listeners::resolve(&settings, kafka.as_deref(), advertised_kafka.as_deref())?;
    Ok(NodeConfig { node_id: args.node_id, data_dir: args.data_dir, listeners, admin, raft, voters, settings })
}

/// openraft reports every failed RPC to a down peer at ERROR level, many
/// times a second; Strom logs the quorum events that matter itself.
const DEFAULT_LOG_FILTER: &str = "info,openraft=off,sled=warn";

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Raises this process's limit of open files to the hard limit, as Go's
/// runtime and most servers do: a node holds a descriptor per log segment and
/// per connection, and the usual soft limit (1024) is far below what 10,000
/// partitions need. Logged, never fatal: the node runs with what it has.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "raised the open files limit"),
            Err(e) => tracing::warn!(soft, hard, error = %e, "cannot raise the open files limit"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read the open files limit"),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, std::io::Error> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let log_format = args.log_format;
            let config = match node_config(args) {
                Ok(c) => c,
                Err(e) => return usage_error(e),
            };
            init_logging(log_format);
            raise_open_files_limit();
            let result = match runtime() {
                Ok(rt) => rt.block_on(node::run(config)).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "node failed");
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Cluster(c) => {
            if let Err(e) = c.args.validate() {
                return usage_error(e);
            }
            init_logging(c.log_format);
            match runtime().map_err(|e| e.to_string()).and_then(|rt| rt.block_on(strom::cluster::run(c.args))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Topic { admin, command } => {
            cli::exit(runtime().map_err(|e| e.to_string()), |rt| rt.block_on(cli::topic(admin, command)))
        }
        Command::Group { admin, command } => {
            cli::exit(runtime().map_err(|e| e.to_string()), |rt| rt.block_on(cli::group(admin, command)))
        }
        Command::ClusterInfo { admin } => {
            cli::exit(runtime().map_err(|e| e.to_string()), |rt| rt.block_on(cli::cluster_info(admin)))
        }
        Command::Partition { admin, command } => {
            cli::exit(runtime().map_err(|e| e.to_string()), |rt| rt.block_on(cli::partition(admin, command)))
        }
        Command::Reassignments { admin } => {
            cli::exit(runtime().map_err(|e| e.to_string()), |rt| rt.block_on(cli::reassignments(admin)))
        }
        Command::Balancer { admin, command } => {
            cli::exit(runtime().map_err(|e| e.to_string()), |rt| rt.block_on(cli::balancer(admin, command)))
        }
        Command::Broker { admin, command } => {
            cli::exit(runtime().map_err(|e| e.to_string()), |rt| rt.block_on(cli::broker(admin, command)))
        }
        Command::User { admin, command } => {
            cli::exit(runtime().map_err(|e| e.to_string()), |rt| rt.block_on(cli::user(admin, command)))
        }
        Command::Acl { admin, command } => {
            cli::exit(runtime().map_err(|e| e.to_string()), |rt| rt.block_on(cli::acl(admin, command)))
        }
        Command::Certs(args) => cli::exit(Ok(()), |()| cli::certs(args)),
        Command::Quorum { admin, command } => {
            cli::exit(runtime().map_err(|e| e.to_string()), |rt| rt.block_on(cli::quorum(admin, command)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_flag() {
        let v = parse_quorum("1@127.0.0.1:19092,2@127.0.0.1:19093").expect("valid");
        assert_eq!(v[&2], "127.0.0.1:19093");
        assert!(parse_quorum("1@127.0.0.1:1,1@127.0.0.1:2").expect_err("dup").contains("twice"));
        assert!(parse_quorum("0@127.0.0.1:1").is_err());
        assert!(parse_quorum("x").is_err());
        assert!(parse_quorum("1@nohost").is_err());
    }

    /// Every subcommand, flag and positional argument of every command, with
    /// no help line.
    fn undocumented(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let builtin = matches!(arg.get_id().as_str(), "help" | "version");
            if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                out.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            let name = format!("{path} {}", sub.get_name());
            if sub.get_name() != "help" && sub.get_about().is_none() && sub.get_long_about().is_none() {
                out.push(name.clone());
            }
            undocumented(sub, &name, out);
        }
    }

    #[test]
    fn every_subcommand_and_flag_has_a_line_of_help() {
        use clap::CommandFactory;
        let mut missing = Vec::new();
        undocumented(&Cli::command(), "strom", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:#?}");
    }
}
