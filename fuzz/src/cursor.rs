//! [`Cursor`]: how the targets that read a program from their input take it
//! apart.

use std::ffi::CString;

/// Reads the input front to back; past its end every read is 0.
pub(crate) struct Cursor<'a>(pub(crate) &'a [u8]);

impl Cursor<'_> {
    pub(crate) fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    pub(crate) fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.u8();
        }
        u64::from_le_bytes(b)
    }
    pub(crate) fn usize(&mut self) -> usize {
        self.u64() as usize
    }
    /// A size: small most of the time, an extreme value otherwise.
    pub(crate) fn size(&mut self) -> usize {
        match self.u8() % 8 {
            0 => 0,
            1 => usize::MAX,
            2 => usize::MAX / 2 + 1,
            3 => self.usize(),
            4 => 1 << (self.u8() % 64),
            _ => usize::from(self.u8()) * 64 + usize::from(self.u8()),
        }
    }
    /// A string of up to 64 bytes (cut at an interior NUL).
    pub(crate) fn string(&mut self) -> CString {
        let n = usize::from(self.u8() % 65).min(self.0.len());
        let (s, rest) = self.0.split_at(n);
        self.0 = rest;
        let s = s.split(|&b| b == 0).next().unwrap_or_default();
        CString::new(s).unwrap_or_default()
    }
    /// Up to `max` raw bytes.
    pub(crate) fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = (usize::from(self.u8()) % (max + 1)).min(self.0.len());
        let (s, rest) = self.0.split_at(n);
        self.0 = rest;
        s.to_vec()
    }
    pub(crate) fn done(&self) -> bool {
        self.0.is_empty()
    }
}
