//! Producer ids for InitProducerId, taken from blocks the controller hands
//! this broker (recorded in the metadata log, so no id is given twice).

use std::time::Duration;

use crate::controller::protocol::{ControllerRequest, ControllerResponse};
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;

const ALLOCATE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
pub struct ProducerIdAllocator {
    /// The next id and the end of the current block.
    block: tokio::sync::Mutex<(i64, i64)>,
}

impl ProducerIdAllocator {
    pub async fn next(&self, ctx: &NodeContext) -> Result<i64, ApiError> {
        let mut block = self.block.lock().await;
        if block.0 >= block.1 {
            let request = ControllerRequest::AllocateProducerIds { broker_id: ctx.broker_id };
            match ctx.client.send(request, ALLOCATE_TIMEOUT).await? {
                ControllerResponse::ProducerIds { start, len, .. } => *block = (start, start + len),
                ControllerResponse::Error(e) => return Err(e),
                other => {
                    return Err(ApiError::new(ErrorCode::UnknownServerError, format!("unexpected answer {other:?}")))
                }
            }
        }
        let id = block.0;
        block.0 += 1;
        Ok(id)
    }
}
