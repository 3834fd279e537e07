//! Webhook deliveries over HTTP(S): one POST per delivery, no redirects followed (a
//! subscriber's endpoint answers itself), the body of the answer never read beyond its
//! status.
//!
//! Unless internal destinations are allowed, a delivery only goes to public addresses: an
//! address in the URL is checked before sending, and names are resolved by [`PublicOnly`],
//! which hands the connection only the addresses that passed. Checking the name at
//! registration alone would not do: it may resolve elsewhere by the time of a delivery.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use blazar_service::{WebhookRequest, WebhookSender, internal_destination, is_internal_address};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::error::with_causes;

pub struct WebhookPoster {
    http: reqwest::Client,
    allow_internal: bool,
}

impl WebhookPoster {
    /// `allow_internal`: whether deliveries may go to internal addresses (see
    /// [`is_internal_address`]).
    pub fn new(allow_internal: bool) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!(
                "blazar-rs/",
                env!("CARGO_PKG_VERSION"),
                " webhooks"
            ));
        if !allow_internal {
            // A proxy would resolve the name itself, past the check.
            builder = builder.no_proxy().dns_resolver(Arc::new(PublicOnly));
        }
        Ok(WebhookPoster {
            http: builder
                .build()
                .map_err(|e| format!("webhook HTTP client: {e}"))?,
            allow_internal,
        })
    }
}

#[async_trait]
impl WebhookSender for WebhookPoster {
    async fn post(&self, request: &WebhookRequest) -> Result<u16, String> {
        if !self.allow_internal {
            let url = reqwest::Url::parse(&request.url).map_err(|e| e.to_string())?;
            if let Some(why) = url.host().as_ref().and_then(internal_destination) {
                return Err(why);
            }
        }
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
            Err(e) if e.is_timeout() => Err(blazar_core::WEBHOOK_NO_ANSWER.into()),
            Err(e) if e.is_connect() => Err(format!("cannot connect: {}", with_causes(&e))),
            Err(e) => Err(with_causes(&e)),
        }
    }
}

/// Resolves names with the system's resolver and keeps only public addresses.
struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| !is_internal_address(a.ip()))
                .collect();
            if public.is_empty() && !found.is_empty() {
                return Err(format!(
                    "{host} resolves to an internal address ({}), which webhooks may not \
                     reach on this server",
                    found[0].ip()
                )
                .into());
            }
            let addrs: Addrs = Box::new(public.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn request(url: String) -> WebhookRequest {
        WebhookRequest {
            url,
            headers: vec![],
            body: "{}".into(),
            timeout: Duration::from_secs(5),
        }
    }

    /// A local endpoint answering 204 to anything, and how many requests it saw.
    async fn endpoint() -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        (port, seen)
    }

    #[tokio::test]
    async fn internal_destinations_are_refused_by_address_and_by_name() {
        let (port, seen) = endpoint().await;
        let poster = WebhookPoster::new(false).unwrap();
        for url in [
            format!("http://127.0.0.1:{port}/hook"),
            format!("http://[::ffff:127.0.0.1]:{port}/hook"),
            // A name is checked where it resolves, at the time of the delivery.
            format!("http://localhost:{port}/hook"),
            format!("http://localhost.:{port}/hook"),
        ] {
            let refused = poster.post(&request(url.clone())).await.unwrap_err();
            assert!(refused.contains("internal address"), "{url}: {refused}");
        }
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0);

        let poster = WebhookPoster::new(true).unwrap();
        let url = format!("http://127.0.0.1:{port}/hook");
        assert_eq!(poster.post(&request(url)).await.unwrap(), 204);
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_resolver_keeps_public_addresses_only() {
        // Resolution of "localhost" is local (no network needed) and internal only.
        let refused = PublicOnly
            .resolve("localhost".parse().unwrap())
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(refused.contains("internal address"), "{refused}");
    }
}
