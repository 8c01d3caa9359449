//! Driver tests on a real GPU: `cargo test -- --include-ignored` on a machine with one.

use core::ffi::c_void;

use emm_driver::memory::{self, DeviceBuffer, PinnedBuffer};
use emm_driver::{Context, Device, DriverError, Event, LaunchConfig, Module, Stream};

const PTX: &str = include_str!("../../../kernels/saxpy.ptx");

fn ctx() -> Context {
    Context::on_device(0).expect("device 0")
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn f32s_to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

fn bytes_to_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn driver_loads_and_device_properties_are_sane() {
    let drv = emm_driver::driver().unwrap();
    assert!(
        drv.version().unwrap() >= 11_020,
        "driver too old for emm's tests"
    );
    let n = Device::count().unwrap();
    assert!(n >= 1);
    for dev in Device::all().unwrap() {
        let name = dev.name().unwrap();
        assert!(!name.is_empty());
        assert!(
            dev.total_memory().unwrap() > (1 << 30),
            "{name}: less than 1 GiB?"
        );
        let (major, minor) = dev.compute_capability().unwrap();
        assert!(
            (3..=20).contains(&major) && (0..10).contains(&minor),
            "cc {major}.{minor}"
        );
        assert_ne!(dev.uuid().unwrap(), [0u8; 16]);
        assert!(
            dev.attribute(emm_sys::CUdevice_attribute::MULTIPROCESSOR_COUNT)
                .unwrap()
                > 0
        );
        assert_eq!(
            dev.attribute(emm_sys::CUdevice_attribute::WARP_SIZE)
                .unwrap(),
            32
        );
    }
    let past = Device::get(n).unwrap_err();
    assert!(
        matches!(past, DriverError::InvalidArgument { .. }),
        "{past}"
    );
    let ctx = ctx();
    let (free, total) = ctx.mem_info().unwrap();
    assert!(free <= total && total == ctx.device().total_memory().unwrap());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn saxpy_on_a_stream_matches_the_host() {
    let ctx = ctx();
    let module = Module::load_ptx(&ctx, PTX).unwrap();
    let saxpy = module.function("saxpy").unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut rng = Rng(0x1234_5678);
    let n = 1_000_003usize;
    let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
    let a = 2.5f32;
    let dx = DeviceBuffer::from_host(&ctx, &f32s_to_bytes(&x)).unwrap();
    let dy = DeviceBuffer::from_host(&ctx, &f32s_to_bytes(&y)).unwrap();
    let (mut py, mut px, mut pa, mut pn) = (dy.ptr(), dx.ptr(), a, n as u32);
    let mut params = [
        (&mut py as *mut u64).cast::<c_void>(),
        (&mut px as *mut u64).cast(),
        (&mut pa as *mut f32).cast(),
        (&mut pn as *mut u32).cast(),
    ];
    // SAFETY: the four parameters match saxpy's (u64, u64, f32, u32); both buffers
    // hold n f32s and live until the stream is synchronized below.
    unsafe { saxpy.launch(LaunchConfig::for_elements(n, 256), &stream, &mut params) }.unwrap();
    stream.synchronize().unwrap();
    let got = bytes_to_f32s(&dy.to_vec().unwrap());
    for i in 0..n {
        let want = a.mul_add(x[i], y[i]);
        assert_eq!(
            got[i].to_bits(),
            want.to_bits(),
            "element {i}: {} != {want}",
            got[i]
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn copies_round_trip_random_bytes() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let mut rng = Rng(42);
    for &len in &[1usize, 3, 4096, 65_537, 4 << 20] {
        let data = rng.bytes(len);
        // Synchronous host -> device -> device -> host.
        let a = DeviceBuffer::from_host(&ctx, &data).unwrap();
        let b = DeviceBuffer::new(&ctx, len).unwrap();
        // SAFETY: both buffers hold `len` bytes.
        unsafe { memory::copy_dtod(&ctx, b.ptr(), a.ptr(), len) }.unwrap();
        assert_eq!(b.to_vec().unwrap(), data, "sync round trip of {len} bytes");
        // Asynchronous through pinned memory on a stream.
        let mut src = PinnedBuffer::new(&ctx, len, 0).unwrap();
        src.as_mut_slice().copy_from_slice(&data);
        let mut dst = PinnedBuffer::new(&ctx, len, 0).unwrap();
        let c = DeviceBuffer::new(&ctx, len).unwrap();
        // SAFETY: device and pinned buffers hold `len` bytes and outlive the
        // synchronize below; nothing reads `dst` before it.
        unsafe {
            memory::copy_htod_async(c.ptr(), src.as_ptr(), len, &stream).unwrap();
            memory::copy_dtod_async(b.ptr(), c.ptr(), len, &stream).unwrap();
            memory::copy_dtoh_async(dst.as_mut_slice().as_mut_ptr(), b.ptr(), len, &stream)
                .unwrap();
        }
        stream.synchronize().unwrap();
        assert_eq!(dst.as_slice(), &data[..], "async round trip of {len} bytes");
    }
    // A length mismatch is a typed error, not a short copy.
    let buf = DeviceBuffer::new(&ctx, 16).unwrap();
    assert!(matches!(
        buf.copy_from_host(&[0u8; 8]),
        Err(DriverError::InvalidArgument { .. })
    ));
    assert!(matches!(
        DeviceBuffer::new(&ctx, 0),
        Err(DriverError::InvalidArgument { .. })
    ));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn memset_fills_device_memory() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let buf = DeviceBuffer::new(&ctx, 4096).unwrap();
    // SAFETY: 4096 bytes = 1024 aligned words, alive until synchronize.
    unsafe { memory::memset_d32_async(buf.ptr(), 0xDEAD_BEEF, 1024, &stream) }.unwrap();
    stream.synchronize().unwrap();
    let v = buf.to_vec().unwrap();
    assert!(v.chunks_exact(4).all(|w| w == 0xDEAD_BEEFu32.to_le_bytes()));
    // SAFETY: 4096 bytes.
    unsafe { memory::memset_d8(&ctx, buf.ptr(), 7, 4096) }.unwrap();
    assert!(buf.to_vec().unwrap().iter().all(|&b| b == 7));
}

fn spin(module: &Module, stream: &Stream, cycles: u64) {
    let f = module.function("spin").unwrap();
    let mut c = cycles;
    let mut params = [(&mut c as *mut u64).cast::<c_void>()];
    // SAFETY: spin takes one u64 and touches no memory.
    unsafe {
        f.launch(
            LaunchConfig {
                grid: (1, 1, 1),
                block: (1, 1, 1),
                shared_mem_bytes: 0,
            },
            stream,
            &mut params,
        )
    }
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn events_time_a_kernel() {
    let ctx = ctx();
    let module = Module::load_ptx(&ctx, PTX).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (start, end) = (Event::timing(&ctx).unwrap(), Event::timing(&ctx).unwrap());
    start.record(&stream).unwrap();
    spin(&module, &stream, 20_000_000); // ~10 ms at 2 GHz
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    assert!(end.query().unwrap());
    let ms = start.elapsed_ms(&end).unwrap();
    assert!(ms > 1.0 && ms < 5_000.0, "spin of 2e7 cycles took {ms} ms");
    // A timing-free event cannot give elapsed time: a typed driver error.
    let a = Event::sync_only(&ctx).unwrap();
    let b = Event::sync_only(&ctx).unwrap();
    a.record(&stream).unwrap();
    b.record(&stream).unwrap();
    stream.synchronize().unwrap();
    assert!(matches!(a.elapsed_ms(&b), Err(DriverError::Call { .. })));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_streams_run_independently() {
    let ctx = ctx();
    let module = Module::load_ptx(&ctx, PTX).unwrap();
    let busy = Stream::new(&ctx).unwrap();
    let other = Stream::new(&ctx).unwrap();
    spin(&module, &busy, 1_000_000_000); // ~0.5 s
    let buf = DeviceBuffer::new(&ctx, 1 << 20).unwrap();
    // SAFETY: 1 MiB buffer, alive until synchronize.
    unsafe { memory::memset_d8_async(buf.ptr(), 1, 1 << 20, &other) }.unwrap();
    other.synchronize().unwrap();
    assert!(other.query().unwrap());
    assert!(
        !busy.query().unwrap(),
        "the other stream waited for the busy one"
    );
    // The wait is ordered through an event: `other` now waits for `busy`.
    let done = Event::sync_only(&ctx).unwrap();
    done.record(&busy).unwrap();
    other.wait_event(&done).unwrap();
    other.synchronize().unwrap();
    assert!(busy.query().unwrap());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_invalid_launch_is_a_typed_error_and_the_context_keeps_working() {
    let ctx = ctx();
    let module = Module::load_ptx(&ctx, PTX).unwrap();
    let saxpy = module.function("saxpy").unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let dy = DeviceBuffer::from_host(&ctx, &f32s_to_bytes(&[1.0; 4])).unwrap();
    let dx = DeviceBuffer::from_host(&ctx, &f32s_to_bytes(&[2.0; 4])).unwrap();
    let (mut py, mut px, mut pa, mut pn) = (dy.ptr(), dx.ptr(), 3.0f32, 4u32);
    let mut params = [
        (&mut py as *mut u64).cast::<c_void>(),
        (&mut px as *mut u64).cast(),
        (&mut pa as *mut f32).cast(),
        (&mut pn as *mut u32).cast(),
    ];
    let too_big = LaunchConfig {
        grid: (1, 1, 1),
        block: (4096, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: parameters match; the launch is rejected before running.
    let err = unsafe { saxpy.launch(too_big, &stream, &mut params) }.unwrap_err();
    match &err {
        DriverError::Call { call, code, .. } => {
            assert_eq!(*call, "cuLaunchKernel");
            assert_eq!(*code, emm_sys::CUresult::ERROR_INVALID_VALUE);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        err.to_string().contains("CUDA_ERROR_INVALID_VALUE"),
        "{err}"
    );
    // SAFETY: as above, with a valid configuration.
    unsafe { saxpy.launch(LaunchConfig::for_elements(4, 32), &stream, &mut params) }.unwrap();
    stream.synchronize().unwrap();
    assert_eq!(bytes_to_f32s(&dy.to_vec().unwrap()), vec![7.0; 4]);
    assert!(Module::load_ptx(&ctx, "this is not PTX").is_err());
    assert!(module.function("no_such_kernel").is_err());
    assert!(ctx.take_deferred_errors().is_empty());
}
