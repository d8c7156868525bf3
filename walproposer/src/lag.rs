//! How far behind the pageserver is, in time: how long the oldest WAL that the pageserver
//! could have (committed: on a majority of safekeepers, which serve nothing else) has waited
//! for it to apply it.
//!
//! The compute's backpressure (`fjord.max_pageserver_lag_time`) compares against it. A
//! read of a page that is not local waits for the pageserver to apply WAL up to the page's
//! last-written LSN, and how long that takes depends on how fast the pageserver ingests,
//! not on how many bytes lie between: a bulk load's WAL (few, large records) ingests at
//! hundreds of MiB/s, small OLTP records at a few MiB/s. A limit in bytes either throttles
//! bulk loads that the pageserver would catch up on at once or lets an OLTP stream build
//! up seconds of wait; a limit on this age fits both.
//!
//! [`ApplyLag`] keeps samples of (commit LSN, when it was first seen), at most one per
//! [`SAMPLE_SPACING`], and drops those the pageserver has applied. The lag is the time
//! since the first sample beyond the apply LSN: about when the oldest WAL not yet applied
//! was committed (within `SAMPLE_SPACING`, as the caller saw the commit LSN move). Like
//! PostgreSQL's walsender lag tracker, it measures the past, not a forecast. WAL that is
//! not committed does not count: the pageserver cannot have it, and while the safekeepers
//! hold commits back, holding them back for the pageserver as well would change nothing.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use proto::Lsn;

/// At most one sample per this much time.
pub const SAMPLE_SPACING: Duration = Duration::from_millis(2);

/// At most this many samples are kept (with [`SAMPLE_SPACING`], at least 16 s of flushes);
/// past it the oldest is dropped, which only makes an already long lag read shorter than
/// it is, never a short one longer.
pub const SAMPLES_MAX: usize = 8192;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct ApplyLag {
    samples: VecDeque<(Lsn, Instant)>,
}

impl ApplyLag {
    pub fn new() -> ApplyLag {
        ApplyLag::default()
    }

    /// WAL was committed up to `committed` as of `now` (monotone in both; lower values are
    /// ignored).
    pub fn committed(&mut self, committed: Lsn, now: Instant) {
        match self.samples.back_mut() {
            Some((lsn, _)) if committed <= *lsn => {}
            // Within the spacing the newest sample moves up: its time stays the first time
            // WAL past the sample before it was seen.
            Some((lsn, at)) if now.saturating_duration_since(*at) < SAMPLE_SPACING => *lsn = committed,
            _ => {
                if self.samples.len() == SAMPLES_MAX {
                    self.samples.pop_front();
                }
                self.samples.push_back((committed, now));
            }
        }
    }

    /// The age at `now` of the oldest committed WAL beyond `applied`; zero when the
    /// pageserver has applied everything committed.
    pub fn lag(&mut self, applied: Lsn, now: Instant) -> Duration {
        // A sample whose LSN the pageserver reached is of no further use, except the newest
        // (it marks what was already committed, so the next commit gets a sample of its own).
        while self.samples.len() > 1 && self.samples[0].0 <= applied {
            self.samples.pop_front();
        }
        match self.samples.front() {
            Some(&(lsn, at)) if lsn > applied => {
                // WAL beyond `applied` exists since the sample before this one at the
                // earliest; this sample's time is when it was first seen.
                now.saturating_duration_since(at)
            }
            _ => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn no_lag_when_everything_is_applied() {
        let t0 = Instant::now();
        let mut l = ApplyLag::new();
        assert_eq!(l.lag(Lsn(0), t0), Duration::ZERO);
        l.committed(Lsn(100), t0);
        assert_eq!(l.lag(Lsn(100), t0 + ms(500)), Duration::ZERO);
        assert_eq!(l.lag(Lsn(200), t0 + ms(500)), Duration::ZERO);
    }

    #[test]
    fn the_lag_is_the_age_of_the_oldest_unapplied_flush() {
        let t0 = Instant::now();
        let mut l = ApplyLag::new();
        l.committed(Lsn(100), t0);
        l.committed(Lsn(200), t0 + ms(100));
        l.committed(Lsn(300), t0 + ms(200));
        // Nothing applied: WAL up to 100 was flushed at t0.
        assert_eq!(l.lag(Lsn(0), t0 + ms(1000)), ms(1000));
        // 100 applied: what is older than 200 was first seen at t0 + 100 ms.
        assert_eq!(l.lag(Lsn(100), t0 + ms(1000)), ms(900));
        // Part of the WAL up to 200 applied: its rest was flushed at t0 + 100 ms.
        assert_eq!(l.lag(Lsn(150), t0 + ms(1000)), ms(900));
        assert_eq!(l.lag(Lsn(250), t0 + ms(1000)), ms(800));
        assert_eq!(l.lag(Lsn(300), t0 + ms(1000)), Duration::ZERO);
        // New WAL after everything was applied: its age counts from its own commit.
        l.committed(Lsn(400), t0 + ms(1500));
        assert_eq!(l.lag(Lsn(300), t0 + ms(1600)), ms(100));
    }

    #[test]
    fn commits_within_the_spacing_share_a_sample() {
        let t0 = Instant::now();
        let mut l = ApplyLag::new();
        for i in 0..1000u64 {
            l.committed(Lsn(i + 1), t0 + Duration::from_micros(i));
        }
        assert_eq!(l.samples.len(), 1);
        // The sample's time is the first flush, so the lag is never read short by more than
        // the spacing.
        assert_eq!(l.lag(Lsn(500), t0 + ms(10)), ms(10));
    }

    #[test]
    fn samples_are_bounded_and_lower_commits_ignored() {
        let t0 = Instant::now();
        let mut l = ApplyLag::new();
        for i in 0..(SAMPLES_MAX as u64 + 100) {
            l.committed(Lsn(i + 1), t0 + SAMPLE_SPACING * (i as u32));
        }
        l.committed(Lsn(1), t0 + ms(100_000));
        assert_eq!(l.samples.len(), SAMPLES_MAX);
        let now = t0 + SAMPLE_SPACING * (SAMPLES_MAX as u32 + 200);
        // The oldest samples were dropped: the lag reads as the oldest kept one's age.
        assert_eq!(l.lag(Lsn(0), now), now - (t0 + SAMPLE_SPACING * 100));
    }
}
