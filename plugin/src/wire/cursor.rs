//! The framing primitives of every dfx payload: integers little endian,
//! strings and blobs prefixed by a u32 length, every short read refused as
//! truncated.

use datafusion::common::Result;

use crate::error::{Area, fail};

/// Reads a framed payload front to back; every short read is "truncated".
pub(crate) struct Cursor<'a> {
    pub(crate) buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(fail(
                Area::Codec,
                format!(
                    "truncated payload: {what} needs {n} byte(s), {} left",
                    self.buf.len()
                ),
            ));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2, what)?.try_into().expect("2 bytes"),
        ))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }

    /// A u32 count of u64 ids, then the ids. The count is bounded by the
    /// bytes present, so a corrupt one cannot make us allocate.
    pub(crate) fn ids(&mut self, what: &str) -> Result<Vec<u64>> {
        let count = self.u32(what)? as usize;
        if count > self.buf.len() / 8 {
            return Err(fail(
                Area::Codec,
                format!(
                    "truncated payload: {count} {what} declared, {} bytes left",
                    self.buf.len()
                ),
            ));
        }
        (0..count).map(|_| self.u64(what)).collect()
    }

    pub(crate) fn blob(&mut self, what: &str) -> Result<&'a [u8]> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }

    pub(crate) fn string(&mut self, what: &str) -> Result<String> {
        let bytes = self.blob(what)?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|e| fail(Area::Codec, format!("{what} is not UTF-8: {e}")))
    }
}

pub(crate) fn put_blob(buf: &mut Vec<u8>, bytes: &[u8], what: &str) -> Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| {
        fail(
            Area::Codec,
            format!("{what} of {} bytes is too long to encode", bytes.len()),
        )
    })?;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(bytes);
    Ok(())
}
