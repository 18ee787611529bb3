//! A node's share of the metadata quorum: opens the sled store, starts
//! openraft and the RPC server, bootstraps the voters on first start, and is
//! the handle the rest of the node uses to propose records and read the image.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, ChangeMembers, RaftMetrics, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::durable::Durable;
use crate::image::MetadataImage;
use crate::log_store::LogStore;
use crate::network::NetworkFactory;
use crate::records::MetadataRecord;
use crate::server::{self, AppHandler, LeaderContact};
use crate::state_machine::{AppliedImage, StateMachine};
use crate::tls::NodeTls;
use crate::types::{MetaCommand, NodeId, Raft};

#[derive(Debug, Clone)]
pub struct QuorumConfig {
    pub node_id: NodeId,
    /// The `--raft` address: listened on, and what peers dial.
    pub raft_addr: String,
    /// Voter ids and their `--raft` addresses (`controller.quorum.voters`).
    pub voters: BTreeMap<NodeId, String>,
    /// `data-dir/meta`.
    pub meta_dir: PathBuf,
    pub election_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    /// Build a snapshot after this many entries since the last one.
    pub snapshot_entries: u64,
    /// Entries kept behind a snapshot (so slightly lagging peers need no snapshot).
    pub snapshot_keep_entries: u64,
    /// Mutual TLS between the nodes' quorum connections (`None`: plain TCP).
    pub tls: Option<NodeTls>,
}

#[derive(Debug, thiserror::Error)]
pub enum QuorumError {
    #[error("metadata store at {path}: {reason}")]
    Store { path: PathBuf, reason: String },
    #[error("cannot listen on the raft address {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("invalid quorum settings: {0}")]
    Config(String),
    #[error("raft: {0}")]
    Raft(String),
}

/// Why a proposal was not committed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProposeError {
    #[error("this node is not the controller (the quorum leader is {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    #[error("no quorum answered within {0:?}")]
    Timeout(Duration),
    #[error("raft failed: {0}")]
    Fatal(String),
}

pub struct Quorum {
    node_id: NodeId,
    voters: BTreeMap<NodeId, String>,
    raft: Raft,
    applied: watch::Receiver<AppliedImage>,
    server: JoinHandle<()>,
    contact: LeaderContact,
    tls: Option<NodeTls>,
}

impl Quorum {
    /// The TLS configuration of this node's connections to other nodes.
    pub fn node_tls(&self) -> Option<&NodeTls> {
        self.tls.as_ref()
    }

    pub async fn start(config: QuorumConfig, app: Arc<dyn AppHandler>) -> Result<Self, QuorumError> {
        let store_err = |reason: String| QuorumError::Store { path: config.meta_dir.clone(), reason };
        let db = sled::Config::new()
            .path(&config.meta_dir)
            .open()
            .map_err(|e| store_err(format!("cannot open (corrupt, or locked by another process?): {e}")))?;
        let durable = Durable::open(&config.meta_dir).map_err(|e| store_err(format!("cannot sync: {e}")))?;
        let log_store = LogStore::open(&db, durable.clone()).map_err(|e| store_err(e.to_string()))?;
        let (state_machine, applied) = StateMachine::open(&db, durable).map_err(|e| store_err(e.to_string()))?;

        let raft_config = openraft::Config {
            cluster_name: "strom".into(),
            election_timeout_min: config.election_timeout_ms,
            election_timeout_max: config.election_timeout_ms * 2,
            heartbeat_interval: config.heartbeat_interval_ms,
            install_snapshot_timeout: 5_000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_entries),
            max_in_snapshot_log_to_keep: config.snapshot_keep_entries,
            snapshot_max_chunk_size: 1024 * 1024,
            ..Default::default()
        }
        .validate()
        .map_err(|e| QuorumError::Config(e.to_string()))?;

        let network = NetworkFactory { tls: config.tls.clone() };
        let raft = Raft::new(config.node_id, Arc::new(raft_config), network, log_store, state_machine)
            .await
            .map_err(|e| QuorumError::Raft(e.to_string()))?;

        let listener = TcpListener::bind(&config.raft_addr)
            .await
            .map_err(|source| QuorumError::Bind { addr: config.raft_addr.clone(), source })?;
        let contact = LeaderContact::default();
        let server_tls = config.tls.clone();
        let server = tokio::spawn(server::serve(listener, raft.clone(), app, contact.clone(), server_tls));

        let quorum = Self {
            node_id: config.node_id,
            voters: config.voters.clone(),
            raft,
            applied,
            server,
            contact,
            tls: config.tls.clone(),
        };
        if config.voters.contains_key(&config.node_id) {
            quorum.bootstrap().await?;
        }
        Ok(quorum)
    }

    /// On a voter's first start, every voter initializes the same voter set;
    /// openraft accepts the first and refuses the rest harmlessly.
    async fn bootstrap(&self) -> Result<(), QuorumError> {
        let initialized = self.raft.is_initialized().await.map_err(|e| QuorumError::Raft(e.to_string()))?;
        if initialized {
            return Ok(());
        }
        let members: BTreeMap<NodeId, BasicNode> =
            self.voters.iter().map(|(id, addr)| (*id, BasicNode::new(addr.clone()))).collect();
        match self.raft.initialize(members).await {
            Ok(()) => {
                tracing::info!(voters = ?self.voters.keys().collect::<Vec<_>>(), "metadata quorum initialized");
                Ok(())
            }
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(QuorumError::Raft(e.to_string())),
        }
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The voters and their `--raft` addresses: from the committed
    /// membership once this node has one (voters change at runtime and the
    /// change survives restarts), else from the `--quorum` flag.
    pub fn voters(&self) -> BTreeMap<NodeId, String> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        let voters: BTreeMap<NodeId, String> = membership
            .voter_ids()
            .map(|id| (id, membership.get_node(&id).map_or_else(String::new, |n| n.addr.clone())))
            .collect();
        if voters.is_empty() {
            self.voters.clone()
        } else {
            voters
        }
    }

    /// Where to look for the controller: the voters, then any voter of the
    /// `--quorum` flag the membership no longer lists (a node whose flag
    /// is out of date still finds the quorum through the members it names).
    pub fn contact_points(&self) -> Vec<(NodeId, String)> {
        let mut points: Vec<(NodeId, String)> = self.voters().into_iter().collect();
        for (id, addr) in &self.voters {
            if !points.iter().any(|(_, a)| a == addr) {
                points.push((*id, addr.clone()));
            }
        }
        points
    }

    /// Members that replicate the log without voting (observers).
    pub fn learners(&self) -> Vec<NodeId> {
        self.raft.metrics().borrow().membership_config.membership().learner_ids().collect()
    }

    /// The voters a half-done change (a joint configuration) moves to, or
    /// `None` when the membership is uniform.
    pub fn joint_target(&self) -> Option<BTreeSet<NodeId>> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let configs = m.membership_config.membership().get_joint_config();
        (configs.len() > 1).then(|| configs.last().cloned().unwrap_or_default())
    }

    /// On the leader: the last log index each member has (its match index).
    pub fn match_indexes(&self) -> BTreeMap<NodeId, u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.replication
            .as_ref()
            .map(|r| r.iter().map(|(id, log_id)| (*id, log_id.map_or(0, |l| l.index))).collect())
            .unwrap_or_default()
    }

    /// The index of this node's last log entry.
    pub fn last_log_index(&self) -> u64 {
        self.raft.metrics().borrow().last_log_index.unwrap_or(0)
    }

    /// Removes an observer from the membership (leader only): the leader
    /// stops replicating to it.
    pub async fn remove_learner(&self, id: NodeId, timeout: Duration) -> Result<(), ProposeError> {
        let change = self.raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false);
        match tokio::time::timeout(timeout, change).await {
            Err(_) => Err(ProposeError::Timeout(timeout)),
            Ok(Ok(_)) => {
                tracing::info!(node_id = id, "observer removed from the metadata quorum");
                Ok(())
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader { leader: f.leader_id })
            }
            Ok(Err(e)) => Err(ProposeError::Fatal(e.to_string())),
        }
    }

    /// Makes the voter set `voters` through joint consensus (leader only);
    /// voters left out stay as learners, so they keep the whole log.
    pub async fn set_voters(&self, voters: BTreeSet<NodeId>, timeout: Duration) -> Result<u64, ProposeError> {
        let change = self.raft.change_membership(ChangeMembers::ReplaceAllVoters(voters.clone()), true);
        match tokio::time::timeout(timeout, change).await {
            Err(_) => Err(ProposeError::Timeout(timeout)),
            Ok(Ok(response)) => {
                tracing::info!(voters = ?voters, index = response.log_id.index, "metadata quorum voters changed");
                Ok(response.log_id.index)
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader { leader: f.leader_id })
            }
            Ok(Err(e)) => Err(ProposeError::Fatal(e.to_string())),
        }
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    pub fn metrics(&self) -> RaftMetrics<NodeId, BasicNode> {
        self.raft.metrics().borrow().clone()
    }

    /// The previous quorum leader and when this node last heard from it
    /// (None before any other leader was heard since this node started).
    pub fn previous_leader_contact(&self) -> Option<(NodeId, Instant)> {
        self.contact.latest_other_than(self.node_id)
    }

    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.node_id)
    }

    /// The `--raft` address of a member (voter or learner), from membership.
    pub fn member_addr(&self, id: NodeId) -> Option<String> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.membership_config.membership().get_node(&id).map(|n| n.addr.clone()).or_else(|| self.voters.get(&id).cloned())
    }

    /// The latest applied image.
    pub fn image(&self) -> Arc<MetadataImage> {
        self.applied.borrow().image.clone()
    }

    pub fn applied(&self) -> AppliedImage {
        self.applied.borrow().clone()
    }

    /// The log index of the latest applied image (no image clone).
    pub fn applied_index(&self) -> u64 {
        self.applied.borrow().applied_index
    }

    /// A receiver that wakes on every applied batch.
    pub fn subscribe(&self) -> watch::Receiver<AppliedImage> {
        self.applied.clone()
    }

    /// Waits until this node has applied `index`, up to `timeout`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> bool {
        let mut rx = self.applied.clone();
        tokio::time::timeout(timeout, rx.wait_for(|a| a.applied_index >= index)).await.is_ok_and(|r| r.is_ok())
    }

    /// Commits `records` as one atomic batch; returns its log index once
    /// applied on this (leader) node.
    pub async fn propose(&self, records: Vec<MetadataRecord>, timeout: Duration) -> Result<u64, ProposeError> {
        let write = self.raft.client_write(MetaCommand { records });
        match tokio::time::timeout(timeout, write).await {
            Err(_) => Err(ProposeError::Timeout(timeout)),
            Ok(Ok(response)) => Ok(response.log_id.index),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader { leader: f.leader_id })
            }
            Ok(Err(e)) => Err(ProposeError::Fatal(e.to_string())),
        }
    }

    /// Adds an observer as a learner (leader only); no-op if already a member.
    pub async fn add_learner(&self, id: NodeId, raft_addr: String, timeout: Duration) -> Result<(), ProposeError> {
        {
            let m = self.raft.metrics();
            let m = m.borrow();
            let membership = m.membership_config.membership();
            if membership.get_node(&id).is_some_and(|n| n.addr == raft_addr) {
                return Ok(());
            }
        }
        let change = if self.voters().contains_key(&id) {
            return Ok(());
        } else {
            ChangeMembers::AddNodes(BTreeMap::from([(id, BasicNode::new(raft_addr.clone()))]))
        };
        let add = self.raft.change_membership(change, false);
        match tokio::time::timeout(timeout, add).await {
            Err(_) => Err(ProposeError::Timeout(timeout)),
            Ok(Ok(_)) => {
                tracing::info!(node_id = id, %raft_addr, "observer added to the metadata quorum as a learner");
                Ok(())
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader { leader: f.leader_id })
            }
            Ok(Err(e)) => Err(ProposeError::Fatal(e.to_string())),
        }
    }

    pub async fn shutdown(&self) {
        self.server.abort();
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }
}
