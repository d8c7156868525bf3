//! `Cursor`: bounds-checked little-endian reads over a byte slice.
//!
//! PostgreSQL's WAL structs are read by casting pointers; here every field read goes through
//! this cursor, which returns `None` instead of reading past the end. Callers turn `None`
//! into a `WalError` naming the record, so a short or lying length field can never panic.
//! WAL is written in the server's native byte order; fjord supports only little-endian
//! servers, so every read here is little-endian.

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, len: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(len)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    pub(crate) fn skip(&mut self, len: usize) -> Option<()> {
        self.bytes(len).map(|_| ())
    }

    /// Skips forward to the next multiple of 8 from the start of the buffer, as PostgreSQL
    /// does between `MAXALIGN`ed parts of a struct.
    pub(crate) fn align8(&mut self) -> Option<()> {
        let aligned = crate::consts::maxalign(self.pos);
        self.skip(aligned - self.pos)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?.try_into().ok()
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|b| b[0])
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    pub(crate) fn i32(&mut self) -> Option<i32> {
        self.array().map(i32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    pub(crate) fn i64(&mut self) -> Option<i64> {
        self.array().map(i64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_stops_at_the_end() {
        let mut c = Cursor::new(&[1, 0, 2, 0, 0, 0, 9]);
        assert_eq!(c.u16(), Some(1));
        assert_eq!(c.u32(), Some(2));
        assert_eq!(c.u16(), None);
        assert_eq!(c.position(), 6);
        assert_eq!(c.u8(), Some(9));
        assert_eq!(c.remaining(), 0);
        assert_eq!(c.bytes(usize::MAX), None);
    }
}
