//! Webhook deliveries over HTTP(S): one POST per delivery, no redirects followed (a
//! subscriber's endpoint answers itself), the body of the answer never read beyond its
//! status.

use async_trait::async_trait;
use blazar_service::{WebhookRequest, WebhookSender};

pub struct WebhookPoster {
    http: reqwest::Client,
}

impl WebhookPoster {
    pub fn new() -> Result<Self, String> {
        Ok(WebhookPoster {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!(
                    "blazar-rs/",
                    env!("CARGO_PKG_VERSION"),
                    " webhooks"
                ))
                .build()
                .map_err(|e| format!("webhook HTTP client: {e}"))?,
        })
    }
}

#[async_trait]
impl WebhookSender for WebhookPoster {
    async fn post(&self, request: &WebhookRequest) -> Result<u16, String> {
        let mut builder = self
            .http
            .post(&request.url)
            .timeout(request.timeout)
            .body(request.body.clone());
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        match builder.send().await {
            Ok(response) => Ok(response.status().as_u16()),
            Err(e) if e.is_timeout() => Err("no answer in time".into()),
            Err(e) if e.is_connect() => Err(format!("cannot connect: {e}")),
            Err(e) => Err(e.to_string()),
        }
    }
}
