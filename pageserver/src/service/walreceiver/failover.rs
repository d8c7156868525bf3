//! The WAL receiver's choice of source, as a state machine with no I/O: events with their
//! time in, decisions out. It exists so that the failover policy (round robin, backoff,
//! healthy sessions, lag probes, which failures deserve a warning) can be tested event by
//! event, without sockets, threads or clocks; `walreceiver.rs` connects, streams, probes,
//! sleeps and logs as it is told.
//!
//! The policy (also in `walreceiver.rs`'s module documentation, which says why):
//! - A failed session moves to the next source, round robin, at once. Only when a whole
//!   round of sessions failed (as many failures in a row as there are sources) does the
//!   receiver wait first, `BACKOFF_MIN` the first time, doubling up to `BACKOFF_MAX`.
//! - A session that streamed WAL, or that the server accepted (`CopyBothResponse`) and that
//!   ran for `HEALTHY_SESSION_AFTER`, was healthy: its failure starts a new round with the
//!   backoff back at `BACKOFF_MIN`, and is logged at warn even if it repeats the source's
//!   previous failure.
//! - While a session runs, if no WAL came for `LAG_PROBE_AFTER` and no probe ended within
//!   `LAG_PROBE_AFTER`, every other source is probed for its WAL end. If one has WAL beyond
//!   what was received, the session ends and the next one goes to the source with the most
//!   WAL (the lowest index among equals), with a new round and the backoff reset.
//! - A failure is logged at warn when its message differs from the last one logged at warn
//!   for that source, at debug otherwise, so that a source that stays down warns once.
//!
//! Time is an `Instant` the caller passes with each event; nothing here reads a clock.
//! Invariants (asserted): the current source is below the number of sources, which is at
//! least one; the backoff stays within `[BACKOFF_MIN, BACKOFF_MAX]`.

use std::time::{Duration, Instant};

use proto::Lsn;

/// The first wait after a whole round of failed sessions.
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait between rounds: a source that comes back is found within this.
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A session that lasted this long counts as healthy even if no WAL came, so that a
/// failure after it starts a new round without waiting.
pub(super) const HEALTHY_SESSION_AFTER: Duration = Duration::from_secs(5);
/// When no WAL came from the current source for this long, ask the others for their WAL
/// end; also the shortest interval between two such probes.
pub(super) const LAG_PROBE_AFTER: Duration = Duration::from_secs(1);

/// The failover state of one WAL receiver.
#[derive(Debug)]
pub(super) struct Failover {
    sources: usize,
    /// The source being streamed from, or to connect to next.
    current: usize,
    /// Failed sessions in a row since the last wait, healthy session or switch.
    failed_in_round: usize,
    /// The wait after the next whole round of failures.
    backoff: Duration,
    /// Per source, the last failure logged at warn, so that a repeating one is not.
    warned: Vec<Option<String>>,
    /// The running session, from `session_started` until it fails or is switched away from.
    session: Option<Session>,
}

#[derive(Debug)]
struct Session {
    started: Instant,
    /// The server accepted `START_REPLICATION`.
    accepted: bool,
    /// Some WAL came in this session.
    wal_received: bool,
    /// The end of the WAL received (written locally), which a probed source must pass.
    received_end: Lsn,
    last_wal: Instant,
    /// When the last probe ended (the session's start before the first).
    last_probe: Instant,
}

/// What to do after a failed session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Retry {
    /// The source the next session goes to.
    pub next: usize,
    /// Wait this long before it: a whole round of sessions failed.
    pub backoff: Option<Duration>,
    /// How loudly to log the failure.
    pub level: LogLevel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LogLevel {
    Warn,
    Debug,
}

/// End the session: another source has WAL that was not received from the current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Switch {
    pub from: usize,
    pub to: usize,
    /// The WAL end `to` reported.
    pub its_end: Lsn,
    /// The end of the WAL received from `from`.
    pub received_end: Lsn,
}

impl Failover {
    /// A receiver with `sources` sources (at least one), starting with the first.
    pub fn new(sources: usize) -> Failover {
        assert!(sources >= 1, "a wal receiver needs at least one source, got {sources}");
        Failover { sources, current: 0, failed_in_round: 0, backoff: BACKOFF_MIN, warned: vec![None; sources], session: None }
    }

    /// The source to stream from: the next session's, or the running one's.
    pub fn current(&self) -> usize {
        self.current
    }

    /// The session with the current source connected and asked for WAL from `start`: from
    /// now on it may be probed against, and its age counts towards being healthy.
    pub fn session_started(&mut self, now: Instant, start: Lsn) {
        self.session =
            Some(Session { started: now, accepted: false, wal_received: false, received_end: start, last_wal: now, last_probe: now });
    }

    /// The server accepted `START_REPLICATION` (`CopyBothResponse`).
    pub fn stream_accepted(&mut self) {
        if let Some(s) = &mut self.session {
            s.accepted = true;
        }
    }

    /// WAL up to `received_end` came and was written locally.
    pub fn wal_received(&mut self, now: Instant, received_end: Lsn) {
        if let Some(s) = &mut self.session {
            s.wal_received = true;
            s.received_end = received_end;
            s.last_wal = now;
        }
    }

    /// The sources to probe for their WAL end now, if it is time: the current one sent no
    /// WAL for `LAG_PROBE_AFTER` and no probe ended within it. Never with a single source.
    pub fn probe_due(&self, now: Instant) -> Option<Vec<usize>> {
        let s = self.session.as_ref()?;
        let due = self.sources > 1
            && now.saturating_duration_since(s.last_wal) >= LAG_PROBE_AFTER
            && now.saturating_duration_since(s.last_probe) >= LAG_PROBE_AFTER;
        due.then(|| (0..self.sources).filter(|&i| i != self.current).collect())
    }

    /// The probes ended at `now`; each result is a source's WAL end, `None` if the probe
    /// failed. Returns a switch to the source with the most WAL if that is beyond what was
    /// received (the session is then over and that source is current), else `None`.
    pub fn probed(&mut self, now: Instant, results: impl IntoIterator<Item = (usize, Option<Lsn>)>) -> Option<Switch> {
        let current = self.current;
        let s = self.session.as_mut()?;
        s.last_probe = now;
        let received_end = s.received_end;
        // The most WAL wins; among equals the lowest index, whatever the order of results.
        let best = results
            .into_iter()
            .filter(|&(i, _)| i < self.sources && i != current)
            .filter_map(|(i, end)| Some((i, end?)))
            .filter(|&(_, end)| end > received_end)
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
        let (to, its_end) = best?;
        self.session = None;
        self.current = to;
        self.failed_in_round = 0;
        self.backoff = BACKOFF_MIN;
        Some(Switch { from: current, to, its_end, received_end })
    }

    /// The session with the current source (or the attempt to start one) failed at `now`
    /// with `error`: where the next one goes, after how long, and how loudly to log it.
    pub fn session_failed(&mut self, now: Instant, error: &str) -> Retry {
        let healthy = self
            .session
            .take()
            .is_some_and(|s| s.wal_received || (s.accepted && now.saturating_duration_since(s.started) >= HEALTHY_SESSION_AFTER));
        if healthy {
            self.failed_in_round = 0;
            self.backoff = BACKOFF_MIN;
            self.warned[self.current] = None;
        }
        let level = if self.warned[self.current].as_deref() == Some(error) {
            LogLevel::Debug
        } else {
            self.warned[self.current] = Some(error.to_owned());
            LogLevel::Warn
        };
        self.failed_in_round += 1;
        let backoff = if self.failed_in_round >= self.sources {
            let wait = self.backoff;
            self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
            self.failed_in_round = 0;
            Some(wait)
        } else {
            None
        };
        self.current = (self.current + 1) % self.sources;
        assert!(self.current < self.sources && (BACKOFF_MIN..=BACKOFF_MAX).contains(&self.backoff), "failover state: {self:?}");
        Retry { next: self.current, backoff, level }
    }

    #[cfg(test)]
    fn backoff(&self) -> Duration {
        self.backoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    /// Failures of sessions that never started, one after another.
    fn fail_n(f: &mut Failover, t: Instant, n: usize) -> Vec<Retry> {
        (0..n).map(|_| f.session_failed(t, "could not connect")).collect()
    }

    #[test]
    fn failures_go_round_robin_and_back_off_only_after_a_whole_round() {
        let ms = |n: u64| Some(Duration::from_millis(n));
        // (sources, the (next, backoff) of each failure in a row)
        type Case<'a> = (usize, &'a [(usize, Option<Duration>)]);
        let cases: &[Case<'_>] = &[
            (1, &[(0, ms(100)), (0, ms(200)), (0, ms(400)), (0, ms(800)), (0, ms(1600)), (0, ms(3200)), (0, ms(5000)), (0, ms(5000))]),
            (2, &[(1, None), (0, ms(100)), (1, None), (0, ms(200)), (1, None), (0, ms(400))]),
            (3, &[(1, None), (2, None), (0, ms(100)), (1, None), (2, None), (0, ms(200)), (1, None)]),
            (4, &[(1, None), (2, None), (3, None), (0, ms(100)), (1, None), (2, None), (3, None), (0, ms(200))]),
        ];
        let t = Instant::now();
        for &(sources, expected) in cases {
            let mut f = Failover::new(sources);
            let got: Vec<(usize, Option<Duration>)> = fail_n(&mut f, t, expected.len()).into_iter().map(|r| (r.next, r.backoff)).collect();
            assert_eq!(got, expected, "{sources} sources");
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_max_and_stays_there() {
        let mut f = Failover::new(1);
        let t = Instant::now();
        let waits: Vec<Duration> = fail_n(&mut f, t, 12).into_iter().map(|r| r.backoff.expect("one source: every failure waits")).collect();
        assert_eq!(waits[0], BACKOFF_MIN);
        for w in waits.windows(2) {
            assert_eq!(w[1], (w[0] * 2).min(BACKOFF_MAX), "{waits:?}");
        }
        assert_eq!(*waits.last().unwrap(), BACKOFF_MAX);
    }

    #[test]
    fn a_healthy_session_resets_the_round_and_the_backoff() {
        let t0 = Instant::now();
        // (what the session did, the session given its start and returning when it failed,
        // whether it was healthy)
        type Case = (&'static str, fn(&mut Failover, Instant) -> Instant, bool);
        let cases: &[Case] = &[
            (
                "streamed WAL at once",
                |f, t| {
                    f.session_started(t, Lsn(100));
                    f.stream_accepted();
                    f.wal_received(t + MS, Lsn(200));
                    t + 2 * MS
                },
                true,
            ),
            (
                "ran HEALTHY_SESSION_AFTER with no WAL",
                |f, t| {
                    f.session_started(t, Lsn(100));
                    f.stream_accepted();
                    t + HEALTHY_SESSION_AFTER
                },
                true,
            ),
            (
                "ran just short of HEALTHY_SESSION_AFTER",
                |f, t| {
                    f.session_started(t, Lsn(100));
                    f.stream_accepted();
                    t + HEALTHY_SESSION_AFTER - MS
                },
                false,
            ),
            (
                "ran long but the server never accepted START_REPLICATION",
                |f, t| {
                    f.session_started(t, Lsn(100));
                    t + HEALTHY_SESSION_AFTER * 2
                },
                false,
            ),
            ("never connected", |_, t| t + HEALTHY_SESSION_AFTER * 2, false),
        ];
        for &(what, session, healthy) in cases {
            let mut f = Failover::new(3);
            // Two whole rounds failed: the backoff is now 400 ms, and one more failure
            // (source 0 -> 1) starts the third round.
            fail_n(&mut f, t0, 7);
            assert_eq!((f.current(), f.backoff()), (1, BACKOFF_MIN * 4), "{what}");
            let ended = session(&mut f, t0);
            let first = f.session_failed(ended, "could not connect");
            let rest = fail_n(&mut f, ended, 3);
            if healthy {
                // A new round: two more failures before waiting, and the shortest wait.
                assert_eq!(first.backoff, None, "{what}");
                assert_eq!(first.level, LogLevel::Warn, "{what}: a healthy session's failure is news");
                assert_eq!(rest.iter().map(|r| r.backoff).collect::<Vec<_>>(), [None, Some(BACKOFF_MIN), None], "{what}");
            } else {
                assert_eq!(first.backoff, None, "{what}");
                assert_eq!(first.level, LogLevel::Debug, "{what}: the same failure again");
                assert_eq!(rest.iter().map(|r| r.backoff).collect::<Vec<_>>(), [Some(BACKOFF_MIN * 4), None, None], "{what}");
            }
        }
    }

    #[test]
    fn probes_wait_for_lag_probe_after_without_wal_and_between_probes() {
        let t = Instant::now();
        let mut f = Failover::new(3);
        assert_eq!(f.probe_due(t + LAG_PROBE_AFTER * 10), None, "no session, nothing to probe against");
        f.session_started(t, Lsn(1000));
        f.stream_accepted();
        // (now, what happens first, whether a probe is due at now)
        let steps: &[(Duration, Option<u64>, bool)] = &[
            (LAG_PROBE_AFTER - MS, None, false),
            (LAG_PROBE_AFTER, None, true),
            // WAL came at 1.2 s: nothing due until 2.2 s.
            (LAG_PROBE_AFTER + 200 * MS, Some(2000), false),
            (LAG_PROBE_AFTER * 2 + 199 * MS, None, false),
            (LAG_PROBE_AFTER * 2 + 200 * MS, None, true),
        ];
        for &(at, wal_end, due) in steps {
            if let Some(end) = wal_end {
                f.wal_received(t + at, Lsn(end));
            }
            let expected = due.then(|| vec![1, 2]);
            assert_eq!(f.probe_due(t + at), expected, "at {at:?}");
        }
        // A probe that found nothing new ends at 2.7 s: the next is due at 3.7 s, though no
        // WAL came for longer than LAG_PROBE_AFTER all along.
        let probe_end = t + LAG_PROBE_AFTER * 2 + 700 * MS;
        assert_eq!(f.probed(probe_end, [(1, Some(Lsn(2000))), (2, None)]), None);
        assert_eq!(f.probe_due(probe_end + LAG_PROBE_AFTER - MS), None);
        assert_eq!(f.probe_due(probe_end + LAG_PROBE_AFTER), Some(vec![1, 2]));
    }

    #[test]
    fn probes_ask_every_source_but_the_current_one() {
        let t = Instant::now();
        let mut f = Failover::new(4);
        fail_n(&mut f, t, 2);
        f.session_started(t, Lsn(0));
        assert_eq!(f.probe_due(t + LAG_PROBE_AFTER), Some(vec![0, 1, 3]));
    }

    #[test]
    fn a_single_source_never_probes() {
        let t = Instant::now();
        let mut f = Failover::new(1);
        f.session_started(t, Lsn(0));
        f.stream_accepted();
        for secs in [0, 1, 2, 10, 3600] {
            assert_eq!(f.probe_due(t + Duration::from_secs(secs)), None);
        }
    }

    #[test]
    fn switches_to_the_source_with_the_most_wal_beyond_what_was_received() {
        // (received end, probe results, the expected switch target and its end)
        type Case = (u64, &'static [(usize, Option<u64>)], Option<(usize, u64)>);
        let cases: &[Case] = &[
            (500, &[(1, Some(900)), (2, Some(700))], Some((1, 900))),
            (500, &[(1, Some(700)), (2, Some(900))], Some((2, 900))),
            // Among equals the lowest index, in whichever order the probes answered.
            (500, &[(1, Some(900)), (2, Some(900))], Some((1, 900))),
            (500, &[(2, Some(900)), (1, Some(900))], Some((1, 900))),
            (500, &[(1, None), (2, Some(501))], Some((2, 501))),
            (500, &[(1, Some(500)), (2, Some(500))], None),
            (500, &[(1, Some(400)), (2, None)], None),
            (500, &[(1, None), (2, None)], None),
            (500, &[], None),
            // The current source is not a candidate, whatever it reports.
            (500, &[(0, Some(9000)), (1, Some(400))], None),
        ];
        let t = Instant::now();
        for &(received, results, expected) in cases {
            let mut f = Failover::new(3);
            f.session_started(t, Lsn(100));
            f.stream_accepted();
            f.wal_received(t, Lsn(received));
            let at = t + LAG_PROBE_AFTER;
            assert!(f.probe_due(at).is_some());
            let switch = f.probed(at, results.iter().map(|&(i, end)| (i, end.map(Lsn))));
            let expected_switch = expected.map(|(to, end)| Switch { from: 0, to, its_end: Lsn(end), received_end: Lsn(received) });
            assert_eq!(switch, expected_switch, "received {received}, probes {results:?}");
            assert_eq!(f.current(), expected.map_or(0, |(to, _)| to), "received {received}, probes {results:?}");
        }
    }

    #[test]
    fn a_switch_ends_the_session_and_resets_the_round_and_the_backoff() {
        let t = Instant::now();
        let mut f = Failover::new(3);
        fail_n(&mut f, t, 4);
        assert_eq!((f.current(), f.backoff()), (1, BACKOFF_MIN * 2));
        f.session_started(t, Lsn(100));
        let switch = f.probed(t + LAG_PROBE_AFTER, [(0, Some(Lsn(50))), (2, Some(Lsn(200)))]);
        assert_eq!(switch, Some(Switch { from: 1, to: 2, its_end: Lsn(200), received_end: Lsn(100) }));
        assert_eq!(f.probe_due(t + LAG_PROBE_AFTER * 5), None, "the session is over");
        assert_eq!(f.backoff(), BACKOFF_MIN);
        let retries: Vec<Option<Duration>> = fail_n(&mut f, t, 3).into_iter().map(|r| r.backoff).collect();
        assert_eq!(retries, [None, None, Some(BACKOFF_MIN)]);
    }

    #[test]
    fn a_repeated_failure_warns_once_per_source() {
        use LogLevel::{Debug, Warn};
        // (source that fails, its error, the expected level); three sources, round robin.
        let steps: &[(usize, &str, LogLevel)] = &[
            (0, "connection refused", Warn),
            (1, "connection refused", Warn),
            (2, "timed out", Warn),
            (0, "connection refused", Debug),
            (1, "connection refused", Debug),
            (2, "connection refused", Warn),
            (0, "server closed the connection", Warn),
            (1, "connection refused", Debug),
            (2, "connection refused", Debug),
            (0, "server closed the connection", Debug),
        ];
        let t = Instant::now();
        let mut f = Failover::new(3);
        for (step, &(source, error, level)) in steps.iter().enumerate() {
            assert_eq!(f.current(), source, "step {step}");
            assert_eq!(f.session_failed(t, error).level, level, "step {step}: {error}");
        }
        // A healthy session in between makes the same failure news again.
        assert_eq!(f.current(), 1);
        f.session_started(t, Lsn(0));
        f.wal_received(t, Lsn(10));
        assert_eq!(f.session_failed(t, "connection refused").level, Warn);
    }

    #[derive(Clone, Debug)]
    enum Event {
        Advance(u64),
        SessionStarted,
        StreamAccepted,
        WalReceived(u64),
        /// Ends of the probed sources, in the order `probe_due` named them (`None`: failed).
        Probe(Vec<Option<u64>>),
        Fail(u8),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0u64..7_000).prop_map(Event::Advance),
            Just(Event::SessionStarted),
            Just(Event::StreamAccepted),
            (0u64..10_000).prop_map(Event::WalReceived),
            proptest::collection::vec(proptest::option::of(0u64..40_000), 0..16).prop_map(Event::Probe),
            (0u8..3).prop_map(Event::Fail),
        ]
    }

    proptest! {
        #[test]
        fn the_source_is_always_valid_and_the_backoff_bounded(
            sources in 1usize..=super::super::SOURCES_MAX,
            events in proptest::collection::vec(event(), 0..200),
        ) {
            let mut f = Failover::new(sources);
            let mut now = Instant::now();
            let mut received = Lsn(0);
            for e in events {
                match e {
                    Event::Advance(ms) => now += Duration::from_millis(ms),
                    Event::SessionStarted => f.session_started(now, received),
                    Event::StreamAccepted => f.stream_accepted(),
                    Event::WalReceived(bytes) => {
                        received = Lsn(received.0 + bytes);
                        f.wal_received(now, received);
                    }
                    Event::Probe(ends) => {
                        let asked = f.probe_due(now).unwrap_or_default();
                        prop_assert!(sources > 1 || asked.is_empty());
                        prop_assert!(asked.iter().all(|&i| i < sources && i != f.current()));
                        let from = f.current();
                        let results: Vec<(usize, Option<Lsn>)> =
                            asked.iter().zip(ends).map(|(&i, end)| (i, end.map(Lsn))).collect();
                        if let Some(s) = f.probed(now, results) {
                            prop_assert!(s.to < sources && s.to != from && s.its_end > s.received_end);
                        }
                    }
                    Event::Fail(error) => {
                        let retry = f.session_failed(now, ["refused", "reset", "timed out"][usize::from(error)]);
                        prop_assert!(retry.next < sources);
                        if let Some(b) = retry.backoff {
                            prop_assert!((BACKOFF_MIN..=BACKOFF_MAX).contains(&b), "{b:?}");
                        }
                    }
                }
                prop_assert!(f.current() < sources);
                prop_assert!((BACKOFF_MIN..=BACKOFF_MAX).contains(&f.backoff()));
            }
        }
    }
}
