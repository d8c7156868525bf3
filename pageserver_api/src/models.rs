//! Every request and response body of the pageserver's management API, one type each.
//!
//! Requests are strict: they refuse unknown fields (`deny_unknown_fields`), so a typo in a
//! hand-written curl body is an error rather than a silently ignored setting; optional
//! fields are left out when absent, so a client sends `{}` rather than `{"tenant_id": null}`.
//! Responses are lenient: a client ignores fields it does not know, so the server can add
//! one without breaking older clients.
//!
//! The field order of each type is the order of the keys on the wire (serde writes fields
//! in declaration order); where the server built a body with `serde_json::json!`, whose map
//! sorts its keys, the fields are declared in alphabetical order to keep the bytes.

use std::fmt;
use std::path::PathBuf;

use proto::{BlockNumber, ForkNumber, Lsn, LsnParseError, Oid, RelTag, TenantId, TimelineId};
use serde::{Deserialize, Serialize};

use crate::time::{format_rfc3339, parse_rfc3339, HumanDuration, TimeParseError};

/// The response header that names the LSN a basebackup was taken at.
pub const LSN_HEADER: &str = "X-Fjord-Lsn";

/// The content type of a basebackup: a tar stream of a data directory.
pub const BASEBACKUP_CONTENT_TYPE: &str = "application/x-tar";

/// `GET /v1/status`: the pageserver answers, which version it is, and what it can do that
/// a client must not count on from an older one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusResponse {
    /// Always `"ok"`: an answer at all is the liveness signal.
    pub status: String,
    pub version: String,
    /// Capabilities by name ([`FEATURES`]); absent from an older pageserver's answer.
    #[serde(default)]
    pub features: Vec<String>,
}

/// The pageserver rebuilds every page from WAL without full-page images: in particular a
/// visibility-map page whose first record carries neither an image nor `WILL_INIT` (which
/// an older pageserver could not rebuild, for good). compute_ctl turns full-page writes
/// off only when the pageserver says this.
pub const FEATURE_NO_FULL_PAGE_IMAGES: &str = "no-full-page-images";

/// What this version's pageserver reports in `features`.
pub const FEATURES: &[&str] = &[FEATURE_NO_FULL_PAGE_IMAGES];

/// `POST /v1/tenant`. An empty body means a random tenant id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantCreateRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<TenantId>,
}

/// The answer to `POST /v1/tenant` (201): the id of the tenant created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantCreateResponse {
    pub tenant_id: TenantId,
}

/// `POST /v1/tenant/{tenant}/timeline`: an empty timeline, or with `ancestor_timeline_id`
/// a branch of that timeline at `ancestor_lsn` (default: the ancestor's last record LSN).
/// `ancestor_lsn` without `ancestor_timeline_id` is refused (400). An empty body means an
/// empty timeline with a random id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineCreateRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline_id: Option<TimelineId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ancestor_timeline_id: Option<TimelineId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ancestor_lsn: Option<Lsn>,
}

/// One timeline's status: `GET .../timeline/{timeline}`, the elements of
/// `GET .../timeline`, and the answer to `POST .../timeline` (201).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineInfo {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// The timeline this one was branched from; `None` for a root timeline.
    pub ancestor_timeline_id: Option<TimelineId>,
    /// The branch point on the ancestor.
    pub ancestor_lsn: Option<Lsn>,
    /// The end of the last WAL record ingested; `0/0` before the timeline has data.
    pub last_record_lsn: Lsn,
    /// Everything up to here is in layer files.
    pub disk_consistent_lsn: Lsn,
    /// Reads below this LSN are refused: garbage collection may have removed their data.
    pub gc_cutoff_lsn: Lsn,
    /// Layer files of the timeline.
    pub layers: u64,
    /// The WAL receiver, if one runs for the timeline.
    pub wal_receiver: Option<WalReceiverStatus>,
    /// PostgreSQL's system identifier (from the stored control file), in decimal text as
    /// `pg_controldata` prints it; `None` before the timeline has data. compute_ctl greets
    /// the safekeepers with it.
    #[serde(with = "decimal_text_option")]
    pub system_id: Option<u64>,
    /// The uploads to remote storage, when the pageserver has remote storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_storage: Option<RemoteStorageStatus>,
}

/// A timeline's uploads to remote storage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteStorageStatus {
    /// The generation of this attachment of the tenant: part of every object key it writes.
    pub generation: u32,
    /// Every WAL record up to here is in layers in remote storage (the index uploaded last
    /// says so); the safekeepers may remove WAL below it.
    pub remote_consistent_lsn: Lsn,
    /// Uploads, index writes and deletions waiting or running.
    pub queued_operations: u64,
    /// While the operation at the head of the queue keeps failing: the last error.
    #[serde(default)]
    pub last_error: Option<String>,
    /// While it keeps failing: since when (seconds since the Unix epoch).
    #[serde(default)]
    pub failing_since_unix_s: Option<u64>,
    /// Set when another pageserver attached the tenant with a newer generation: this one
    /// stopped uploading and never deletes.
    #[serde(default)]
    pub superseded_by: Option<u32>,
    pub layers_uploaded: u64,
    pub bytes_uploaded: u64,
    pub indexes_uploaded: u64,
    pub objects_deleted: u64,
    /// Evicted layers downloaded again for a read.
    pub layers_downloaded: u64,
    /// Bytes of this timeline's layer files on local disk.
    pub resident_layer_bytes: u64,
}

/// The answer to `POST .../timeline/{timeline}/evict_layers`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictLayersResponse {
    /// Layers whose local copy was deleted.
    pub evicted: u64,
    pub bytes: u64,
}

/// `POST .../timeline/{timeline}/import`: fill an empty timeline from a shut-down
/// PostgreSQL data directory on the pageserver's host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportRequest {
    pub pgdata: PathBuf,
}

/// The answer to an import. Alphabetical field order: see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportResponse {
    /// Where the shutdown checkpoint record starts.
    pub checkpoint_lsn: Lsn,
    /// Databases imported, counting `global/` as one.
    pub databases: u64,
    /// The end of the shutdown checkpoint record: the timeline's last record LSN now.
    pub import_lsn: Lsn,
    /// PostgreSQL's system identifier, in decimal text.
    #[serde(with = "decimal_text")]
    pub system_identifier: u64,
}

/// One server a WAL receiver may stream from over PostgreSQL's physical replication
/// protocol: a safekeeper, or a compute's walsender.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WalSource {
    pub host: String,
    pub port: u16,
    pub user: String,
    /// A compute's own walsender (a timeline without safekeepers), which serves no TLS:
    /// the one source a WAL receiver reads in cleartext even with the cluster CA. It
    /// carries no token (the compute trusts the pageserver's connection) and is part of the
    /// source's identity, so a caller limited to a timeline's registered sources cannot
    /// turn one of them into cleartext.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plaintext: bool,
}

/// `host:port`, with an IPv6 host in brackets: how logs and errors name a source.
impl fmt::Display for WalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The role a pageserver's WAL receiver names when it streams from a safekeeper (which
/// takes any; the name shows in its logs).
pub const SAFEKEEPER_REPLICATION_USER: &str = "fjord";

/// The list shape of a WAL receiver request, `{"sources": [...], "token"?: "..."}`.
///
/// `token` (admin callers only) is what the receiver presents to a source that asks for a
/// password: a storage token narrowed to the timeline (`auth::Claims::storage_for`), so
/// that a source learns no credential for anything else. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WalSourceList {
    pub sources: Vec<WalSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl fmt::Debug for WalSourceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WalSourceList").field("sources", &self.sources).field("token", &self.token.as_ref().map(|_| "<redacted>")).finish()
    }
}

/// `POST .../timeline/{timeline}/wal_receiver` (202): follow the timeline's WAL from these
/// sources, one at a time with failover. Two shapes: a list (the timeline's safekeepers)
/// or, as before lists existed, one source object (a compute's walsender).
///
/// With authentication on, only an admin token sets or changes a timeline's sources; a
/// tenant token (a compute's) may only name sources already registered for the timeline,
/// which (re)starts the receiver on the registered list (403 otherwise).
///
/// The server validates the list where it parses it (1 to 16 sources, no port 0, no empty
/// host or user, no duplicate host and port) and answers 400 with the reason; this type
/// only carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum WalReceiverRequest {
    Sources(WalSourceList),
    Single(WalSource),
}

/// What a WAL receiver is doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WalReceiverState {
    /// Started, no session yet.
    #[default]
    Starting,
    Streaming,
    /// A session failed; the next goes to the next source.
    Reconnecting,
    /// No source has committed WAL past the timeline's last record yet (a branch whose
    /// first compute has not started): nothing to stream; it asks again.
    Waiting,
    /// Another source has more WAL; the next session goes there.
    Switching,
    /// Stopped by a decoding, ingest or local WAL error; `last_error` says which.
    Failed,
    Stopped,
}

impl WalReceiverState {
    /// The name on the wire, for people: `fjord branch list` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            WalReceiverState::Starting => "starting",
            WalReceiverState::Streaming => "streaming",
            WalReceiverState::Reconnecting => "reconnecting",
            WalReceiverState::Waiting => "waiting",
            WalReceiverState::Switching => "switching",
            WalReceiverState::Failed => "failed",
            WalReceiverState::Stopped => "stopped",
        }
    }
}

/// A WAL receiver's status, in [`TimelineInfo::wal_receiver`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalReceiverStatus {
    pub state: WalReceiverState,
    pub connected: bool,
    /// The end of the WAL received from the current source.
    pub last_received_lsn: Option<Lsn>,
    /// The source's WAL end, as its stream last said.
    pub server_wal_end_lsn: Option<Lsn>,
    pub records_ingested: u64,
    /// The end of the WAL fsynced in the local WAL, confirmed to the server as flushed.
    pub durable_lsn: Option<Lsn>,
    pub last_error: Option<String>,
    /// Every source, in the order they are tried.
    pub sources: Vec<WalSourceStatus>,
    /// The index in `sources` of the source being streamed from (or tried).
    pub current_source: Option<usize>,
    /// That source's `host:port`.
    pub current_source_address: Option<String>,
    /// How many times the receiver switched sources because another had more WAL.
    pub lag_switches: u64,
}

/// One source as the receiver knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalSourceStatus {
    pub host: String,
    pub port: u16,
    pub user: String,
    /// Its WAL end as last learned: from `IDENTIFY_SYSTEM` (at session start or a lag
    /// probe) or from the stream's `walEnd`; `None` until one of those.
    pub end_lsn: Option<Lsn>,
    /// Why the last session with it or probe of it failed, until one succeeds.
    pub last_error: Option<String>,
}

/// The query of `GET .../timeline/{timeline}/basebackup[?lsn=X/X][&standby=true]`: the
/// LSN to start a compute at (default: the last record LSN; an explicit one is waited
/// for), and whether the compute is a hot standby (a read replica), whose basebackup
/// starts at the newest running-transactions record at or before the LSN.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BasebackupQuery {
    pub lsn: Option<Lsn>,
    pub standby: bool,
}

/// Why a basebackup query was refused (400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BasebackupQueryError {
    #[error("unknown query parameter {0:?}; expected lsn=X/X or standby=true|false")]
    UnknownParameter(String),
    #[error("invalid standby={0:?}: expected true or false")]
    InvalidStandby(String),
    #[error("invalid LSN: {0}")]
    InvalidLsn(#[from] LsnParseError),
}

impl BasebackupQuery {
    /// The query string with its `?`, or nothing. The `/` of the LSN is left as it is: it
    /// is legal in a query, and the server accepts it percent-encoded too.
    pub fn to_query_string(&self) -> String {
        let mut params = Vec::new();
        if let Some(lsn) = self.lsn {
            params.push(format!("lsn={lsn}"));
        }
        if self.standby {
            params.push("standby=true".to_string());
        }
        if params.is_empty() {
            String::new()
        } else {
            format!("?{}", params.join("&"))
        }
    }

    /// Parses a raw query (without the `?`). Every parameter is checked before the LSN is
    /// parsed, and a repeated `lsn` takes the last value, as the server always did.
    pub fn parse(query: &str) -> Result<BasebackupQuery, BasebackupQueryError> {
        let mut lsn = None;
        let mut standby = false;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("lsn", value)) => lsn = Some(value.replace("%2F", "/").replace("%2f", "/")),
                Some(("standby", "true")) => standby = true,
                Some(("standby", "false")) => standby = false,
                Some(("standby", other)) => return Err(BasebackupQueryError::InvalidStandby(other.to_string())),
                _ => return Err(BasebackupQueryError::UnknownParameter(pair.to_string())),
            }
        }
        Ok(BasebackupQuery { lsn: lsn.map(|l| l.parse()).transpose()?, standby })
    }
}

/// A tenant's own settings: `PUT /v1/tenant/{tenant}/config` (replacing what was set
/// before) and the file `tenant_config.json` in the tenant's directory. An absent field
/// takes the pageserver's default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// How far back in time every timeline stays readable (and branchable): GC keeps
    /// everything needed to read at any LSN committed within this window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pitr_window: Option<HumanDuration>,
}

/// What a pageserver does with a tenant, as the storage controller orders it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LocationMode {
    /// Serves it and ingests its WAL, writing its objects under `generation`.
    Attached,
    /// Holds it ready to take over: not served, no ingest, nothing written.
    Secondary,
    /// Does not hold it (local files may stay).
    Detached,
}

/// `PUT /v1/tenant/{tenant}/location`: the controller's order. `generation` is required
/// for `attached`; for `secondary` and `detached` it is the tenant's generation when the
/// order was given, and the pageserver refuses it (409) while it holds an attachment with
/// that generation or a newer one (the order is stale); without it they are unconditional.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocationConfig {
    pub mode: LocationMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
}

/// One tenant this pageserver holds: `generation` is 0 unless it is attached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLocationState {
    pub tenant_id: TenantId,
    pub mode: LocationMode,
    pub generation: u32,
    /// For an attached tenant: how far each timeline has ingested (the controller cuts a
    /// planned migration over once the destination has caught up with the source).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timelines: Vec<TimelineIngested>,
}

/// A timeline's last ingested record, in a [`TenantLocationState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineIngested {
    pub timeline_id: TimelineId,
    pub last_record_lsn: Lsn,
}

/// `GET /v1/location`: which tenants this pageserver holds and how; the storage
/// controller's heartbeat. `node_id` is the id it was started with, if any.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocationList {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<u64>,
    /// Whether it has joined the controller (its re-attach is done): until then it takes
    /// no orders, and the controller counts its answers as missed heartbeats.
    #[serde(default)]
    pub joined: bool,
    pub tenants: Vec<TenantLocationState>,
}

/// The answer to `GET` and `PUT /v1/tenant/{tenant}/config`: what the tenant sets, and what
/// is in force once the pageserver's defaults fill in the rest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantConfigInfo {
    pub tenant_id: TenantId,
    pub config: TenantConfig,
    pub effective_pitr_window: HumanDuration,
}

/// The answer to `POST .../timeline/{timeline}/checkpoint`: the open in-memory layer was
/// frozen and every frozen layer flushed to L0 layer files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointResponse {
    pub disk_consistent_lsn: Lsn,
    pub layers_created: u64,
    pub bytes_written: u64,
}

/// `POST .../timeline/{timeline}/compact`. An empty body means the defaults: image layers
/// where the delta depth reached `image_creation_threshold`, within the per-run budget,
/// then L0 compaction if the L0 layers reached the threshold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactRequest {
    /// Compact every L0 layer, even below the threshold.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force_l0: bool,
    /// Create image layers for every key range, whatever its depth, without a budget.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force_image_layers: bool,
}

/// `POST .../timeline/{timeline}/lsn_lease`: `holder` (a read replica, by name) reads at
/// `lsn` or above; GC keeps that readable for `ttl_secs`, until the holder renews the lease
/// (usually higher) or it lapses. Refused (400) below the timeline's GC cutoff.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LsnLeaseRequest {
    pub holder: String,
    pub lsn: Lsn,
    pub ttl_secs: u64,
}

/// The answer to `POST .../lsn_lease`: the timeline's leases in force, by holder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LsnLeaseResponse {
    pub leases: Vec<LsnLease>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LsnLease {
    pub holder: String,
    pub lsn: Lsn,
}

/// What a compaction did (`POST .../compact`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactResponse {
    pub l0_layers_removed: u64,
    pub l1_layers_created: u64,
    pub image_layers_created: u64,
    /// The key ranges rebuilt as image layers, and those deep enough but left for a later
    /// run by the budget.
    pub image_ranges: u64,
    pub image_ranges_deferred: u64,
    /// The LSN the image layers were created at, if any were.
    pub image_lsn: Option<Lsn>,
    /// Bytes of L1 and image layer files written.
    pub bytes_written: u64,
}

/// `POST .../timeline/{timeline}/gc`. An empty body means the tenant's PITR window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcRequest {
    /// A PITR window for this run only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pitr_window: Option<HumanDuration>,
}

/// What a GC run did (`POST .../gc`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcResponse {
    /// The timeline's GC cutoff after the run: reads below it are refused.
    pub cutoff_lsn: Lsn,
    /// Where the start of the PITR window fell.
    pub pitr_cutoff: LsnByTimestampResponse,
    pub layers_removed: u64,
    pub bytes_removed: u64,
}

/// The query of `GET .../timeline/{timeline}/get_lsn_by_timestamp?timestamp=<RFC 3339>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LsnByTimestampQuery {
    pub timestamp: std::time::SystemTime,
}

/// Why an LSN-by-timestamp query was refused (400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LsnByTimestampQueryError {
    #[error("unknown query parameter {0:?}; the only one is timestamp=<RFC 3339>")]
    UnknownParameter(String),
    #[error("missing query parameter timestamp=<RFC 3339>")]
    Missing,
    #[error(transparent)]
    InvalidTimestamp(#[from] TimeParseError),
}

impl LsnByTimestampQuery {
    /// The query string with its `?`, the timestamp in UTC with `:` percent-encoded.
    pub fn to_query_string(&self) -> String {
        format!("?timestamp={}", format_rfc3339(self.timestamp).replace(':', "%3A"))
    }

    /// Parses a raw query (without the `?`), percent-decoding the value. A `+` is taken
    /// literally (an offset), not as a space.
    pub fn parse(query: &str) -> Result<LsnByTimestampQuery, LsnByTimestampQueryError> {
        let mut timestamp = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("timestamp", value)) => timestamp = Some(percent_decode(value)),
                _ => return Err(LsnByTimestampQueryError::UnknownParameter(pair.to_string())),
            }
        }
        let text = timestamp.ok_or(LsnByTimestampQueryError::Missing)?;
        Ok(LsnByTimestampQuery { timestamp: parse_rfc3339(&text)? })
    }
}

/// `%XX` escapes decoded; anything malformed is left as it is (the parser then says why).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where a point in time falls in a timeline's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LsnKind {
    /// Commits before and after the time are known: the LSN shows exactly those up to it.
    Present,
    /// After every commit ingested so far: the LSN is the last record LSN.
    Future,
    /// Before every commit still readable: the LSN is the lowest readable one (GC cutoff or
    /// branch point), which shows more than the time.
    Past,
    /// No commit known at all: the LSN is the last record LSN.
    NoData,
}

/// The answer to `GET .../get_lsn_by_timestamp`, and a GC run's PITR cutoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LsnByTimestampResponse {
    pub kind: LsnKind,
    pub lsn: Lsn,
}

/// The `limit` of `GET .../changed_blocks` when the query names none.
pub const CHANGED_BLOCKS_LIMIT_DEFAULT: u64 = 100_000;
/// The largest `limit` the pageserver accepts: it holds that many keys in memory while it
/// lists them, and the answer takes about 45 bytes per block.
pub const CHANGED_BLOCKS_LIMIT_MAX: u64 = 1_000_000;

/// The query of `GET .../timeline/{timeline}/changed_blocks?from=X/X&to=X/X[&limit=N]`:
/// the blocks that may have changed after `from` up to and including `to`, refused (409)
/// if more than `limit` keys changed (default [`CHANGED_BLOCKS_LIMIT_DEFAULT`], at most
/// [`CHANGED_BLOCKS_LIMIT_MAX`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangedBlocksQuery {
    pub from: Lsn,
    pub to: Lsn,
    pub limit: Option<u64>,
}

/// Why a changed-blocks query was refused (400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangedBlocksQueryError {
    #[error("unknown query parameter {0:?}; the parameters are from=X/X, to=X/X and limit=N")]
    UnknownParameter(String),
    #[error("missing query parameter {0}=X/X")]
    Missing(&'static str),
    #[error("query parameter {name}: {error}")]
    InvalidLsn { name: &'static str, error: LsnParseError },
    #[error("invalid limit {0:?}: expected a number of keys from 0 to {CHANGED_BLOCKS_LIMIT_MAX}")]
    InvalidLimit(String),
}

impl ChangedBlocksQuery {
    /// The query string with its `?`; `limit` only if set.
    pub fn to_query_string(&self) -> String {
        match self.limit {
            Some(limit) => format!("?from={}&to={}&limit={limit}", self.from, self.to),
            None => format!("?from={}&to={}", self.from, self.to),
        }
    }

    /// Parses a raw query (without the `?`), percent-decoding the values; a repeated
    /// parameter takes the last value.
    pub fn parse(query: &str) -> Result<ChangedBlocksQuery, ChangedBlocksQueryError> {
        let (mut from, mut to, mut limit) = (None, None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("from", value)) => from = Some(percent_decode(value)),
                Some(("to", value)) => to = Some(percent_decode(value)),
                Some(("limit", value)) => limit = Some(percent_decode(value)),
                _ => return Err(ChangedBlocksQueryError::UnknownParameter(pair.to_string())),
            }
        }
        let lsn = |name: &'static str, text: Option<String>| -> Result<Lsn, ChangedBlocksQueryError> {
            let text = text.ok_or(ChangedBlocksQueryError::Missing(name))?;
            text.parse().map_err(|error| ChangedBlocksQueryError::InvalidLsn { name, error })
        };
        let (from, to) = (lsn("from", from)?, lsn("to", to)?);
        let limit = match limit {
            None => None,
            Some(text) => match text.parse::<u64>() {
                Ok(n) if n <= CHANGED_BLOCKS_LIMIT_MAX => Some(n),
                _ => return Err(ChangedBlocksQueryError::InvalidLimit(text)),
            },
        };
        Ok(ChangedBlocksQuery { from, to, limit })
    }
}

/// The answer to `GET .../changed_blocks`: what a compute must drop from a cache of pages
/// each valid as of an LSN `d` (the page equals its version at `d` on this timeline), with
/// `from` at or below every `d` and `to` where it starts. A cached page must be dropped
/// when an entry covers it with an LSN above its `d`; a page no entry covers so is the
/// same at `to` (the answer may list more than changed, never less):
///
/// - `blocks`: the block's content changed; `lsn` is its newest change. Blocks of the
///   relations and databases listed as gone are left out.
/// - `relations`: the fork was created, extended, truncated or dropped; `nblocks` is its
///   size at `to` (`null`: it does not exist there) and `lsn` is at or after the last such
///   change. Cached blocks at or beyond `nblocks` (all of them for `null`) are stale;
///   those below it are stale only if listed in `blocks`, so a client may drop just the
///   former, or the whole fork.
/// - `databases`: the database existed at `from` and does not at `to`, dropped at or
///   before `lsn`: every cached block of it is stale. Nothing else of it is listed.
///
/// The free space map is never listed: it is not stored, and a compute keeps it locally.
/// Each entry is a JSON array, to keep a large answer small; an array never gains
/// elements (new information would be a new field of this object).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangedBlocksResponse {
    pub from: Lsn,
    pub to: Lsn,
    /// `[spcnode, dbnode, relnode, forknum, blkno, "lsn"]`, in that order.
    pub blocks: Vec<ChangedBlock>,
    /// `[spcnode, dbnode, relnode, forknum, nblocks or null, "lsn"]`.
    pub relations: Vec<ChangedRelation>,
    /// `[spcnode, dbnode, "lsn"]`.
    pub databases: Vec<DroppedDatabase>,
}

/// A block whose content changed, and its newest change: `[spcnode, dbnode, relnode,
/// forknum, blkno, "lsn"]` on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "(Oid, Oid, Oid, u8, u32, Lsn)", into = "(Oid, Oid, Oid, u8, u32, Lsn)")]
pub struct ChangedBlock {
    pub rel: RelTag,
    pub blkno: BlockNumber,
    pub lsn: Lsn,
}

/// A relation fork created, extended, truncated or dropped: its size at `to` (`None` if it
/// does not exist there) and an LSN at or after the last such change. `[spcnode, dbnode,
/// relnode, forknum, nblocks or null, "lsn"]` on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "(Oid, Oid, Oid, u8, Option<u32>, Lsn)", into = "(Oid, Oid, Oid, u8, Option<u32>, Lsn)")]
pub struct ChangedRelation {
    pub rel: RelTag,
    pub nblocks: Option<u32>,
    pub lsn: Lsn,
}

/// A database dropped at or before `lsn`: `[spcnode, dbnode, "lsn"]` on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(Oid, Oid, Lsn)", into = "(Oid, Oid, Lsn)")]
pub struct DroppedDatabase {
    pub spcnode: Oid,
    pub dbnode: Oid,
    pub lsn: Lsn,
}

fn rel_tag(spcnode: Oid, dbnode: Oid, relnode: Oid, forknum: u8) -> Result<RelTag, String> {
    let forknum = ForkNumber::from_u8(forknum).ok_or_else(|| format!("unknown fork number {forknum}"))?;
    Ok(RelTag { spcnode, dbnode, relnode, forknum })
}

impl TryFrom<(Oid, Oid, Oid, u8, u32, Lsn)> for ChangedBlock {
    type Error = String;

    fn try_from((spcnode, dbnode, relnode, forknum, blkno, lsn): (Oid, Oid, Oid, u8, u32, Lsn)) -> Result<Self, String> {
        Ok(ChangedBlock { rel: rel_tag(spcnode, dbnode, relnode, forknum)?, blkno: BlockNumber(blkno), lsn })
    }
}

impl From<ChangedBlock> for (Oid, Oid, Oid, u8, u32, Lsn) {
    fn from(b: ChangedBlock) -> Self {
        (b.rel.spcnode, b.rel.dbnode, b.rel.relnode, b.rel.forknum as u8, b.blkno.0, b.lsn)
    }
}

impl TryFrom<(Oid, Oid, Oid, u8, Option<u32>, Lsn)> for ChangedRelation {
    type Error = String;

    fn try_from((spcnode, dbnode, relnode, forknum, nblocks, lsn): (Oid, Oid, Oid, u8, Option<u32>, Lsn)) -> Result<Self, String> {
        Ok(ChangedRelation { rel: rel_tag(spcnode, dbnode, relnode, forknum)?, nblocks, lsn })
    }
}

impl From<ChangedRelation> for (Oid, Oid, Oid, u8, Option<u32>, Lsn) {
    fn from(r: ChangedRelation) -> Self {
        (r.rel.spcnode, r.rel.dbnode, r.rel.relnode, r.rel.forknum as u8, r.nblocks, r.lsn)
    }
}

impl From<(Oid, Oid, Lsn)> for DroppedDatabase {
    fn from((spcnode, dbnode, lsn): (Oid, Oid, Lsn)) -> Self {
        DroppedDatabase { spcnode, dbnode, lsn }
    }
}

impl From<DroppedDatabase> for (Oid, Oid, Lsn) {
    fn from(d: DroppedDatabase) -> Self {
        (d.spcnode, d.dbnode, d.lsn)
    }
}

/// The body of every error answer (4xx, 5xx): `{"error": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: String,
}

/// A `u64` as decimal text, as the server always wrote system identifiers: they exceed
/// 2^53, past which many JSON readers (JavaScript, `jq`) round numbers.
mod decimal_text {
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(|e| de::Error::custom(format!("invalid decimal number {text:?}: {e}")))
    }
}

/// [`decimal_text`] or `null`.
mod decimal_text_option {
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => text.parse().map(Some).map_err(|e| de::Error::custom(format!("invalid decimal number {text:?}: {e}"))),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests;
