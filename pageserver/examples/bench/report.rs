//! The benchmark's results and their three renderings: a table for the terminal, JSON for
//! `target/bench/`, and a Markdown section for `docs/benchmarks.md`. Written by hand (no
//! serde_json in this crate): the values are numbers and plain strings.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::Args;

const MIB: f64 = 1024.0 * 1024.0;

/// Latency percentiles of one measured case.
pub struct Latency {
    pub samples: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub mean: Duration,
}

impl Latency {
    pub fn from_samples(mut times: Vec<Duration>) -> Latency {
        assert!(!times.is_empty(), "a latency needs samples");
        times.sort();
        let at = |q: f64| times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1];
        let mean = times.iter().sum::<Duration>() / times.len() as u32;
        Latency { samples: times.len(), p50: at(0.50), p99: at(0.99), max: times[times.len() - 1], mean }
    }

    fn micros(d: Duration) -> f64 {
        d.as_secs_f64() * 1e6
    }
}

/// One ingest measurement.
pub struct Throughput {
    pub wal_bytes: u64,
    pub records: u64,
    pub wall: Duration,
    pub cpu: Duration,
}

impl Throughput {
    pub fn mib_per_s(&self) -> f64 {
        self.wal_bytes as f64 / MIB / self.wall.as_secs_f64()
    }

    pub fn mib_per_cpu_s(&self) -> f64 {
        self.wal_bytes as f64 / MIB / self.cpu.as_secs_f64()
    }
}

/// Where the numbers were measured.
pub struct Machine {
    pub date: String,
    pub cpu_model: String,
    pub nproc: usize,
    pub flavor: String,
    pub postgres: String,
    pub command: String,
    /// `/proc/loadavg` when the numbers were reported: how shared the machine was.
    pub load: String,
}

impl Machine {
    pub fn detect(args: &Args, pg_bin: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_string()))
            .unwrap_or_else(|| "unknown CPU".into());
        let postgres = std::process::Command::new(pg_bin.join("postgres"))
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|e| format!("unknown ({e})"));
        Machine {
            date: args.date.clone(),
            cpu_model,
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            flavor: args.flavor.clone(),
            postgres,
            command: args.command.clone(),
            load: std::fs::read_to_string("/proc/loadavg")
                .map_or_else(|_| "unknown".into(), |l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")),
        }
    }

    fn flavor_note(&self) -> &'static str {
        if self.flavor == "debug" {
            "assertions on (--enable-cassert); WAL redo and the server run slower than a release build"
        } else {
            "no assertions"
        }
    }
}

pub struct Results {
    pub scale: u32,
    pub duration_s: u32,
    pub clients: u32,
    pub tps: String,
    pub workload_time: Duration,
    pub ingest_init: Throughput,
    pub ingest_run: Throughput,
    /// (records after the image as built, records the read found, latency, latency of
    /// collecting the image and records alone)
    pub redo_latency: Vec<(u32, usize, Latency, Latency)>,
    /// pgbench_branches block 0 before image layers: (records after its image, latency).
    pub hottest: (usize, Latency),
    /// With folds on: the records the materializer replaced by images during ingest.
    pub folds: Option<u64>,
    pub image_hit: Latency,
    pub accounts_blocks: u32,
    pub l0_bytes: u64,
    pub l1_bytes: u64,
    pub image_bytes: u64,
    pub resident_bytes: u64,
    pub import_bytes: u64,
    pub compaction_time: Duration,
    pub l0_compacted: usize,
    pub image_time: Duration,
    pub image_layers: usize,
    pub total_time: Duration,
}

impl Results {
    fn wal_bytes(&self) -> u64 {
        self.ingest_init.wal_bytes + self.ingest_run.wal_bytes
    }

    fn ratio(&self, bytes: u64) -> f64 {
        bytes as f64 / self.wal_bytes() as f64
    }

    /// The rows shared by the table and the Markdown section: (what, value).
    fn rows(&self) -> Vec<(String, String)> {
        let mut rows = Vec::new();
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / MIB);
        for (name, t) in [("pgbench -i", &self.ingest_init), ("pgbench -T (+ final flush)", &self.ingest_run)] {
            rows.push((
                format!("WAL ingest, {name}"),
                format!(
                    "{:.1} MiB/s wall, {:.1} MiB/s per CPU second ({} of WAL, {} records, {:.0} records/s, in {:.2?}, CPU {:.2?})",
                    t.mib_per_s(),
                    t.mib_per_cpu_s(),
                    mib(t.wal_bytes),
                    t.records,
                    t.records as f64 / t.wall.as_secs_f64(),
                    t.wall,
                    t.cpu
                ),
            ));
        }
        let lat = |l: &Latency| {
            format!(
                "p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs ({} reads)",
                Latency::micros(l.p50),
                Latency::micros(l.p99),
                Latency::micros(l.max),
                l.samples
            )
        };
        rows.push((
            format!("GetPage@LSN, image hit (random of {} pgbench_accounts blocks, image layer)", self.accounts_blocks),
            lat(&self.image_hit),
        ));
        for (n, found, l, collect) in &self.redo_latency {
            rows.push((
                format!("GetPage@LSN, image + {n} records (found {found}) via WAL redo"),
                format!("{}; collecting the versions alone: p50 {:.0} µs", lat(l), Latency::micros(collect.p50)),
            ));
        }
        rows.push((
            format!("GetPage@LSN, pgbench_branches block 0: image + {} records via WAL redo", self.hottest.0),
            lat(&self.hottest.1),
        ));
        rows.push((
            "layer bytes written / WAL bytes, before compaction (L0)".into(),
            format!("{:.3} ({})", self.ratio(self.l0_bytes), mib(self.l0_bytes)),
        ));
        let after = self.l0_bytes + self.l1_bytes + self.image_bytes;
        rows.push((
            "layer bytes written / WAL bytes, after compaction and image layers".into(),
            format!("{:.3} ({} = L0 + {} L1 + {} image)", self.ratio(after), mib(after), mib(self.l1_bytes), mib(self.image_bytes)),
        ));
        rows.push((
            "layer bytes on disk at the end / WAL bytes".into(),
            format!("{:.3} ({})", self.ratio(self.resident_bytes), mib(self.resident_bytes)),
        ));
        rows.push((
            "compaction; image layer creation (whole key space)".into(),
            format!(
                "{} L0 layers in {:.2?}; {} image layers in {:.2?}",
                self.l0_compacted, self.compaction_time, self.image_layers, self.image_time
            ),
        ));
        rows
    }

    pub fn table(&self, m: &Machine) -> String {
        let mut out = format!(
            "pageserver benchmark: pgbench scale {}, {} s, {} clients ({}); {}; {} ({}); {} x {}, load {}\n",
            self.scale, self.duration_s, self.clients, self.tps, m.date, m.postgres, m.flavor, m.nproc, m.cpu_model, m.load
        );
        let rows = self.rows();
        let width = rows.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0);
        for (k, v) in rows {
            writeln!(out, "  {k:<width$}  {v}").unwrap();
        }
        write!(out, "  total {:.1?} (workload {:.1?})", self.total_time, self.workload_time).unwrap();
        out
    }

    pub fn markdown(&self, m: &Machine) -> String {
        let mut out = String::new();
        writeln!(out, "Measured {} on {} ({} cores by `nproc`; load average {} at the end).", m.date, m.cpu_model, m.nproc, m.load)
            .unwrap();
        writeln!(out, "PostgreSQL: {}, flavor **{}**: {}.", m.postgres, m.flavor, m.flavor_note()).unwrap();
        writeln!(out, "The pageserver is a release build (`cargo run --release`), on one thread.").unwrap();
        match self.folds {
            Some(n) => writeln!(
                out,
                "Folds on (`fold_after_records` 128): the materializer thread (its own WAL redo process, at most 0.25 of a core) ran beside ingest and made {n} images of hot pages."
            )
            .unwrap(),
            None => writeln!(out, "Folds off: no materializer ran beside ingest.").unwrap(),
        }
        writeln!(out, "Command: `{}`", m.command).unwrap();
        writeln!(
            out,
            "\nWorkload: `pgbench -i -s {}`, then `pgbench -T {} -c {}` ({}), then a checkpoint and the hot-page updates.\n",
            self.scale, self.duration_s, self.clients, self.tps
        )
        .unwrap();
        writeln!(out, "| measurement | result |\n|---|---|").unwrap();
        for (k, v) in self.rows() {
            writeln!(out, "| {k} | {v} |").unwrap();
        }
        writeln!(out, "\nTotal run time {:.0?}.", self.total_time).unwrap();
        out
    }

    pub fn json(&self, m: &Machine) -> String {
        let s = |v: &str| format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""));
        let lat = |l: &Latency| {
            format!(
                "{{\"samples\": {}, \"p50_us\": {:.1}, \"p99_us\": {:.1}, \"max_us\": {:.1}, \"mean_us\": {:.1}}}",
                l.samples,
                Latency::micros(l.p50),
                Latency::micros(l.p99),
                Latency::micros(l.max),
                Latency::micros(l.mean)
            )
        };
        let thr = |t: &Throughput| {
            format!(
                "{{\"wal_bytes\": {}, \"records\": {}, \"wall_s\": {:.3}, \"cpu_s\": {:.3}, \"mib_per_s\": {:.2}, \"mib_per_cpu_s\": {:.2}}}",
                t.wal_bytes,
                t.records,
                t.wall.as_secs_f64(),
                t.cpu.as_secs_f64(),
                t.mib_per_s(),
                t.mib_per_cpu_s()
            )
        };
        let redo: Vec<String> = self
            .redo_latency
            .iter()
            .map(|(n, found, l, collect)| {
                format!("{{\"records\": {n}, \"records_found\": {found}, \"latency\": {}, \"collect_latency\": {}}}", lat(l), lat(collect))
            })
            .collect();
        format!(
            "{{\n  \"date\": {},\n  \"machine\": {{\"cpu_model\": {}, \"nproc\": {}, \"load_average\": {}}},\n  \"postgres\": {},\n  \"flavor\": {},\n  \
             \"command\": {},\n  \"workload\": {{\"scale\": {}, \"duration_s\": {}, \"clients\": {}, \"tps\": {}}},\n  \
             \"ingest\": {{\"pgbench_init\": {}, \"pgbench_run\": {}}},\n  \
             \"getpage\": {{\"image_hit\": {}, \"redo\": [{}], \"hottest_page\": {{\"records\": {}, \"latency\": {}}}}},\n  \
             \"folds\": {},\n  \
             \"layer_bytes\": {{\"wal\": {}, \"import\": {}, \"l0\": {}, \"l1\": {}, \"image\": {}, \"resident\": {}, \
             \"written_per_wal_byte_before_compaction\": {:.4}, \"written_per_wal_byte_after_compaction\": {:.4}}},\n  \
             \"compaction_s\": {:.3},\n  \"image_layers_s\": {:.3},\n  \"total_s\": {:.1}\n}}\n",
            s(&m.date),
            s(&m.cpu_model),
            m.nproc,
            s(&m.load),
            s(&m.postgres),
            s(&m.flavor),
            s(&m.command),
            self.scale,
            self.duration_s,
            self.clients,
            s(&self.tps),
            thr(&self.ingest_init),
            thr(&self.ingest_run),
            lat(&self.image_hit),
            redo.join(", "),
            self.hottest.0,
            lat(&self.hottest.1),
            self.folds.map_or("null".to_string(), |n| n.to_string()),
            self.wal_bytes(),
            self.import_bytes,
            self.l0_bytes,
            self.l1_bytes,
            self.image_bytes,
            self.resident_bytes,
            self.ratio(self.l0_bytes),
            self.ratio(self.l0_bytes + self.l1_bytes + self.image_bytes),
            self.compaction_time.as_secs_f64(),
            self.image_time.as_secs_f64(),
            self.total_time.as_secs_f64(),
        )
    }
}
