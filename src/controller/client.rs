//! Sends requests to whichever node is the controller.
//!
//! The local controller is called directly; any other is reached over the
//! quorum RPC (`App` frames). Until the leader is known (an observer before
//! it has joined, or during an election) the voters are tried in turn, and a
//! `NotController` answer naming the leader redirects the next try. Every
//! call is bounded by a deadline: with no quorum the caller gets
//! `NOT_CONTROLLER` or `REQUEST_TIMED_OUT` in bounded time, never a hang.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strom_raft::codec;
use strom_raft::rpc::{Connection, RpcError};
use strom_raft::Quorum;

use super::protocol::{ControllerRequest, ControllerResponse};
use super::Controller;
use crate::error::{ApiError, ErrorCode};

/// Backoff between tries while no controller answers.
const RETRY_BACKOFF: Duration = Duration::from_millis(100);

pub struct ControllerClient {
    node_id: u64,
    quorum: Arc<Quorum>,
    controller: Arc<Controller>,
    connections: tokio::sync::Mutex<HashMap<String, Connection>>,
}

impl ControllerClient {
    pub fn new(quorum: Arc<Quorum>, controller: Arc<Controller>) -> Self {
        Self { node_id: quorum.node_id(), quorum, controller, connections: tokio::sync::Mutex::new(HashMap::new()) }
    }

    /// The controller's answer, or `Err(sent)`: whether the request may have
    /// reached it (anything but a refused or timed-out connection attempt).
    async fn call_remote(
        &self,
        addr: &str,
        request: &ControllerRequest,
        timeout: Duration,
    ) -> Result<ControllerResponse, bool> {
        let bytes = codec::encode(request).map_err(|_| false)?;
        let mut conns = self.connections.lock().await;
        let tls = self.quorum.node_tls().cloned();
        let conn = conns.entry(addr.to_string()).or_insert_with(|| Connection::with_tls(addr, tls));
        match conn.call_app(bytes, timeout).await {
            Ok(answer) => codec::decode(&answer).map_err(|e| {
                tracing::warn!(%addr, error = %e, "undecodable controller answer");
                true
            }),
            Err(e) => {
                tracing::debug!(%addr, error = %e, "controller call failed");
                Err(!matches!(e, RpcError::Connect { .. } | RpcError::ConnectTimeout(_)))
            }
        }
    }

    /// Sends `request` to the controller, retrying redirections and
    /// unreachable peers until `timeout` has passed. A request that is not
    /// safe to repeat ([`ControllerRequest::retry_safe`]) is sent again only
    /// when it surely was not carried out: after a lost answer, or a
    /// controller that lost its leadership while writing it, the entry may
    /// still commit, and a second try would be decided against the first
    /// (a topic created twice, a delete answered 404). That ends in an error
    /// saying the outcome is unknown.
    pub async fn send(&self, request: ControllerRequest, timeout: Duration) -> Result<ControllerResponse, ApiError> {
        let deadline = Instant::now() + timeout;
        let voters = self.quorum.contact_points();
        let mut hint: Option<(u64, Option<String>)> = None;
        let mut next_voter = 0usize;
        let mut last = ApiError::new(ErrorCode::NotController, "no controller is elected");
        loop {
            let now = Instant::now();
            if now >= deadline {
                last.message = format!("{} (gave up after {} ms)", last.message, timeout.as_millis());
                return Err(last);
            }
            let remaining = deadline - now;
            let target = hint.take().or_else(|| self.quorum.leader().map(|l| (l, None)));
            let target_id = target.as_ref().map(|t| t.0);
            let response = match target {
                Some((id, _)) if id == self.node_id => Ok(self.controller.handle(request.clone()).await),
                Some((id, addr)) => match addr.or_else(|| self.quorum.member_addr(id)) {
                    Some(addr) => self.call_remote(&addr, &request, remaining).await,
                    None => Err(false),
                },
                None if !voters.is_empty() => {
                    let (_, addr) = &voters[next_voter % voters.len()];
                    next_voter += 1;
                    self.call_remote(addr, &request, remaining).await
                }
                None => Err(false),
            };
            match response {
                Ok(ControllerResponse::NotController { leader, leader_addr }) => {
                    last = ApiError::new(ErrorCode::NotController, "no controller is elected");
                    // Follow a redirect only to a different node; otherwise
                    // it is still electing, so fall back to the voters.
                    hint = leader.filter(|l| Some(*l) != target_id).map(|l| (l, leader_addr));
                }
                // Leadership lost after the request was validated and proposed.
                Ok(ControllerResponse::Error(e)) if e.code == ErrorCode::NotController => {
                    if !request.retry_safe() {
                        return Err(outcome_unknown(&e.message));
                    }
                    last = e;
                }
                Ok(other) => return Ok(other),
                Err(sent) => {
                    if sent && !request.retry_safe() {
                        return Err(outcome_unknown("the controller did not answer"));
                    }
                    last = ApiError::new(ErrorCode::NotController, "the controller could not be reached");
                    next_voter += 1;
                }
            }
            if hint.is_none() {
                tokio::time::sleep(RETRY_BACKOFF.min(deadline.saturating_duration_since(Instant::now()))).await;
            }
        }
    }
}

fn outcome_unknown(why: &str) -> ApiError {
    ApiError::new(
        ErrorCode::RequestTimedOut,
        format!("{why}: the change may or may not have been made; read the current state before retrying"),
    )
}
