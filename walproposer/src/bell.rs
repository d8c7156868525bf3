//! What the core thread sleeps on: an `eventfd(2)` that every sender of an event rings
//! after queueing it ([`EventSender`]), and that other processes may ring too; the core
//! waits on it together with the safekeepers' sockets ([`Bell::wait_with`]).
//!
//! Why an eventfd and not only the channel: inside a compute, the committing backends are
//! other processes. With [`crate::Doorbell`] they ring the core thread's bell directly
//! (the extension creates the eventfd in the postmaster, so every backend inherits it), and
//! the core reads how far they flushed from shared memory; without it, a commit's WAL went
//! through the WAL proposer worker's turn (a latch, then the channel) before it was sent.
//!
//! Protocol: a sender queues its event, then rings. The core waits on the bell (which
//! resets it), then drains the channel; an event queued after the drain rings again, so the
//! next wait returns at once. No wake-up is lost, and a burst of rings is one wake-up.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc::{SendError, Sender};
use std::sync::Arc;
use std::time::Duration;

use crate::shared::Event;

/// An eventfd, owned (closed when dropped) or borrowed from the caller.
pub struct Bell {
    fd: RawFd,
    _owned: Option<OwnedFd>,
}

/// A new non-blocking, close-on-exec eventfd: what a [`Bell`] or a [`crate::Doorbell`] is
/// made of (a compute's postmaster creates its doorbell with this, so that the children it
/// forks inherit it; close-on-exec keeps it from programs they run).
pub fn new_eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with valid flags; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened and nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Bell {
    /// A new eventfd of this process.
    pub fn new() -> std::io::Result<Bell> {
        let owned = new_eventfd()?;
        Ok(Bell { fd: owned.as_raw_fd(), _owned: Some(owned) })
    }

    /// A bell on an eventfd the caller keeps open for as long as the proposer runs (never
    /// closed here).
    ///
    /// # Safety
    /// `fd` is a non-blocking eventfd that stays open while this bell exists.
    pub unsafe fn borrowed(fd: RawFd) -> Bell {
        Bell { fd, _owned: None }
    }

    /// Wakes the waiter (or makes its next wait return at once).
    pub fn ring(&self) {
        ring_fd(self.fd);
    }

    /// Sleeps until the bell rings, one of `others` is ready for its `events`, or `timeout`
    /// passes; resets the bell if it rang and fills in each of `others`' `revents` (zero
    /// after an error or a timeout).
    pub fn wait_with(&self, others: &mut [libc::pollfd], timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(timeout.subsec_nanos()),
        };
        let mut fds = Vec::with_capacity(1 + others.len());
        fds.push(libc::pollfd { fd: self.fd, events: libc::POLLIN, revents: 0 });
        fds.extend(others.iter().map(|p| libc::pollfd { revents: 0, ..*p }));
        // SAFETY: `fds.len()` valid pollfds, a valid timespec, no signal mask change. EINTR
        // and errors only end the wait early; the caller's loop waits again.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
        if n <= 0 {
            others.iter_mut().for_each(|p| p.revents = 0);
            return;
        }
        if fds[0].revents != 0 {
            let mut count = 0u64;
            // SAFETY: reads the 8-byte counter into a u64 (non-blocking; EAGAIN if another
            // reader took it, which is harmless).
            unsafe { libc::read(self.fd, (&raw mut count).cast(), 8) };
        }
        for (p, f) in others.iter_mut().zip(&fds[1..]) {
            p.revents = f.revents;
        }
    }
}

/// Rings the eventfd `fd` (adds 1 to its counter). Safe to call from any thread or process
/// holding the descriptor; never blocks (the counter cannot overflow in practice, and a full
/// one is already ringing).
pub fn ring_fd(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a valid u64 to a descriptor; errors are harmless here.
    unsafe { libc::write(fd, (&raw const one).cast(), 8) };
}

/// The sending side of the core's channel: queues an event, then rings the bell.
#[derive(Clone)]
pub struct EventSender {
    tx: Sender<Event>,
    bell: Arc<Bell>,
}

impl EventSender {
    pub fn new(tx: Sender<Event>, bell: Arc<Bell>) -> EventSender {
        EventSender { tx, bell }
    }

    pub fn send(&self, ev: Event) -> Result<(), SendError<Event>> {
        self.tx.send(ev)?;
        self.bell.ring();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_ring_before_the_wait_ends_it_at_once_and_is_consumed() {
        let bell = Bell::new().unwrap();
        bell.ring();
        bell.ring();
        let t = Instant::now();
        bell.wait_with(&mut [], Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
        // Both rings were one wake-up: the next wait times out.
        let t = Instant::now();
        bell.wait_with(&mut [], Duration::from_millis(50));
        assert!(t.elapsed() >= Duration::from_millis(45));
    }

    #[test]
    fn a_ring_from_another_thread_wakes_the_waiter() {
        let bell = Arc::new(Bell::new().unwrap());
        let b = Arc::clone(&bell);
        let t = Instant::now();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            b.ring();
        });
        bell.wait_with(&mut [], Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
        h.join().unwrap();
    }

    #[test]
    fn a_readable_descriptor_ends_the_wait_and_is_reported() {
        use std::io::Write;
        use std::os::unix::net::UnixStream;
        let bell = Bell::new().unwrap();
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut fds = [libc::pollfd { fd: b.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        bell.wait_with(&mut fds, Duration::from_millis(20));
        assert_eq!(fds[0].revents, 0, "nothing to read yet");
        a.write_all(b"x").unwrap();
        let t = Instant::now();
        bell.wait_with(&mut fds, Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_ne!(fds[0].revents & libc::POLLIN, 0);
        // The bell did not ring: it still has nothing for the next wait.
        fds[0].events = 0;
        let t = Instant::now();
        bell.wait_with(&mut fds, Duration::from_millis(50));
        assert!(t.elapsed() >= Duration::from_millis(45));
    }
}
