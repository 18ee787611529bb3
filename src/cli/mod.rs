//! The admin subcommands: thin clients of the HTTP admin API that print
//! readable tables, or the API's JSON with `--json`. Exit 0 on success, 1 on
//! an API error (its code and message on stderr).

/// `print!` to stdout for the admin subcommands; a closed pipe (`strom ... |
/// head`) ends the command quietly with exit 0, as ripgrep and other tools do,
/// instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!($($arg)*))
    };
}

/// `println!` to stdout, a closed pipe handled as [`out!`] does.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod acl;
mod balancer;
mod broker;
mod consume;
mod kafka;
mod produce;
mod quorum;
mod reassign;
mod table;
mod user;

pub use acl::{acl, AclCommand};
pub use balancer::{balancer, BalancerCommand};
pub use broker::{broker, BrokerCommand};
pub use quorum::{quorum, QuorumCommand};
pub use reassign::{partition, reassignments, PartitionCommand};
pub use user::{certs, user, write as write_file, CertsArgs, UserCommand};

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use table::Table;

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Any node's admin API.
    #[arg(long, env = "STROM_ADMIN", default_value = "http://127.0.0.1:9644", global = true)]
    admin_url: String,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// A SCRAM user for an admin API with authentication on.
    #[arg(long, env = "STROM_ADMIN_USER", global = true)]
    admin_user: Option<String>,
    /// That user's password.
    #[arg(long, env = "STROM_ADMIN_PASSWORD", hide_env_values = true, global = true)]
    admin_password: Option<String>,
    /// A credentials.json (`strom cluster --secure` writes one): user,
    /// password and the CA to trust for https.
    #[arg(long, env = "STROM_ADMIN_CREDENTIALS", global = true)]
    admin_credentials: Option<std::path::PathBuf>,
    /// A PEM CA certificate to trust for an https admin URL.
    #[arg(long, env = "STROM_ADMIN_CA", global = true)]
    admin_ca: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        /// The topic's name: letters, digits, `.`, `_` and `-`, at most 249.
        name: String,
        /// How many partitions.
        #[arg(long)]
        partitions: i64,
        /// How many replicas of each partition (at most the number of brokers).
        #[arg(long)]
        replication_factor: i64,
        /// K=V topic config; repeatable.
        #[arg(long = "config", value_name = "K=V")]
        configs: Vec<String>,
    },
    /// List the topics with their partition counts and replication factors.
    List,
    /// Show a topic's configs and each partition's leader, replicas, ISR and offsets.
    Describe {
        /// The topic.
        name: String,
    },
    /// Delete a topic and its data.
    Delete {
        /// The topic.
        name: String,
    },
    /// Raise a topic's partition count.
    AddPartitions {
        /// The topic.
        name: String,
        /// The new total number of partitions.
        #[arg(long)]
        count: i64,
    },
    /// Produce lines from stdin as records (one record per line), as kcat -P does.
    Produce {
        /// The topic.
        name: String,
        /// Kafka listeners HOST:PORT,... (default: every broker the admin API lists).
        #[arg(long, env = "STROM_BOOTSTRAP")]
        bootstrap: Option<String>,
        /// Split each line at the first SEP into key and value (a line without it has no key).
        #[arg(long, value_name = "SEP")]
        key_separator: Option<String>,
        /// A K=V header on every record; repeatable.
        #[arg(long = "header", value_name = "K=V")]
        headers: Vec<String>,
        /// Write every record to this partition (default: by key as Kafka's
        /// partitioner does, keyless batches round robin).
        #[arg(long)]
        partition: Option<i32>,
        /// Acknowledgement to wait for: all (every in-sync replica) or 1 (the leader).
        #[arg(long, default_value = "all", value_parser = parse_acks)]
        acks: i16,
    },
    /// Print records to stdout: new ones, from the beginning, or as a group member.
    Consume {
        /// The topic.
        name: String,
        /// Kafka listeners HOST:PORT,... (default: every broker the admin API lists).
        #[arg(long, env = "STROM_BOOTSTRAP")]
        bootstrap: Option<String>,
        /// Start at the oldest record (default: only records produced from now
        /// on); with --group, only where the group has no committed offset.
        #[arg(long)]
        from_beginning: bool,
        /// Consume as a member of this consumer group (range assignor),
        /// starting at its committed offsets and committing what is printed.
        #[arg(long)]
        group: Option<String>,
        /// How to print each record, with kcat's tokens: %t topic, %p
        /// partition, %o offset, %k key, %s value, %T timestamp (ms), %h
        /// headers, %% a percent sign; \n and \t escapes.
        #[arg(long, default_value = "%s\\n")]
        format: String,
        /// Exit after printing this many records (default: run until Ctrl-C).
        #[arg(long)]
        count: Option<u64>,
        /// Read only this partition (not with --group).
        #[arg(long)]
        partition: Option<i32>,
    },
}

fn parse_acks(text: &str) -> Result<i16, String> {
    match text {
        "all" | "-1" => Ok(-1),
        "1" => Ok(1),
        other => Err(format!("`{other}`: use all or 1")),
    }
}

#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// List the consumer groups with their states and member counts.
    List,
    /// Show a group's members, their assignments and its committed offsets with lag.
    Describe {
        /// The group id.
        group: String,
    },
}

/// Writes to stdout. A reader that went away (EPIPE) ends the process with
/// exit 0: what it wanted was printed. Any other write error exits 1.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing stdout: {e}");
        std::process::exit(1);
    }
}

/// An admin command's failure: the message for stderr.
type CliResult = Result<(), String>;

/// Runs a command with a runtime and turns its result into an exit code.
pub fn exit<R>(runtime: Result<R, String>, f: impl FnOnce(R) -> CliResult) -> ExitCode {
    match runtime.and_then(f) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Api {
    base: String,
    http: reqwest::Client,
    auth: Option<(String, String)>,
    /// Why the client could not be set up as asked (reported at the first call).
    broken: Option<String>,
}

impl Api {
    fn new(args: &AdminArgs) -> Self {
        let mut broken = None;
        let file = match &args.admin_credentials {
            Some(path) => match crate::admin::auth::read_credentials(&path.display().to_string()) {
                Ok(c) => Some(c),
                Err(e) => {
                    broken = Some(e);
                    None
                }
            },
            None => None,
        };
        let user = args.admin_user.clone().or_else(|| file.as_ref().map(|c| c.user.clone()));
        let password = args.admin_password.clone().or_else(|| file.as_ref().map(|c| c.password.clone()));
        let ca = args.admin_ca.clone().or_else(|| file.as_ref().and_then(|c| c.ca.clone()).map(Into::into));
        let mut builder = reqwest::Client::builder().timeout(std::time::Duration::from_secs(15));
        if let Some(ca) = ca {
            match std::fs::read(&ca)
                .map_err(|e| e.to_string())
                .and_then(|pem| reqwest::Certificate::from_pem(&pem).map_err(|e| e.to_string()))
            {
                Ok(cert) => builder = builder.add_root_certificate(cert),
                Err(e) => broken = Some(format!("{}: {e}", ca.display())),
            }
        }
        let auth = user.map(|u| (u, password.unwrap_or_default()));
        Self {
            base: args.admin_url.trim_end_matches('/').to_string(),
            http: builder.build().unwrap_or_default(),
            auth,
            broken,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, String> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url);
        if let Some((user, password)) = &self.auth {
            req = req.basic_auth(user, Some(password));
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| format!("cannot reach the admin API at {url}: {e}"))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| format!("reading the answer from {url}: {e}"))?;
        let value: Value =
            if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
        if status.is_success() {
            Ok(value)
        } else {
            let code = value.get("error").and_then(Value::as_str).unwrap_or("HTTP_ERROR");
            let message =
                value.get("message").and_then(Value::as_str).map_or_else(|| value.to_string(), str::to_string);
            Err(format!("{code}: {message} (HTTP {})", status.as_u16()))
        }
    }

    async fn get(&self, path: &str) -> Result<Value, String> {
        self.call(reqwest::Method::GET, path, None).await
    }
}

fn print_json(v: &Value) {
    outln!("{}", serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()));
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(s).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

fn describe_topic(t: &Value) {
    outln!("Topic: {}  id: {}", s(&t["name"]), s(&t["topic_id"]));
    if let Some(configs) = t["configs"].as_object() {
        let shown: Vec<String> = configs.iter().map(|(k, v)| format!("{k}={}", s(v))).collect();
        outln!("Configs: {}", shown.join(" "));
    }
    let mut table =
        Table::new(&["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "STATE", "LOG-START", "LOG-END", "HW"]);
    for p in t["partitions"].as_array().into_iter().flatten() {
        table.row(vec![
            s(&p["partition"]),
            s(&p["leader"]),
            s(&p["leader_epoch"]),
            s(&p["replicas"]),
            s(&p["isr"]),
            s(&p["state"]),
            s(&p["log_start_offset"]),
            s(&p["log_end_offset"]),
            s(&p["high_watermark"]),
        ]);
    }
    out!("{table}");
}

fn parse_configs(pairs: &[String]) -> Result<Value, String> {
    let mut map = serde_json::Map::new();
    for pair in pairs {
        let (k, v) = pair.split_once('=').ok_or_else(|| format!("--config `{pair}` is not K=V"))?;
        map.insert(k.to_string(), Value::String(v.to_string()));
    }
    Ok(Value::Object(map))
}

pub async fn topic(args: AdminArgs, command: TopicCommand) -> CliResult {
    let api = Api::new(&args);
    let result = match command {
        TopicCommand::Create { name, partitions, replication_factor, configs } => {
            let body = json!({"name": name, "partitions": partitions, "replication_factor": replication_factor,
                              "configs": parse_configs(&configs)?});
            api.call(reqwest::Method::POST, "/v1/topics", Some(body)).await?
        }
        TopicCommand::List => {
            let topics = api.get("/v1/topics").await?;
            if !args.json {
                let mut table = Table::new(&["NAME", "PARTITIONS", "REPLICATION-FACTOR"]);
                for t in topics.as_array().into_iter().flatten() {
                    table.row(vec![s(&t["name"]), s(&t["partitions"]), s(&t["replication_factor"])]);
                }
                out!("{table}");
                return Ok(());
            }
            topics
        }
        TopicCommand::Describe { name } => api.get(&format!("/v1/topics/{name}")).await?,
        TopicCommand::Delete { name } => {
            api.call(reqwest::Method::DELETE, &format!("/v1/topics/{name}"), None).await?;
            if !args.json {
                outln!("Deleted topic {name}");
            }
            return Ok(());
        }
        TopicCommand::AddPartitions { name, count } => {
            api.call(reqwest::Method::POST, &format!("/v1/topics/{name}/partitions"), Some(json!({"count": count})))
                .await?
        }
        TopicCommand::Produce { name, bootstrap, key_separator, headers, partition, acks } => {
            let options = produce::ProduceOptions { topic: name, bootstrap, key_separator, headers, partition, acks };
            return produce::produce(&api, options).await;
        }
        TopicCommand::Consume { name, bootstrap, from_beginning, group, format, count, partition } => {
            let options =
                consume::ConsumeOptions { topic: name, bootstrap, from_beginning, group, format, count, partition };
            return consume::consume(&api, options).await;
        }
    };
    if args.json {
        print_json(&result);
    } else {
        describe_topic(&result);
    }
    Ok(())
}

pub async fn group(args: AdminArgs, command: GroupCommand) -> CliResult {
    let api = Api::new(&args);
    match command {
        GroupCommand::List => {
            let groups = api.get("/v1/groups").await?;
            if args.json {
                print_json(&groups);
                return Ok(());
            }
            let mut table = Table::new(&["GROUP", "STATE", "MEMBERS", "PROTOCOL"]);
            for g in groups.as_array().into_iter().flatten() {
                table.row(vec![s(&g["group_id"]), s(&g["state"]), s(&g["members"]), s(&g["protocol"])]);
            }
            out!("{table}");
        }
        GroupCommand::Describe { group } => {
            let g = api.get(&format!("/v1/groups/{group}")).await?;
            if args.json {
                print_json(&g);
                return Ok(());
            }
            outln!(
                "Group: {}  state: {}  generation: {}  protocol: {}  group protocol: {}",
                s(&g["group_id"]),
                s(&g["state"]),
                s(&g["generation"]),
                s(&g["protocol"]),
                s(&g["group_protocol"])
            );
            let mut members = Table::new(&["MEMBER", "CLIENT", "HOST", "ASSIGNMENT"]);
            for m in g["members"].as_array().into_iter().flatten() {
                let assignment: Vec<String> = m["assignment"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| format!("{}:{}", s(&a["topic"]), s(&a["partitions"])))
                    .collect();
                members.row(vec![s(&m["member_id"]), s(&m["client_id"]), s(&m["host"]), assignment.join(" ")]);
            }
            out!("{members}");
            let mut offsets = Table::new(&["TOPIC", "PARTITION", "COMMITTED", "LOG-END", "LAG"]);
            for o in g["offsets"].as_array().into_iter().flatten() {
                offsets.row(vec![
                    s(&o["topic"]),
                    s(&o["partition"]),
                    s(&o["committed"]),
                    s(&o["log_end_offset"]),
                    s(&o["lag"]),
                ]);
            }
            out!("{offsets}");
        }
    }
    Ok(())
}

pub async fn cluster_info(args: AdminArgs) -> CliResult {
    let api = Api::new(&args);
    let c = api.get("/v1/cluster").await?;
    if args.json {
        print_json(&c);
        return Ok(());
    }
    let q = &c["quorum"];
    outln!("Cluster: {}", s(&c["cluster_id"]));
    outln!("Controller: {}", s(&c["controller_id"]));
    outln!(
        "Quorum: leader {}  term {}  commit index {}  voters [{}]  observers [{}]",
        s(&q["leader_id"]),
        s(&q["term"]),
        s(&q["commit_index"]),
        s(&q["voters"]),
        s(&q["observers"])
    );
    let mut table = Table::new(&["ID", "KAFKA", "ADMIN", "STATE", "CONTROLLER"]);
    for b in c["brokers"].as_array().into_iter().flatten() {
        let ctl = if b["is_controller"].as_bool() == Some(true) { "yes" } else { "" };
        table.row(vec![s(&b["id"]), s(&b["kafka"]), s(&b["admin"]), s(&b["state"]), ctl.into()]);
    }
    out!("{table}");
    Ok(())
}
