//! The IPC handle decoder ([`IpcHandle::from_bytes`], [`IpcHandle::from_hex`]).

use emm_core::IpcHandle;

/// The handle's checksum (FNV-1a, as `emm-core/src/ipc.rs` computes it).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The first byte picks how the rest is decoded: as handle bytes, as hex text, or
/// as handle bytes whose checksum is fixed up first (so the fuzzer reaches the
/// fields behind the checksum). A handle decoded is valid, and encodes back to the
/// same bytes and text.
pub fn ipc_handle(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (decoded, bytes) = match mode % 3 {
        0 => (IpcHandle::from_bytes(rest), Some(rest.to_vec())),
        1 => (IpcHandle::from_hex(&String::from_utf8_lossy(rest)), None),
        _ => {
            let mut b = rest.to_vec();
            if b.len() >= 8 {
                let n = b.len() - 8;
                let sum = fnv1a(&b[..n]);
                b[n..].copy_from_slice(&sum.to_le_bytes());
            }
            (IpcHandle::from_bytes(&b), Some(b))
        }
    };
    let Ok(h) = decoded else {
        return;
    };
    assert!(
        h.validate().is_ok(),
        "a decoded handle fails validate: {h:?}"
    );
    assert!(h.offset().checked_add(h.size()).is_some());
    let out = h.to_bytes();
    if let Some(b) = bytes {
        assert_eq!(out, b, "decode then encode changed the bytes");
    }
    assert_eq!(
        IpcHandle::from_bytes(&out).ok(),
        Some(h.clone()),
        "byte round trip"
    );
    assert_eq!(
        IpcHandle::from_hex(&h.to_hex()).ok(),
        Some(h),
        "hex round trip"
    );
}
