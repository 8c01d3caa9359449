//! MemArray rules that need no GPU: indexer properties, dtype mapping, locks.

use emm_array::*;
use proptest::prelude::*;

proptest! {
    #[test]
    fn linear_multi_linear_is_the_identity(shape in prop::collection::vec(1usize..7, 3)) {
        let ix = Indexer::new([shape[0], shape[1], shape[2]]).unwrap();
        for i in 0..ix.len() {
            let m = ix.multi(i).unwrap();
            prop_assert_eq!(ix.linear(m), Some(i));
        }
        prop_assert_eq!(ix.multi(ix.len()), None);
        prop_assert_eq!(ix.linear([shape[0], 0, 0]), None);
    }

    #[test]
    fn strides_match_numpys_c_order(a in 1usize..9, b in 1usize..9, c in 1usize..9) {
        // numpy: np.empty((a,b,c)).strides / itemsize == (b*c, c, 1)
        prop_assert_eq!(Indexer::new([a, b, c]).unwrap().strides(), [b * c, c, 1]);
        prop_assert_eq!(Indexer::new([a, b]).unwrap().strides(), [b, 1]);
        prop_assert_eq!(Indexer::new([a]).unwrap().strides(), [1]);
    }
}

#[test]
fn overflowing_shapes_are_rejected() {
    assert!(Indexer::new([usize::MAX, 2]).is_none());
    assert!(matches!(
        MemArray::<f64, 2>::on_host([usize::MAX / 4, 3]),
        Err(ArrayError::TooLarge { ref shape, element_bytes: 8 }) if shape == &[usize::MAX / 4, 3]
    ));
    let e = MemArray::<f64, 2>::on_host([usize::MAX / 4, 3]).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("{:?}", [usize::MAX / 4, 3])),
        "{e}"
    );
}

#[test]
fn kernel_indexer_matches_the_cuda_struct() {
    assert_eq!(core::mem::size_of::<KernelIndexer>(), 72);
    let k = Indexer::new([2, 3, 4]).unwrap().to_kernel().unwrap();
    assert_eq!(
        (k.shape, k.strides, k.rank),
        ([2, 3, 4, 1], [12, 4, 1, 0], 3)
    );
    // Past what the kernel's struct holds: no layout, not a wrong one.
    assert_eq!(Indexer::new([2, 3, 4, 5, 6]).unwrap().to_kernel(), None);
    assert_eq!(Indexer::new([usize::MAX]).unwrap().to_kernel(), None);
}

#[test]
fn dtypes_map_to_dlpack_codes_and_unknown_ones_list_the_supported() {
    assert_eq!(<f32 as Element>::DTYPE, DataType { code: 2, bits: 32 });
    assert_eq!(<i64 as Element>::DTYPE, DataType { code: 0, bits: 64 });
    assert_eq!(<u8 as Element>::DTYPE, DataType { code: 1, bits: 8 });
    assert_eq!(<f64 as Element>::DTYPE.name(), "float64");
    let e = DataType::from_code(2, 16).unwrap_err();
    assert!(
        e.to_string()
            .contains("supported: int8, int16, int32, int64, uint8"),
        "{e}"
    );
    let e = RawArray::new(DataType { code: 5, bits: 64 }, &[3], None).unwrap_err();
    assert!(matches!(e, ArrayError::UnsupportedType { code: 5, .. }));
    let e = RawArray::new(DataType { code: 2, bits: 32 }, &[1, 1, 1, 1, 1], None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "unsupported rank 5: arrays have 1 to 4 dimensions"
    );
}

#[test]
fn checked_access_and_locks() {
    let a = MemArray::<i32, 2>::on_host([3, 4]).unwrap();
    a.set([2, 3], 7).unwrap();
    assert_eq!(a.get([2, 3]).unwrap(), 7);
    assert!(matches!(a.get([3, 0]), Err(ArrayError::OutOfBounds { .. })));
    let id = a.lock_id();
    let e = a.set([0, 0], 1).unwrap_err();
    assert_eq!(
        e,
        ArrayError::Locked {
            op: "set",
            locks: vec![id]
        }
    );
    assert_eq!(a.get([2, 3]).unwrap(), 7, "reads are fine while locked");
    assert!(a.with_host_mut(|s| s[0] = 1).is_err());
    a.unlock(id).unwrap();
    assert!(matches!(a.unlock(id), Err(ArrayError::UnknownLock { .. })));
    a.set([0, 0], 1).unwrap();
    // Moving needs a device.
    assert!(matches!(
        a.move_to(Side::Device, None, true),
        Err(ArrayError::NoDevice {
            operation: "move_to"
        })
    ));
    // Already on the host: an early exit, no device needed.
    assert!(!a.move_to(Side::Host, None, true).unwrap());
}

#[test]
fn dlpack_exports_lock_until_their_deleter_runs_once() {
    let a = MemArray::<f64, 2>::on_host([2, 5]).unwrap();
    a.with_host_mut(|s| s.iter_mut().enumerate().for_each(|(i, v)| *v = i as f64))
        .unwrap();
    let t = a.to_dlpack().unwrap();
    let l = a.to_dlpack_legacy().unwrap();
    // SAFETY: fresh exports; read their fields, then call each deleter once.
    unsafe {
        assert_eq!((*t).version, dlpack::DLPACK_VERSION);
        let dt = &(*t).dl_tensor;
        assert_eq!((dt.ndim, dt.device.device_type), (2, dlpack::KDL_CPU));
        assert_eq!(core::slice::from_raw_parts(dt.shape, 2), &[2, 5]);
        assert_eq!(core::slice::from_raw_parts(dt.strides, 2), &[5, 1]);
        assert_eq!(
            *(dt.data as *const f64).add(7),
            7.0,
            "zero copy: the consumer sees the array's bytes"
        );
        assert_eq!((dt.dtype.code, dt.dtype.bits, dt.dtype.lanes), (2, 64, 1));
        assert!(a.set([0, 0], 1.0).is_err(), "locked while exported");
        ((*t).deleter.unwrap())(t);
        assert!(
            a.set([0, 0], 1.0).is_err(),
            "the legacy export still holds its lock"
        );
        ((*l).deleter.unwrap())(l);
    }
    assert_eq!(a.deleters_run(), 2);
    a.set([0, 0], 1.0).unwrap();
    // The export keeps the array alive after the array value is dropped.
    let t = a.to_dlpack().unwrap();
    drop(a);
    // SAFETY: the export is still valid; its deleter frees it.
    unsafe {
        assert_eq!(*((*t).dl_tensor.data as *const f64).add(9), 9.0);
        ((*t).deleter.unwrap())(t);
    }
}

/// An export's lock is its deleter's: `unlock` refuses it (the consumer's
/// tensor would change under it), and a deleter run while the array is held
/// (inside `with_host`, as a consumer dropping an old export there does)
/// neither deadlocks nor is lost: the lock goes when the array is next used.
#[test]
fn an_exports_lock_is_its_deleters_and_a_deleter_never_waits_for_the_array() {
    let a = MemArray::<f64, 1>::on_host([4]).unwrap();
    let explicit = a.lock_id();
    let t = a.to_dlpack().unwrap();
    let locks = a.raw().lock().unwrap().locks();
    let export = *locks.iter().find(|&&l| l != explicit).unwrap();
    assert!(
        matches!(a.unlock(export), Err(ArrayError::ExportLock { id }) if id == export),
        "an export's lock refused"
    );
    a.unlock(explicit).unwrap();
    assert!(a.set([0], 1.0).is_err(), "still exported");
    // The deleter inside `with_host`, on the thread that holds the array.
    let (tx, rx) = std::sync::mpsc::channel();
    let t = t as usize;
    let a2 = a.clone();
    std::thread::spawn(move || {
        let r = a2.with_host(|_| {
            // SAFETY: the export made above, deleted once.
            unsafe {
                let t = t as *mut dlpack::DLManagedTensorVersioned;
                ((*t).deleter.unwrap())(t);
            }
        });
        let _ = tx.send(r.is_ok());
    });
    let ran = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the deleter inside with_host returned (no deadlock)");
    assert!(ran);
    assert_eq!(a.deleters_run(), 1);
    a.set([0], 1.0).unwrap();
}

#[test]
fn a_host_array_the_heap_refuses_is_an_out_of_memory_error_not_an_abort() {
    // 2^60 bytes: no address space holds it, whatever the overcommit policy.
    let e = RawArray::new(DataType { code: 2, bits: 64 }, &[1 << 57], None).unwrap_err();
    match e {
        ArrayError::Memory(m) => {
            assert!(m.is_out_of_memory(), "{m}");
            assert!(m.to_string().contains("out of host memory"), "{m}");
        }
        other => panic!("expected out of memory, got {other}"),
    }
}
