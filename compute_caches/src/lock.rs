//! The locks the caches are guarded by, as the caller provides them.

/// Locks numbered from 0, each held shared (by any number of holders at once) or exclusive
/// (by one), that live where the caller keeps them: LWLocks of a named tranche in the
/// extension, std or shuttle locks in tests. The relation-size cache uses lock 0, the file
/// cache one per stripe.
///
/// # Safety
/// While lock `i` is held exclusive no one else holds it in either mode, and while it is
/// held shared no one holds it exclusive; acquiring it makes visible every write its
/// previous holders made before releasing it. The caches' data is read and written under
/// that promise, without further synchronization.
pub unsafe trait Locks {
    fn lock_shared(&self, i: usize);
    fn lock_exclusive(&self, i: usize);
    /// # Safety
    /// The caller holds lock `i` shared.
    unsafe fn unlock_shared(&self, i: usize);
    /// # Safety
    /// The caller holds lock `i` exclusive.
    unsafe fn unlock_exclusive(&self, i: usize);
}

/// Lock `i` held shared for the life of the value.
pub(crate) struct SharedGuard<'a, L: Locks> {
    locks: &'a L,
    i: usize,
}

impl<'a, L: Locks> SharedGuard<'a, L> {
    #[inline]
    pub(crate) fn new(locks: &'a L, i: usize) -> Self {
        locks.lock_shared(i);
        SharedGuard { locks, i }
    }
}

impl<L: Locks> Drop for SharedGuard<'_, L> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: taken shared in `new`.
        unsafe { self.locks.unlock_shared(self.i) }
    }
}

/// Lock `i` held exclusive for the life of the value.
pub(crate) struct ExclusiveGuard<'a, L: Locks> {
    locks: &'a L,
    i: usize,
}

impl<'a, L: Locks> ExclusiveGuard<'a, L> {
    #[inline]
    pub(crate) fn new(locks: &'a L, i: usize) -> Self {
        locks.lock_exclusive(i);
        ExclusiveGuard { locks, i }
    }
}

impl<L: Locks> Drop for ExclusiveGuard<'_, L> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: taken exclusive in `new`.
        unsafe { self.locks.unlock_exclusive(self.i) }
    }
}
