//! Attach checks remote storage against the index it loads before it trusts a local layer
//! file as a remote copy: a local copy that counts as remote may be evicted, and then the
//! object is all there is.
//!
//! An index names only layers uploaded before it, and a put is durable when it returns, so
//! the objects an index names exist whole. This check is for a store that broke that
//! promise anyway: objects written by a build whose local-directory store did not fsync
//! and then lost in an OS crash, or objects removed or truncated by hand. One listing of
//! the timeline's objects gives each object's size; a layer whose object is missing or of
//! another size than the index says is reported, and the timeline uploads its local copy
//! again (`Timeline::attach_remote`). The content is checked against the index's CRC-32C
//! at every download, so a damaged object of the right size is never served.

use std::collections::{BTreeMap, HashMap};

use remote_storage::RemoteError;

use super::{IndexPart, RemoteTimelineClient};

impl RemoteTimelineClient {
    /// The layers of `index` whose object is missing or has a size other than the index
    /// says, each with the reason.
    pub fn layers_missing_from_remote(&self, index: &IndexPart) -> Result<BTreeMap<String, String>, RemoteError> {
        let listed = self.remote.storage.list(&self.remote.timeline_prefix(self.timeline_id))?;
        let sizes: HashMap<String, u64> = listed.into_iter().map(|o| (o.key, o.size_bytes)).collect();
        let mut missing = BTreeMap::new();
        for (name, layer) in &index.layers {
            let key = self.remote.layer_key(self.timeline_id, name, layer.generation);
            let reason = match sizes.get(&key) {
                Some(&size) if size == layer.size_bytes => continue,
                Some(&size) => format!("object {key} has {size} bytes, the remote index says {}", layer.size_bytes),
                None => format!("object {key} named by the remote index is missing"),
            };
            missing.insert(name.clone(), reason);
        }
        Ok(missing)
    }
}
