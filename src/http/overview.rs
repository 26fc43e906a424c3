//! `GET /v1/overview`: the pipeline at a glance ([`crate::overview`]), as JSON.

use std::pin::Pin;
use std::sync::Arc;

use axum::{Json, extract::State, response::IntoResponse, response::Response};

use super::ApiState;
use super::metrics::QueueDepths;
use crate::overview::{QueueDepth, QueueSource, Queues, overview};

impl QueueSource for QueueDepths {
    fn depths(&self) -> Pin<Box<dyn Future<Output = Option<Queues>> + Send + '_>> {
        Box::pin(async move {
            let (age, depths) = self.read().await?;
            Some(Queues {
                age_seconds: age.as_secs_f64(),
                queues: depths
                    .into_iter()
                    .map(|d| QueueDepth {
                        role: d.role,
                        tier: d.tier,
                        messages: d.messages,
                        consumers: d.consumers,
                    })
                    .collect(),
            })
        })
    }
}

/// `GET /v1/overview`.
pub async fn get(State(state): State<Arc<ApiState>>) -> Response {
    let queues = state
        .metrics
        .queues
        .as_deref()
        .map(|q| q as &dyn QueueSource);
    Json(overview(&state.db, queues, &state.topology.exchange).await).into_response()
}
