//! The layer map: which layers a timeline has, and which one a read searches next.
//!
//! A read of key `k` at LSN `lsn` walks from newer to older: it starts with the exclusive
//! bound `cont = lsn + 1`, asks [`LayerMap::search`] for the layer holding the newest
//! versions of `k` below `cont`, collects that layer's versions in `floor..cont`, and
//! continues with `cont = floor` until a version stands on its own, an image layer
//! answers, or no layer is left (then the timeline's ancestor takes over).
//!
//! `search` picks, among layers whose key range holds `k` and whose LSN range starts below
//! `cont`:
//! - the newest image layer, if no delta layer (in-memory or file) has versions below
//!   `cont` that are newer than the image: an image layer completes every search;
//! - otherwise the delta layer reaching highest below `cont` (ties: the one starting
//!   lowest), searched down to `floor`, which is the newer of its start and the newest
//!   image layer's end, so that the image is used next instead of older deltas.
//!
//! Correctness does not depend on layers being disjoint: a layer is only ever asked for
//! versions in `floor..cont`, and `cont` only decreases, so no version is collected twice.
//! Layers that overlap in LSN for a key (an L1 layer and the L0 layers it was made from,
//! left by a crash during compaction; two L1 generations) hold the same versions in the
//! overlap, which is what makes any choice among them correct.
//!
//! The map is a plain `Vec` per kind: `search` is O(number of layers) per step, a read is
//! O(layers × steps). Good enough until timelines have thousands of layers; then an
//! interval structure keyed by LSN (as Neon's) is the next step. Timelines replace the
//! whole map on every change (copy-on-write, see `timeline`), so the map needs no locks.

use std::sync::Arc;

use proto::{Key, KeyRange, Lsn};

use crate::layer::{InMemoryLayer, Layer, LayerDesc, LayerFile, LayerKind};

#[derive(Clone, Debug, Default)]
pub struct LayerMap {
    /// The layer taking puts, if any has been put since the last freeze.
    pub open: Option<Arc<InMemoryLayer>>,
    /// Frozen, not yet flushed in-memory layers, oldest first.
    pub frozen: Vec<Arc<InMemoryLayer>>,
    /// Delta and image layer files.
    pub files: Vec<Arc<LayerFile>>,
    /// Where the next open layer starts: the end of the last frozen layer, or the
    /// disk-consistent LSN + 1 after loading.
    pub next_open_layer_at: Lsn,
}

/// The layer to search next and the lowest LSN to search it down to.
#[derive(Clone, Debug)]
pub struct SearchResult {
    pub layer: Layer,
    pub lsn_floor: Lsn,
}

impl LayerMap {
    pub fn new(next_open_layer_at: Lsn) -> LayerMap {
        LayerMap { next_open_layer_at, ..LayerMap::default() }
    }

    /// Every layer, in-memory ones first.
    pub fn all(&self) -> impl Iterator<Item = Layer> + '_ {
        let in_memory = self.open.iter().chain(&self.frozen).map(|l| Layer::InMemory(l.clone()));
        in_memory.chain(self.files.iter().map(|l| Layer::File(l.clone())))
    }

    /// The layer holding the newest versions of `key` below `cont_lsn`; see the module doc.
    pub fn search(&self, key: Key, cont_lsn: Lsn) -> Option<SearchResult> {
        let mut best_delta: Option<(Lsn, Lsn, Layer)> = None; // (reach, start, layer)
        let mut best_image: Option<(Lsn, &Arc<LayerFile>)> = None;
        let mut consider_delta = |desc: &LayerDesc, layer: &dyn Fn() -> Layer| {
            if !desc.key_range.contains(&key) || desc.lsn_range.start >= cont_lsn {
                return;
            }
            let reach = desc.lsn_range.end.min(cont_lsn);
            let better = match &best_delta {
                None => true,
                Some((r, s, _)) => reach > *r || (reach == *r && desc.lsn_range.start < *s),
            };
            if better {
                best_delta = Some((reach, desc.lsn_range.start, layer()));
            }
        };
        for l in self.open.iter().chain(&self.frozen) {
            consider_delta(&l.desc(), &|| Layer::InMemory(l.clone()));
        }
        for f in &self.files {
            let desc = f.desc();
            match desc.kind {
                LayerKind::Delta => consider_delta(desc, &|| Layer::File(f.clone())),
                LayerKind::Image => {
                    let lsn = desc.lsn_range.start;
                    if desc.key_range.contains(&key) && lsn < cont_lsn && best_image.is_none_or(|(b, _)| lsn > b) {
                        best_image = Some((lsn, f));
                    }
                }
            }
        }
        // An image at LSN `i` holds everything up to and including `i`: it ends at `i + 1`.
        let image_end = best_image.map(|(lsn, _)| Lsn(lsn.0 + 1));
        match (best_delta, best_image) {
            (None, None) => None,
            (Some((reach, _, _)), Some((lsn, image))) if image_end.is_some_and(|e| e >= reach) => {
                Some(SearchResult { layer: Layer::File(image.clone()), lsn_floor: lsn })
            }
            (None, Some((lsn, image))) => Some(SearchResult { layer: Layer::File(image.clone()), lsn_floor: lsn }),
            (Some((_, start, layer)), _) => {
                let lsn_floor = image_end.map_or(start, |e| e.max(start));
                Some(SearchResult { layer, lsn_floor })
            }
        }
    }

    /// The L0 delta layers, oldest first.
    pub fn l0_layers(&self) -> Vec<Arc<LayerFile>> {
        let mut l0: Vec<_> = self.files.iter().filter(|f| f.desc().is_l0()).cloned().collect();
        l0.sort_by_key(|f| f.desc().lsn_range.start);
        l0
    }

    /// Adds a layer file, replacing one of the same name (a rewrite of identical content).
    pub fn insert_file(&mut self, layer: Arc<LayerFile>) {
        self.files.retain(|f| f.desc() != layer.desc());
        self.files.push(layer);
    }

    /// Removes the layer files whose descriptions are in `descs`.
    pub fn remove_files(&mut self, descs: &[LayerDesc]) {
        self.files.retain(|f| !descs.contains(f.desc()));
    }

    /// Whether image layers other than `exclude`, each at an LSN in `lsn_lo..=lsn_hi`,
    /// together cover every key of `key_range`.
    pub fn covered_by_images(&self, key_range: &KeyRange, lsn_lo: Lsn, lsn_hi: Lsn, exclude: &LayerDesc) -> bool {
        let mut ranges: Vec<KeyRange> = self
            .files
            .iter()
            .map(|f| f.desc())
            .filter(|d| d.kind == LayerKind::Image && d != &exclude && (lsn_lo..=lsn_hi).contains(&d.lsn_range.start))
            .map(|d| d.key_range)
            .collect();
        ranges.sort_by_key(|r| r.start);
        let mut covered_to = key_range.start;
        for r in ranges {
            if covered_to >= key_range.end {
                break;
            }
            if r.start > covered_to {
                return false;
            }
            covered_to = covered_to.max(r.end);
        }
        covered_to >= key_range.end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StorageConfig;
    use crate::layer::LayerWriter;
    use crate::value::Value;
    use bytes::Bytes;
    use std::path::Path;

    fn file(dir: &Path, kind: LayerKind, keys: KeyRange, lsns: std::ops::Range<Lsn>) -> Arc<LayerFile> {
        let mut w = LayerWriter::new(dir, kind, lsns.clone(), &StorageConfig::default()).unwrap();
        w.put(keys.start, lsns.start, &Value::Image(Bytes::from_static(b"x"))).unwrap();
        Arc::new(w.finish(keys).unwrap())
    }

    fn found(map: &LayerMap, key: Key, cont: u64) -> Option<(String, u64)> {
        map.search(key, Lsn(cont)).map(|r| (r.layer.desc().to_string(), r.lsn_floor.0))
    }

    #[test]
    fn search_prefers_newest_and_stops_deltas_at_images() {
        let dir = tempfile::tempdir().unwrap();
        let k = Key::MIN;
        let mut map = LayerMap::new(Lsn(100));
        let d1 = file(dir.path(), LayerKind::Delta, KeyRange::ALL, Lsn(10)..Lsn(50));
        let img = file(dir.path(), LayerKind::Image, KeyRange::ALL, Lsn(30)..Lsn(31));
        let d2 = file(dir.path(), LayerKind::Delta, KeyRange::ALL, Lsn(50)..Lsn(100));
        for f in [&d1, &img, &d2] {
            map.insert_file(f.clone());
        }
        let name = |f: &Arc<LayerFile>| f.desc().to_string();
        assert_eq!(found(&map, k, 200), Some((name(&d2), 50)));
        assert_eq!(found(&map, k, 50), Some((name(&d1), 31)), "delta searched down to the image only");
        assert_eq!(found(&map, k, 31), Some((name(&img), 30)), "image preferred at a tie");
        assert_eq!(found(&map, k, 30), Some((name(&d1), 10)));
        assert_eq!(found(&map, k, 10), None);
        let open = Arc::new(InMemoryLayer::create(dir.path(), 0, Lsn(100)).unwrap());
        map.open = Some(open);
        assert_eq!(found(&map, k, 200).unwrap().1, 100, "open layer first");
    }

    #[test]
    fn image_coverage_is_a_union_of_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let mid = Key::checkpoint();
        let mut map = LayerMap::new(Lsn(1));
        let left = file(dir.path(), LayerKind::Image, KeyRange { start: Key::MIN, end: mid }, Lsn(40)..Lsn(41));
        map.insert_file(left.clone());
        let none = LayerDesc::image(KeyRange::ALL, Lsn(1));
        assert!(!map.covered_by_images(&KeyRange::ALL, Lsn(0), Lsn(100), &none));
        map.insert_file(file(dir.path(), LayerKind::Image, KeyRange { start: mid, end: Key::MAX }, Lsn(45)..Lsn(46)));
        assert!(map.covered_by_images(&KeyRange::ALL, Lsn(0), Lsn(100), &none));
        assert!(!map.covered_by_images(&KeyRange::ALL, Lsn(0), Lsn(44), &none), "right half too new");
        assert!(!map.covered_by_images(&KeyRange::ALL, Lsn(0), Lsn(100), left.desc()), "excluded layer");
    }
}
