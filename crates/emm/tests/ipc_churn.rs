//! Several processes share one GPU's blocks through IPC while the exporter churns
//! (issue 36, item 3): the parent's pool (exportable, so blocks of its expandable
//! segment go out by file descriptor and small ones as legacy handles) allocates
//! and frees blocks of random sizes, trims now and then, and hands a block to each
//! of N child processes at once; each child opens its handle, checks every word
//! the parent wrote, writes its own into the block, closes it and answers; the
//! parent checks the child's words before freeing the block into the churn. At
//! the end the pool's own consistency check passes and every child exited 0.
//!
//! Children are this test binary started again (`ipc_churn_child`), talking one
//! line per request over their standard input and output. A GPU test: the
//! stand-in's legacy handles do not open in another process.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use emm_core::{IpcHandle, MemoryManager};
use emm_driver::{memory, Context, Stream};
use emm_pool::{PoolConfig, PoolManager, PoolUpstream};

/// Set in a child: its number.
const CHILD_ENV: &str = "EMM_IPC_CHURN_CHILD";
const CHILDREN: usize = 4;
const ROUNDS: usize = 60;
const MIB: usize = 1 << 20;

fn ctx() -> Context {
    Context::on_device(0).expect("device 0")
}

/// The parent's word for round `round`, block `i`; the child's is its negation.
fn word(round: usize, i: usize) -> u32 {
    0x5EED_0000 ^ ((round as u32) << 8) ^ i as u32
}

/// Reads `len` bytes at `ptr` and says whether every whole 32-bit word is `w`.
fn all_words(ctx: &Context, ptr: u64, len: usize, w: u32) -> Result<(), String> {
    let mut back = vec![0u8; len];
    // SAFETY: the caller's `ptr` is device memory of at least `len` bytes.
    unsafe { memory::copy_dtoh(ctx, &mut back, ptr) }.map_err(|e| e.to_string())?;
    match back
        .chunks_exact(4)
        .position(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]) != w)
    {
        None => Ok(()),
        Some(at) => Err(format!(
            "word {at} of {len} bytes at {ptr:#x} is {:#x}, expected {w:#x}",
            u32::from_ne_bytes(back[at * 4..at * 4 + 4].try_into().unwrap_or([0; 4]))
        )),
    }
}

struct Worker {
    child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
}

impl Worker {
    fn start(n: usize) -> Worker {
        let exe = std::env::current_exe().expect("this test binary");
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "ipc_churn_child",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, n.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("a child process starts");
        let to = child.stdin.take().expect("its stdin");
        let from = BufReader::new(child.stdout.take().expect("its stdout"));
        Worker { child, to, from }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.to, "{line}").expect("the child reads its requests");
        self.to.flush().expect("the child reads its requests");
    }

    /// The child's next answer (`OK ...` or `ERR ...`), skipping libtest's lines.
    fn answer(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.from.read_line(&mut line).expect("the child's output");
            assert!(n > 0, "the child closed its output without answering");
            if line.starts_with("OK") || line.starts_with("ERR") {
                return line.trim().to_owned();
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn processes_share_blocks_through_ipc_while_the_exporter_churns() {
    let ctx = ctx();
    let pool = PoolManager::with_config(
        PoolUpstream::Driver(ctx.clone()),
        PoolConfig {
            exportable: true,
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut workers: Vec<Worker> = (0..CHILDREN).map(Worker::start).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut rng = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut kept = Vec::new(); // churn: blocks that outlive a round
    let (mut vmm, mut legacy) = (0usize, 0usize);
    for round in 0..ROUNDS {
        // One block per child, of mixed sizes: small ones (legacy handles) and
        // large ones (the expandable segment, exported by file descriptor).
        let mut shared = Vec::new();
        for i in 0..CHILDREN {
            let size = match rng() % 4 {
                0 => 4096 + (rng() % (256 << 10)) as usize,
                1 => MIB + (rng() % (8 * MIB as u64)) as usize,
                _ => 8 * MIB + (rng() % (56 * MIB as u64)) as usize,
            } & !3;
            let a = pool.memalloc_async(size, stream.raw()).unwrap();
            // SAFETY: `a` holds `size / 4` words.
            unsafe { memory::memset_d32_async(a.ptr(), word(round, i), size / 4, &stream) }
                .unwrap();
            shared.push(a);
        }
        stream.synchronize().unwrap();
        for (i, a) in shared.iter().enumerate() {
            let h = pool.get_ipc_handle(a.as_view()).unwrap();
            match h {
                IpcHandle::Vmm { .. } => vmm += 1,
                _ => legacy += 1,
            }
            workers[i].send(&format!(
                "OPEN {} {} {}",
                h.to_hex(),
                a.size(),
                word(round, i)
            ));
        }
        // While the children work: churn around their blocks.
        for _ in 0..6 {
            if !kept.is_empty() && rng() % 2 == 0 {
                let at = (rng() as usize) % kept.len();
                drop(kept.swap_remove(at));
            } else {
                let size = 512 + (rng() % (24 * MIB as u64)) as usize;
                kept.push(pool.memalloc_async(size, stream.raw()).unwrap());
            }
        }
        if round % 10 == 9 {
            pool.trim();
        }
        for (i, a) in shared.iter().enumerate() {
            let answer = workers[i].answer();
            assert_eq!(answer, "OK", "round {round}, child {i}");
            let size = a.size();
            let w = !word(round, i);
            if let Err(e) = all_words(&ctx, a.ptr(), size, w) {
                panic!("round {round}, child {i}: the child's write is not all there: {e}");
            }
        }
        drop(shared);
        pool.check().unwrap();
    }
    for (i, w) in workers.iter_mut().enumerate() {
        w.send("QUIT");
        let status = w.child.wait().unwrap();
        assert!(status.success(), "child {i} exited with {status}");
    }
    drop(kept);
    pool.trim();
    pool.check().unwrap();
    println!(
        "{ROUNDS} rounds x {CHILDREN} processes: {vmm} blocks shared by file descriptor, {legacy} by legacy handle"
    );
    assert!(vmm > 0 && legacy > 0, "both kinds of handle were exercised");
}

/// The child half of the test above; does nothing unless started by it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn ipc_churn_child() {
    let Ok(me) = std::env::var(CHILD_ENV) else {
        return; // not started by the parent test
    };
    let ctx = ctx();
    let pool = PoolManager::new(&ctx).unwrap();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let mut parts = line.split(' ');
        match parts.next() {
            Some("QUIT") | None => break,
            Some("OPEN") => {
                let (hex, size, w) = (parts.next(), parts.next(), parts.next());
                let answer = (|| -> Result<(), String> {
                    let h =
                        IpcHandle::from_hex(hex.ok_or("no handle")?).map_err(|e| e.to_string())?;
                    let size: usize = size.ok_or("no size")?.parse().map_err(|_| "bad size")?;
                    let w: u32 = w.ok_or("no word")?.parse().map_err(|_| "bad word")?;
                    let mem = h.open(&ctx, &pool).map_err(|e| format!("open: {e}"))?;
                    all_words(&ctx, mem.ptr(), size, w)?;
                    // SAFETY: the mapping covers `size` bytes.
                    unsafe {
                        memory::memset_d32_async(mem.ptr(), !w, size / 4, &Stream::legacy(&ctx))
                    }
                    .map_err(|e| e.to_string())?;
                    ctx.synchronize().map_err(|e| e.to_string())?;
                    mem.close();
                    Ok(())
                })();
                match answer {
                    Ok(()) => writeln!(out, "OK").unwrap(),
                    Err(e) => writeln!(out, "ERR child {me}: {e}").unwrap(),
                }
                out.flush().unwrap();
            }
            Some(other) => panic!("unknown request {other}"),
        }
    }
}
