//! `GET /v1/balancer`: the balancer's mode, the moves it would start next
//! (a pure function of this node's image, so any node answers), when it last
//! ran on the controller, and the replica and leader counts it evens out.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::Ctx;
use crate::controller::{balancer, drain};

pub async fn status(State(ctx): Ctx) -> Json<Value> {
    let image = ctx.quorum.image();
    let mode = balancer::Mode::parse(ctx.settings.get("balancer.mode").as_deref());
    let max_moves = ctx.settings.u64("balancer.max.concurrent.moves").max(1) as usize;
    // The controller knows the partition sizes leaders report; another node
    // plans with what it knows (nothing), so it shows no byte moves.
    let sizes = ctx.controller.sizes(&image);
    let moves: Vec<Value> = balancer::plan(&image, &sizes, mode, max_moves)
        .into_iter()
        .map(|m| json!({"topic": m.topic, "partition": m.partition, "from": m.from, "to": m.to, "reason": m.reason}))
        .collect();
    let by_broker = |counts: BTreeMap<i32, usize>| -> BTreeMap<String, usize> {
        counts.into_iter().map(|(b, n)| (b.to_string(), n)).collect()
    };
    let last = ctx.controller.last_balance_ms();
    Json(json!({
        "mode": mode.as_str(),
        "moves": moves,
        "last_run_ms": (last >= 0 && ctx.controller.is_active()).then_some(last),
        "moves_started": ctx.controller.is_active().then(|| ctx.controller.moves_started()),
        "imbalance": {
            "replicas": by_broker(drain::replica_counts(&image)),
            "leaders": by_broker(drain::leader_counts(&image)),
            "bytes": ctx.controller.is_active().then(|| {
                balancer::byte_load(&image, &sizes).into_iter().map(|(b, n)| (b.to_string(), n)).collect::<BTreeMap<_, _>>()
            }),
        },
    }))
}
