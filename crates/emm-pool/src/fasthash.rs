//! A fast hasher for the arena's small integer keys (stream keys, addresses),
//! which SipHash, the standard library's default, spends most of a lookup on. The
//! keys come from emm itself (not from an adversary), so DoS resistance buys
//! nothing here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-xor over 64-bit words; `finish` folds the high bits down, since
/// hashbrown indexes buckets by the low bits and device addresses have their low
/// bits zero.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
    }

    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }

    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }

    fn write_isize(&mut self, v: isize) {
        self.write_u64(v as u64);
    }
}

/// A `HashMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn aligned_addresses_spread_over_the_low_bits() {
        let b = BuildHasherDefault::<FastHasher>::default();
        // 4,096 addresses 512 bytes apart: the low 10 bits of their hashes (what a
        // 1,024-bucket table indexes by) take most values, not a handful.
        let low: HashSet<u64> = (0..4096u64)
            .map(|i| b.hash_one(0x7f00_0000_0000u64 + i * 512) & 1023)
            .collect();
        assert!(low.len() > 900, "{} distinct bucket indices", low.len());
    }

    #[test]
    fn the_map_finds_what_it_holds() {
        let mut m: FastMap<(usize, u8), usize> = FastMap::default();
        for i in 0..10_000usize {
            m.insert((i * 4096, (i % 2) as u8), i);
        }
        assert!((0..10_000usize).all(|i| m[&(i * 4096, (i % 2) as u8)] == i));
    }
}
