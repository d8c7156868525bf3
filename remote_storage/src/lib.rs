//! Object storage for fjord: put, get, list and delete whole objects by key, in a local
//! directory (`file:///path`) or any S3 API (`s3://bucket/prefix?endpoint=...`), through the
//! `object_store` crate.
//!
//! The API is blocking: the pageserver's storage engine runs on threads, and each call here
//! runs its future to completion on a small tokio runtime owned by the `RemoteStorage`.
//! Every call is one attempt with a timeout; retrying with backoff is the caller's policy
//! (`retry`), because only the caller knows whether an operation may be repeated and what
//! to report while it waits.
//!
//! Keys are `/`-separated, relative to the URL's prefix, and never start or end with `/`.
//!
//! Invariants:
//! - An object is written whole or not at all: readers never see part of a put (both
//!   backends put atomically).
//! - `put_if_absent` never replaces an existing object: the local backend creates the file
//!   exclusively, the S3 backend sends `If-None-Match: *` (MinIO and AWS S3 honour it).
//! - A put that returned is durable: it survives an OS crash or power loss. S3 acknowledges
//!   only what it stored; the local backend fsyncs the object's bytes before it is renamed
//!   into place, then its directory, and every directory above it once (`local.rs`).
//! - Credentials are never logged or shown: `Display` names the bucket, prefix and
//!   endpoint only.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use futures::TryStreamExt;
use local::LocalDirs;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig};

/// How long one operation may take before it counts as failed. Layer files are at most a
/// few hundred MiB; at the 10 MiB/s of a slow link that is well within this.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(120);

/// Why an operation failed; callers branch on `NotFound` and `AlreadyExists`.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("object {key} not found in {storage}")]
    NotFound { key: String, storage: String },
    #[error("object {key} already exists in {storage}")]
    AlreadyExists { key: String, storage: String },
    #[error("could not {op} {key} in {storage}: {message}")]
    Failed { op: &'static str, key: String, storage: String, message: String },
    #[error("could not {op} {key} in {storage}: no answer within {} s", timeout.as_secs())]
    Timeout { op: &'static str, key: String, storage: String, timeout: Duration },
}

impl RemoteError {
    /// Whether trying again may succeed (everything but a missing or existing object).
    pub fn is_transient(&self) -> bool {
        matches!(self, RemoteError::Failed { .. } | RemoteError::Timeout { .. })
    }
}

/// One object in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The key, relative to the storage's prefix.
    pub key: String,
    pub size_bytes: u64,
}

/// A handle on one object storage location; cheap to clone.
#[derive(Clone)]
pub struct RemoteStorage {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ObjectStore>,
    /// The local-directory backend's durable directories (`local.rs`); `None` for S3.
    local: Option<LocalDirs>,
    description: String,
    runtime: tokio::runtime::Runtime,
}

impl fmt::Display for RemoteStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.description)
    }
}

impl fmt::Debug for RemoteStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteStorage({})", self.inner.description)
    }
}

impl RemoteStorage {
    /// Opens the storage a URL names:
    /// - `file:///absolute/dir`: a local directory, created if missing;
    /// - `s3://bucket[/prefix][?endpoint=http://host:port&region=...&allow_http=true]`: an
    ///   S3 API, with credentials from `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (and
    ///   the rest of the standard `AWS_*` environment variables).
    pub fn from_url(url: &str) -> anyhow::Result<RemoteStorage> {
        let parsed = url::Url::parse(url).with_context(|| format!("invalid remote storage URL {url:?}"))?;
        let mut local = None;
        let (store, description): (Arc<dyn ObjectStore>, String) = match parsed.scheme() {
            "file" => {
                if parsed.query().is_some() || parsed.host_str().is_some_and(|h| !h.is_empty()) {
                    bail!("invalid remote storage URL {url:?}: a file URL is file:///absolute/path, without host or query");
                }
                let dir =
                    parsed.to_file_path().map_err(|()| anyhow::anyhow!("invalid remote storage URL {url:?}: not an absolute path"))?;
                let (dirs, fs) = LocalDirs::open(&dir).with_context(|| format!("open remote storage directory {}", dir.display()))?;
                local = Some(dirs);
                (fs, format!("directory {}", dir.display()))
            }
            "s3" => {
                let bucket = parsed
                    .host_str()
                    .filter(|b| !b.is_empty())
                    .with_context(|| format!("invalid remote storage URL {url:?}: no bucket"))?;
                let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
                // Connect and overall timeouts per attempt; `allow_http` lives in the same
                // options, so they are built first and the URL's parameters go into them.
                let mut client = ClientOptions::new().with_timeout(OPERATION_TIMEOUT).with_connect_timeout(Duration::from_secs(5));
                let mut endpoint = None;
                for (k, v) in parsed.query_pairs() {
                    match &*k {
                        "endpoint" => {
                            builder = builder.with_endpoint(v.to_string());
                            endpoint = Some(v.to_string());
                        }
                        "region" => builder = builder.with_region(v.to_string()),
                        "allow_http" => client = client.with_allow_http(parse_bool(&v).with_context(|| format!("allow_http in {url:?}"))?),
                        other => bail!("invalid remote storage URL {url:?}: unknown parameter {other:?} (endpoint, region, allow_http)"),
                    }
                }
                // One attempt per call: the caller retries, with its own backoff and status.
                let retry = RetryConfig { max_retries: 0, retry_timeout: OPERATION_TIMEOUT, ..RetryConfig::default() };
                let s3 = builder
                    .with_retry(retry)
                    .with_client_options(client)
                    .build()
                    .with_context(|| format!("configure S3 storage {url:?}"))?;
                let prefix = parsed.path().trim_matches('/').to_string();
                let store: Arc<dyn ObjectStore> =
                    if prefix.is_empty() { Arc::new(s3) } else { Arc::new(PrefixStore::new(s3, ObjectPath::from(prefix.as_str()))) };
                let at = endpoint.map(|e| format!(" at {e}")).unwrap_or_default();
                (store, format!("s3://{bucket}/{prefix}{at}"))
            }
            other => bail!("invalid remote storage URL {url:?}: unknown scheme {other:?} (file or s3)"),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("remote-storage")
            .enable_all()
            .build()
            .context("start the remote storage runtime")?;
        Ok(RemoteStorage { inner: Arc::new(Inner { store, local, description, runtime }) })
    }

    /// Runs one operation to completion with the timeout. Safe to call from a thread that
    /// is itself inside a tokio runtime (it then blocks a scoped thread instead).
    fn run<T: Send>(
        &self,
        op: &'static str,
        key: &str,
        fut: impl Future<Output = object_store::Result<T>> + Send,
    ) -> Result<T, RemoteError> {
        let storage = || self.inner.description.clone();
        let timed = async { tokio::time::timeout(OPERATION_TIMEOUT, fut).await };
        let result = if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| s.spawn(|| self.inner.runtime.block_on(timed)).join().expect("remote storage call panicked"))
        } else {
            self.inner.runtime.block_on(timed)
        };
        match result {
            Err(_) => Err(RemoteError::Timeout { op, key: key.to_string(), storage: storage(), timeout: OPERATION_TIMEOUT }),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(object_store::Error::NotFound { .. })) => Err(RemoteError::NotFound { key: key.to_string(), storage: storage() }),
            Ok(Err(object_store::Error::AlreadyExists { .. })) => {
                Err(RemoteError::AlreadyExists { key: key.to_string(), storage: storage() })
            }
            Ok(Err(e)) => Err(RemoteError::Failed { op, key: key.to_string(), storage: storage(), message: e.to_string() }),
        }
    }

    /// Writes `bytes` as the object `key`, replacing any object there.
    /// Durable when it returns: the local backend fsyncs the object and its directories
    /// (`local.rs`), S3 acknowledges only what it stored.
    pub fn put(&self, key: &str, bytes: Bytes) -> Result<(), RemoteError> {
        let path = ObjectPath::from(key);
        self.run("upload", key, async {
            self.prepare(&path)?;
            self.inner.store.put(&path, PutPayload::from(bytes)).await.map(|_| ())
        })
    }

    /// Before a put to the local backend: the directories above the object exist durably.
    fn prepare(&self, path: &ObjectPath) -> object_store::Result<()> {
        self.inner.local.as_ref().map_or(Ok(()), |local| local.prepare(path))
    }

    /// Writes `bytes` as the object `key` unless an object is there already; returns whether
    /// it did. Durable when it returns, as `put`.
    pub fn put_if_absent(&self, key: &str, bytes: Bytes) -> Result<bool, RemoteError> {
        let path = ObjectPath::from(key);
        let opts = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        let put = async {
            self.prepare(&path)?;
            self.inner.store.put_opts(&path, PutPayload::from(bytes), opts).await.map(|_| ())
        };
        match self.run("upload", key, put) {
            Ok(()) => Ok(true),
            Err(RemoteError::AlreadyExists { .. }) => Ok(false),
            // S3 answers a failed precondition with 412, which object_store reports as such.
            Err(RemoteError::Failed { message, .. }) if message.contains("Precondition") || message.contains("412") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Reads the whole object `key`.
    pub fn get(&self, key: &str) -> Result<Bytes, RemoteError> {
        let path = ObjectPath::from(key);
        self.run("download", key, async { self.inner.store.get(&path).await?.bytes().await })
    }

    /// Every object whose key starts with `prefix/` (all of them for an empty prefix), in
    /// key order.
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, RemoteError> {
        let path = (!prefix.is_empty()).then(|| ObjectPath::from(prefix));
        let mut objects = self.run("list", prefix, async {
            self.inner
                .store
                .list(path.as_ref())
                .map_ok(|m| ObjectInfo { key: m.location.to_string(), size_bytes: m.size })
                .try_collect::<Vec<_>>()
                .await
        })?;
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    /// The names of the "directories" directly under `prefix/`: the next key segment of
    /// every object below it, sorted, without duplicates.
    pub fn list_dirs(&self, prefix: &str) -> Result<Vec<String>, RemoteError> {
        let path = (!prefix.is_empty()).then(|| ObjectPath::from(prefix));
        let listing = self.run("list", prefix, async { self.inner.store.list_with_delimiter(path.as_ref()).await })?;
        let mut names: Vec<String> = listing.common_prefixes.iter().filter_map(|p| p.filename().map(str::to_string)).collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Deletes the object `key`; deleting a missing object is not an error.
    pub fn delete(&self, key: &str) -> Result<(), RemoteError> {
        let path = ObjectPath::from(key);
        match self.run("delete", key, async { self.inner.store.delete(&path).await }) {
            Err(RemoteError::NotFound { .. }) => Ok(()),
            other => other,
        }
    }
}

fn parse_bool(s: &str) -> anyhow::Result<bool> {
    match s {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        other => bail!("expected true or false, not {other:?}"),
    }
}

/// Backoff between attempts of a remote operation: doubles from `initial` up to `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { next: initial, max }
    }

    /// The wait before the next attempt; each call doubles the one after.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
}

/// Calls `op` until it succeeds, fails permanently (`!is_transient`), or `give_up_after`
/// has passed; waits with `backoff` between attempts and reports each failure to
/// `on_error` (attempt number, error) so the caller can log and publish its status.
pub fn retry<T>(
    mut op: impl FnMut() -> Result<T, RemoteError>,
    mut backoff: Backoff,
    give_up_after: Option<Duration>,
    mut on_error: impl FnMut(u32, &RemoteError),
) -> Result<T, RemoteError> {
    let started = Instant::now();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match op() {
            Ok(v) => return Ok(v),
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) => {
                on_error(attempt, &e);
                if give_up_after.is_some_and(|limit| started.elapsed() >= limit) {
                    return Err(e);
                }
                std::thread::sleep(backoff.next_delay());
            }
        }
    }
}

mod local;

#[cfg(test)]
mod tests;
