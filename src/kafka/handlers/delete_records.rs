//! DeleteRecords (`kafka-delete-records`, AdminClient.deleteRecords): moves a
//! partition's log start offset up, on its leader. Records below it are no
//! longer served (a Fetch there is OFFSET_OUT_OF_RANGE, ListOffsets earliest
//! answers the new start), segments wholly below it are deleted, and
//! followers move their own start when their next Fetch answer carries it.

use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use kafka_protocol::ResponseError;

use super::{missing_partition_code, partition_error_code};
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType};

/// Answered once the leader has moved its log start offset, which is made
/// durable first (Kafka also waits until every replica has moved its own;
/// Strom's followers move theirs on their next fetch, within
/// `replica.fetch.wait.max.ms`). The low watermark answered is the leader's
/// new log start offset.
pub fn handle(ctx: &NodeContext, request: DeleteRecordsRequest, client: &Client) -> DeleteRecordsResponse {
    let image = ctx.quorum.image();
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.to_string();
            let allowed = ctx.authorize(client, &image, Operation::Delete, ResourceType::Topic, &name);
            let partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let base =
                        DeleteRecordsPartitionResult::default().with_partition_index(p.partition_index).with_low_watermark(-1);
                    if !allowed {
                        return base.with_error_code(ResponseError::TopicAuthorizationFailed.code());
                    }
                    let Some(partition) = ctx.replicas.get(&name, p.partition_index) else {
                        return base.with_error_code(missing_partition_code(&image, &name, p.partition_index));
                    };
                    match partition.delete_records(p.offset) {
                        Ok(low_watermark) => {
                            tracing::info!(topic = %name, partition = p.partition_index, offset = p.offset, low_watermark,
                                "records deleted");
                            base.with_low_watermark(low_watermark)
                        }
                        Err(e) => base.with_error_code(partition_error_code(&e)),
                    }
                })
                .collect();
            DeleteRecordsTopicResult::default().with_name(topic.name).with_partitions(partitions)
        })
        .collect();
    DeleteRecordsResponse::default().with_topics(topics)
}
