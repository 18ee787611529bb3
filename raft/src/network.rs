//! Outbound quorum RPC: openraft's network factory over [`crate::rpc`].
//!
//! A refused connection is reported as `Unreachable` (openraft backs off);
//! anything else that goes wrong on the wire is a `NetworkError`.

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;

use crate::rpc::{Connection, RpcError, RpcRequest, RpcResponse};
use crate::types::{NodeId, TypeConfig};

/// Makes the connections to peers: plain, or mutual TLS.
#[derive(Clone, Default)]
pub struct NetworkFactory {
    pub tls: Option<crate::tls::NodeTls>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerClient { target, conn: Connection::with_tls(node.addr.clone(), self.tls.clone()) }
    }
}

pub struct PeerClient {
    target: NodeId,
    conn: Connection,
}

type RpcResult<T, E = openraft::error::Infallible> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

fn wire_error<E: std::error::Error>(e: RpcError) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
    match e {
        RpcError::Connect { .. } | RpcError::ConnectTimeout(_) => RPCError::Unreachable(Unreachable::new(&e)),
        other => RPCError::Network(NetworkError::new(&other)),
    }
}

impl PeerClient {
    async fn call(&mut self, req: RpcRequest, option: &RPCOption) -> Result<RpcResponse, RpcError> {
        // Within openraft's soft limit: its own timeout (the hard limit) cancels the call.
        self.conn.call(&req, option.soft_ttl()).await
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        match self.call(RpcRequest::AppendEntries(rpc), &option).await.map_err(wire_error)? {
            RpcResponse::AppendEntries(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            _ => Err(wire_error(RpcError::UnexpectedResponse)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        match self.call(RpcRequest::InstallSnapshot(rpc), &option).await.map_err(wire_error)? {
            RpcResponse::InstallSnapshot(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            _ => Err(wire_error(RpcError::UnexpectedResponse)),
        }
    }

    async fn vote(&mut self, rpc: VoteRequest<NodeId>, option: RPCOption) -> RpcResult<VoteResponse<NodeId>> {
        match self.call(RpcRequest::Vote(rpc), &option).await.map_err(wire_error)? {
            RpcResponse::Vote(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            _ => Err(wire_error(RpcError::UnexpectedResponse)),
        }
    }
}
