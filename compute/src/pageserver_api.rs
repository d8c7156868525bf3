//! compute_ctl's client of the pageserver's management API: the basebackup it starts from,
//! and the request that makes the pageserver follow the new compute's WAL.
//!
//! The basebackup is a tar stream; it is unpacked as it arrives, never held in memory.
//! Errors carry the pageserver's own `{"error": ...}` message.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use proto::{Lsn, TenantId, TimelineId};

/// The response header that names the LSN a basebackup was taken at.
pub const LSN_HEADER: &str = "X-Fjord-Lsn";

pub struct PageserverClient {
    base_url: String,
    agent: ureq::Agent,
}

/// What a basebackup brought.
#[derive(Debug)]
pub struct Basebackup {
    /// The LSN the pageserver says it is at; `None` if it did not say.
    pub lsn: Option<Lsn>,
    pub bytes: u64,
}

impl PageserverClient {
    pub fn new(base_url: &str) -> PageserverClient {
        let agent = ureq::Agent::config_builder()
            // We look at error statuses ourselves, to show the server's message.
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .build()
            .into();
        PageserverClient { base_url: base_url.trim_end_matches('/').to_string(), agent }
    }

    fn timeline_url(&self, tenant: TenantId, timeline: TimelineId) -> String {
        format!("{}/v1/tenant/{tenant}/timeline/{timeline}", self.base_url)
    }

    /// Streams the basebackup of `timeline` (at `lsn`, or its latest) into `dest`.
    pub fn basebackup(&self, tenant: TenantId, timeline: TimelineId, lsn: Option<Lsn>, dest: &Path) -> anyhow::Result<Basebackup> {
        let mut url = format!("{}/basebackup", self.timeline_url(tenant, timeline));
        if let Some(lsn) = lsn {
            url.push_str(&format!("?lsn={lsn}"));
        }
        tracing::info!("fetching basebackup from {url}");
        let response = self.agent.get(&url).call().with_context(|| format!("could not request basebackup from {url}"))?;
        let response = check_status(response, "basebackup")?;
        let lsn = match response.headers().get(LSN_HEADER) {
            Some(v) => {
                let text = v.to_str().map_err(|_| anyhow::anyhow!("basebackup {LSN_HEADER} header is not text"))?;
                Some(text.parse::<Lsn>().with_context(|| format!("basebackup {LSN_HEADER} header"))?)
            }
            None => {
                tracing::warn!("basebackup response has no {LSN_HEADER} header");
                None
            }
        };
        let mut body = CountingReader { inner: response.into_body().into_reader(), bytes: 0 };
        let mut archive = tar::Archive::new(&mut body);
        archive.set_preserve_permissions(true);
        archive.set_overwrite(false);
        archive.unpack(dest).with_context(|| format!("unpack basebackup into {}", dest.display()))?;
        // Whatever follows the end-of-archive marker (block padding) is read so that a
        // truncated stream is reported rather than ignored.
        std::io::copy(&mut body, &mut std::io::sink()).context("read the end of the basebackup stream")?;
        Ok(Basebackup { lsn, bytes: body.bytes })
    }

    /// PostgreSQL's system identifier of `timeline`, from the pageserver's timeline status
    /// (its `system_id` field).
    pub fn system_id(&self, tenant: TenantId, timeline: TimelineId) -> anyhow::Result<u64> {
        let url = self.timeline_url(tenant, timeline);
        let response = self.agent.get(&url).call().with_context(|| format!("could not reach the pageserver at {url}"))?;
        let mut response = check_status(response, "timeline status")?;
        let text = response.body_mut().read_to_string().context("read the timeline status")?;
        let info: serde_json::Value = serde_json::from_str(&text).context("parse the timeline status")?;
        match info.get("system_id") {
            Some(serde_json::Value::String(s)) => s.parse().with_context(|| format!("timeline status has an invalid system_id {s:?}")),
            Some(serde_json::Value::Number(n)) => n.as_u64().with_context(|| format!("timeline status has an invalid system_id {n}")),
            Some(serde_json::Value::Null) => bail!("timeline {timeline} has no data yet (no system_id); import or branch it first"),
            _ => bail!("the pageserver's timeline status has no system_id (is the pageserver too old?)"),
        }
    }

    /// Asks the pageserver to stream WAL of `timeline` from the safekeepers (any of them; it
    /// takes committed WAL only).
    pub fn start_wal_receiver_from_safekeepers(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        safekeepers: &[(String, u16)],
    ) -> anyhow::Result<()> {
        let sources: Vec<_> =
            safekeepers.iter().map(|(host, port)| serde_json::json!({ "host": host, "port": port, "user": "fjord" })).collect();
        self.post_wal_receiver(tenant, timeline, serde_json::json!({ "sources": sources }))
    }

    /// Asks the pageserver to stream WAL of `timeline` from the compute at `host:port`.
    pub fn start_wal_receiver(&self, tenant: TenantId, timeline: TimelineId, host: &str, port: u16, user: &str) -> anyhow::Result<()> {
        self.post_wal_receiver(tenant, timeline, serde_json::json!({ "host": host, "port": port, "user": user }))
    }

    fn post_wal_receiver(&self, tenant: TenantId, timeline: TimelineId, body: serde_json::Value) -> anyhow::Result<()> {
        let url = format!("{}/wal_receiver", self.timeline_url(tenant, timeline));
        let body = body.to_string();
        let response = self
            .agent
            .post(&url)
            .content_type("application/json")
            .send(body.as_str())
            .with_context(|| format!("could not reach the pageserver at {url}"))?;
        check_status(response, "wal_receiver")?;
        Ok(())
    }
}

/// Passes a 2xx response through; turns any other into an error with the server's message.
fn check_status(mut response: ureq::http::Response<ureq::Body>, what: &str) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let text = response.body_mut().read_to_string().unwrap_or_default();
    bail!("pageserver refused the {what} request: HTTP {}: {}", status.as_u16(), server_message(&text))
}

/// The `error` field of a JSON error body, else the body itself, else "no message".
pub fn server_message(body: &str) -> String {
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(body) {
        if let Some(serde_json::Value::String(e)) = map.get("error") {
            return e.clone();
        }
    }
    match body.trim() {
        "" => "no message (is this pageserver too old to have the route?)".to_string(),
        t => t.chars().take(500).collect(),
    }
}

struct CountingReader<R> {
    inner: R,
    bytes: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_messages_are_extracted() {
        assert_eq!(server_message(r#"{"error": "tenant 11 not found"}"#), "tenant 11 not found");
        assert_eq!(server_message("plain text\n"), "plain text");
        assert!(server_message("").contains("no message"));
    }
}
