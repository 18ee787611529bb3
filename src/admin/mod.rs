//! The HTTP admin API (CONTRACT §2), served by every node.
//!
//! Reads come from this node's applied metadata image; writes go to the
//! controller through [`ControllerClient`] and are answered once this node
//! has applied them, so a read after a write on the same node sees it.
//! Errors are `{"error": CODE, "message": sentence}` with 4xx/503 statuses.

mod acls;
pub mod auth;
mod balancer;
mod broker_configs;
mod brokers;
mod cluster;
mod groups;
pub mod metrics;
mod openapi;
mod quorum;
mod quotas;
mod reassignments;
mod topics;
mod users;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::controller::protocol::{ControllerRequest, ControllerResponse};
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;

/// Bound on a write's trip to the controller and back.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on waiting for this node to apply a committed write.
const APPLY_TIMEOUT: Duration = Duration::from_secs(5);

pub type Ctx = State<Arc<NodeContext>>;

/// An [`ApiError`] as an HTTP response.
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> Self {
        HttpError(e)
    }
}

/// A JSON request body, accepted with or without a JSON content type (so a
/// bare `curl -d` works); a body that does not parse is a 400 naming why.
pub struct JsonBody<T>(pub T);

impl<S, T> axum::extract::FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned,
{
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| HttpError(ApiError::new(ErrorCode::InvalidRequest, format!("cannot read the body: {e}"))))?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| HttpError(ApiError::new(ErrorCode::InvalidRequest, format!("malformed JSON body: {e}"))))
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(json!({"error": self.0.code.name(), "message": self.0.message}))).into_response()
    }
}

pub type ApiResult<T> = Result<T, HttpError>;

pub use quorum::view as quorum_view;

/// Sends a write to the controller and waits until this node has applied it.
pub async fn controller_write(ctx: &NodeContext, request: ControllerRequest) -> Result<(), ApiError> {
    match ctx.client.send(request, WRITE_TIMEOUT).await? {
        ControllerResponse::Done { index } => {
            if ctx.quorum.wait_applied(index, APPLY_TIMEOUT).await {
                Ok(())
            } else {
                Err(ApiError::new(
                    ErrorCode::RequestTimedOut,
                    format!("the change was committed at index {index} but this node has not applied it yet"),
                ))
            }
        }
        ControllerResponse::Error(e) => Err(e),
        other => Err(ApiError::new(ErrorCode::UnknownServerError, format!("unexpected controller answer {other:?}"))),
    }
}

async fn track(State(ctx): Ctx, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_string();
    let method = request.method().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    ctx.metrics.observe(&method, &route, response.status().as_u16(), started.elapsed());
    response
}

async fn not_found() -> HttpError {
    HttpError(ApiError::new(ErrorCode::InvalidRequest, "no such endpoint; see /v1/openapi.json"))
}

pub fn router(ctx: Arc<NodeContext>) -> Router {
    Router::new()
        .route("/health", get(cluster::health))
        .route("/ready", get(cluster::ready))
        .route("/metrics", get(cluster::metrics))
        .route("/v1/openapi.json", get(openapi::document))
        .route("/v1/cluster", get(cluster::cluster))
        .route("/v1/brokers", get(cluster::brokers))
        .route("/v1/brokers/configs", get(broker_configs::get).patch(broker_configs::patch))
        .route("/v1/brokers/{id}", get(brokers::describe).delete(brokers::unregister))
        .route("/v1/brokers/{id}/decommission", post(brokers::decommission).delete(brokers::stop_decommission))
        .route(
            "/v1/brokers/{id}/maintenance",
            axum::routing::put(brokers::enter_maintenance).delete(brokers::leave_maintenance),
        )
        .route("/v1/groups", get(groups::list))
        .route("/v1/groups/{id}", get(groups::describe))
        .route("/v1/internal/groups", get(groups::internal_groups))
        .route("/v1/topics", get(topics::list).post(topics::create))
        .route("/v1/topics/{name}", get(topics::describe).delete(topics::delete))
        .route("/v1/topics/{name}/partitions", post(topics::add_partitions))
        .route("/v1/topics/{name}/configs", get(topics::configs).patch(topics::alter_configs))
        .route("/v1/partitions/{topic}/{partition}/elect-leader", post(topics::elect_leader))
        .route("/v1/internal/local-offsets/{name}", get(topics::internal_offsets))
        .route("/v1/partitions/{topic}/{partition}/reassign", post(reassignments::start).delete(reassignments::cancel))
        .route("/v1/reassignments", get(reassignments::list))
        .route("/v1/quorum", get(quorum::describe))
        .route("/v1/balancer", get(balancer::status))
        .route("/v1/quorum/voters", post(quorum::add_voter))
        .route("/v1/quorum/voters/{id}", axum::routing::delete(quorum::remove_voter))
        .route("/v1/internal/quorum", get(quorum::internal))
        .route("/v1/users", get(users::list).post(users::create))
        .route("/v1/acls", get(acls::list).post(acls::create).delete(acls::delete))
        .route("/v1/quotas", get(quotas::list).patch(quotas::patch))
        .route("/v1/users/{name}", axum::routing::delete(users::delete))
        .route("/v1/internal/reassignment-progress", get(reassignments::internal_progress))
        .route_layer(axum::middleware::from_fn_with_state(ctx.clone(), auth::guard))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(ctx.clone(), track))
        .with_state(ctx)
}

/// Serves the admin API on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    ctx: Arc<NodeContext>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let stopped = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    if ctx.admin_security.tls {
        let tls = crate::security::tls::TlsSource::from_settings(&ctx.settings).map_err(std::io::Error::other)?;
        let listener = auth::TlsListener::new(listener, Arc::new(tls));
        let app = router(ctx).into_make_service_with_connect_info::<auth::AdminPeer>();
        return axum::serve(listener, app).with_graceful_shutdown(stopped).await;
    }
    let app = router(ctx).into_make_service_with_connect_info::<auth::AdminPeer>();
    axum::serve(listener, app).with_graceful_shutdown(stopped).await
}
