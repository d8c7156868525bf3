//! The CLI's client of the pageserver's management API: JSON in, JSON out, errors carrying
//! the pageserver's own `{"error": ...}` message.

use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::Value;

pub struct PageserverApi {
    base_url: String,
    agent: ureq::Agent,
}

/// The fields of `GET .../timeline` the CLI shows.
#[derive(Debug, Deserialize)]
pub struct TimelineInfo {
    pub timeline_id: String,
    pub ancestor_timeline_id: Option<String>,
    pub ancestor_lsn: Option<String>,
    pub last_record_lsn: String,
    #[serde(default)]
    pub wal_receiver: Option<Value>,
}

impl PageserverApi {
    pub fn new(base_url: &str) -> PageserverApi {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(5)))
            // Import of a large data directory takes a while; nothing else does.
            .timeout_global(Some(Duration::from_secs(600)))
            .build()
            .into();
        PageserverApi { base_url: base_url.trim_end_matches('/').to_string(), agent }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// `GET path`; `Ok(None)` for a 404, so that callers can tell "absent" from "broken".
    pub fn get_optional(&self, path: &str) -> anyhow::Result<Option<Value>> {
        let url = self.url(path);
        let mut response = self.agent.get(&url).call().with_context(|| format!("could not reach the pageserver at {url}"))?;
        if response.status().as_u16() == 404 {
            return Ok(None);
        }
        let status = response.status();
        let text = response.body_mut().read_to_string().with_context(|| format!("read the answer of GET {url}"))?;
        answer(status.as_u16(), &text, "GET", path).map(Some)
    }

    pub fn get(&self, path: &str) -> anyhow::Result<Value> {
        match self.get_optional(path)? {
            Some(v) => Ok(v),
            None => bail!("pageserver: GET {path} failed: HTTP 404"),
        }
    }

    pub fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let url = self.url(path);
        let mut response = self
            .agent
            .post(&url)
            .content_type("application/json")
            .send(body.to_string().as_str())
            .with_context(|| format!("could not reach the pageserver at {url}"))?;
        let status = response.status();
        let text = response.body_mut().read_to_string().with_context(|| format!("read the answer of POST {url}"))?;
        answer(status.as_u16(), &text, "POST", path)
    }

    /// True if the pageserver answers `/v1/status`.
    pub fn is_up(&self) -> bool {
        matches!(self.get("/v1/status"), Ok(v) if v["status"] == "ok")
    }

    pub fn tenants(&self) -> anyhow::Result<Vec<String>> {
        serde_json::from_value(self.get("/v1/tenant")?).context("parse the tenant list")
    }

    pub fn timelines(&self, tenant: &str) -> anyhow::Result<Vec<TimelineInfo>> {
        serde_json::from_value(self.get(&format!("/v1/tenant/{tenant}/timeline"))?).context("parse the timeline list")
    }

    pub fn timeline(&self, tenant: &str, timeline: &str) -> anyhow::Result<TimelineInfo> {
        serde_json::from_value(self.get(&format!("/v1/tenant/{tenant}/timeline/{timeline}"))?).context("parse the timeline")
    }
}

/// The JSON of a 2xx answer (`null` if empty); an error with the server's message otherwise.
fn answer(status: u16, text: &str, method: &str, path: &str) -> anyhow::Result<Value> {
    if (200..300).contains(&status) {
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        return serde_json::from_str(text).with_context(|| format!("parse the answer of {method} {path}"));
    }
    let message = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => map.get("error").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
    .unwrap_or_else(|| text.trim().chars().take(300).collect());
    bail!("pageserver: {method} {path} failed: HTTP {status}: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_become_json_or_errors_with_the_server_message() {
        assert_eq!(answer(201, r#"{"tenant_id": "ab"}"#, "POST", "/v1/tenant").unwrap()["tenant_id"], "ab");
        assert_eq!(answer(202, "", "POST", "/x").unwrap(), Value::Null);
        let err = answer(409, r#"{"error": "tenant ab already exists"}"#, "POST", "/v1/tenant").unwrap_err().to_string();
        assert_eq!(err, "pageserver: POST /v1/tenant failed: HTTP 409: tenant ab already exists");
        assert!(answer(500, "boom", "GET", "/x").unwrap_err().to_string().ends_with("HTTP 500: boom"));
    }
}
