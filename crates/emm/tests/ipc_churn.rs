//! Several processes share one GPU's blocks through IPC while the exporter churns
//! (issue 36, item 3): two pools of the parent — one exportable, whose blocks
//! of the expandable segment go out by file descriptor, and one without the
//! expandable segment (the Numba plugin's legacy path), whose blocks go out as
//! legacy handles — allocate and free blocks of random sizes, trim now and then,
//! and hand a block to each of N child processes at once; each child opens its
//! handle, checks every word the parent wrote, writes its own into the block,
//! closes it and answers; the parent checks the child's words before freeing the
//! block into the churn. At the end both pools' consistency checks pass and every
//! child exited 0.
//!
//! Children are this test binary started again (`ipc_churn_child`), talking one
//! line per request over their standard input and output. A GPU test: the
//! stand-in's legacy handles do not open in another process.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use emm_core::{IpcHandle, MemoryManager};
use emm_driver::{memory, Context, Stream};
use emm_pool::{PoolConfig, PoolManager, PoolUpstream, SegmentPolicy};

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

/// What begins a child's answer on its output.
const ANSWER: &str = "@answer: ";
/// How long a child may take over one block before the test gives up on it.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

struct Worker {
    n: usize,
    child: Child,
    to: Option<ChildStdin>,
    /// The child's output lines, read by a thread of their own.
    from: Receiver<String>,
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
        let to = child.stdin.take();
        let out = BufReader::new(child.stdout.take().expect("its stdout"));
        let (tx, from) = channel();
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker { n, child, to, from }
    }

    fn send(&mut self, line: &str) {
        let to = self.to.as_mut().expect("the child's input is open");
        writeln!(to, "{line}").expect("the child reads its requests");
        to.flush().expect("the child reads its requests");
    }

    /// The child's next answer (`OK` or `ERR ...`), skipping libtest's lines;
    /// fails the test when none comes in [`ANSWER_WITHIN`].
    fn answer(&mut self, what: &str) -> String {
        loop {
            match self.from.recv_timeout(ANSWER_WITHIN) {
                // libtest may have begun the line ("test ipc_churn_child ... ").
                Ok(line) if line.contains(ANSWER) => {
                    let at = line.find(ANSWER).unwrap_or(0) + ANSWER.len();
                    return line[at..].trim().to_owned();
                }
                Ok(other) => eprintln!("child {}: {other}", self.n),
                Err(e) => panic!(
                    "{what}: child {} gave no answer within {ANSWER_WITHIN:?} ({e})",
                    self.n
                ),
            }
        }
    }
}

impl Drop for Worker {
    /// A child still running when the test ends (it failed) is killed, so that
    /// nothing waits for it.
    fn drop(&mut self) {
        drop(self.to.take());
        if let Ok(None) = self.child.try_wait() {
            std::thread::sleep(Duration::from_millis(200));
            if let Ok(None) = self.child.try_wait() {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn processes_share_blocks_through_ipc_while_the_exporter_churns() {
    let ctx = ctx();
    let by_fd = PoolManager::with_config(
        PoolUpstream::Driver(ctx.clone()),
        PoolConfig {
            exportable: true,
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let legacy_pool = PoolManager::with_config(
        PoolUpstream::Driver(ctx.clone()),
        PoolConfig {
            segments: SegmentPolicy {
                expandable: false,
                ..SegmentPolicy::default()
            },
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let pools = [&by_fd, &legacy_pool];
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
            let a = pools[i % 2].memalloc_async(size, stream.raw()).unwrap();
            // SAFETY: `a` holds `size / 4` words.
            unsafe { memory::memset_d32_async(a.ptr(), word(round, i), size / 4, &stream) }
                .unwrap();
            shared.push(a);
        }
        stream.synchronize().unwrap();
        for (i, a) in shared.iter().enumerate() {
            let h = pools[i % 2].get_ipc_handle(a.as_view()).unwrap();
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
                let pool = pools[(rng() % 2) as usize];
                kept.push(pool.memalloc_async(size, stream.raw()).unwrap());
            }
        }
        if round % 10 == 9 {
            by_fd.trim();
            legacy_pool.trim();
        }
        for (i, a) in shared.iter().enumerate() {
            let answer = workers[i].answer(&format!("round {round}"));
            assert_eq!(answer, "OK", "round {round}, child {i}");
            let size = a.size();
            let w = !word(round, i);
            if let Err(e) = all_words(&ctx, a.ptr(), size, w) {
                panic!("round {round}, child {i}: the child's write is not all there: {e}");
            }
        }
        drop(shared);
        for pool in pools {
            pool.check().unwrap();
        }
        if round % 10 == 0 {
            eprintln!("round {round} done ({vmm} by descriptor, {legacy} legacy so far)");
        }
    }
    for (i, w) in workers.iter_mut().enumerate() {
        w.send("QUIT");
        drop(w.to.take());
        let status = w.child.wait().unwrap();
        assert!(status.success(), "child {i} exited with {status}");
    }
    drop(kept);
    for pool in pools {
        pool.trim();
        pool.check().unwrap();
    }
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
    eprintln!("child {me}: ready");
    let mut served = 0usize;
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
                    let trace = |stage: &str| {
                        if served < 2 {
                            eprintln!("child {me}, request {served}: {stage}");
                        }
                    };
                    trace("opening");
                    let mut mem = h.open(&ctx, &pool).map_err(|e| format!("open: {e}"))?;
                    trace("opened");
                    all_words(&ctx, mem.ptr(), size, w)?;
                    trace("checked");
                    // SAFETY: the mapping covers `size` bytes.
                    unsafe {
                        memory::memset_d32_async(mem.ptr(), !w, size / 4, &Stream::legacy(&ctx))
                    }
                    .map_err(|e| e.to_string())?;
                    ctx.synchronize().map_err(|e| e.to_string())?;
                    mem.close().map_err(|e| format!("close: {e}"))
                })();
                served += 1;
                match answer {
                    Ok(()) => writeln!(out, "\n{ANSWER}OK").unwrap(),
                    Err(e) => writeln!(out, "\n{ANSWER}ERR child {me}: {e}").unwrap(),
                }
                out.flush().unwrap();
            }
            Some(other) => panic!("unknown request {other}"),
        }
    }
}
