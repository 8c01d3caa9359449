//! Synthetic traces of other workloads than the bundled GPT training trace, so the
//! pool is not tuned to one file: inference with varying batch and sequence
//! lengths, and convolutional training. Deterministic for a given seed.
//!
//! ```
//! let t = emm_trace::synth::inference(7, 3);
//! assert!(emm_trace::scan(&t)?.requests > 100);
//! # Ok::<(), emm_trace::TraceError>(())
//! ```

use crate::op::Op;
use crate::trace::Trace;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

#[derive(Default)]
struct Builder {
    ops: Vec<Op>,
    next: u64,
}

impl Builder {
    fn finish(self, name: String) -> Trace {
        Trace::from_ops(&name, self.ops)
    }

    fn alloc(&mut self, size: usize) -> u64 {
        self.next += 1;
        let size = size.div_ceil(512) * 512;
        self.ops.push(Op::Alloc {
            id: self.next,
            size: size as u64,
            stream: 0,
        });
        self.next
    }
    fn free(&mut self, id: u64) {
        self.ops.push(Op::Free { id });
    }
}

/// Transformer inference: requests of random batch (1..=32) and sequence length
/// (16..=2048); per request a KV cache that lives for the request, and per layer
/// activations and attention scores that live for one layer.
pub fn inference(seed: u64, requests: usize) -> Trace {
    let mut r = Rng(seed | 1);
    let mut b = Builder::default();
    let (layers, width, heads) = (12usize, 1024usize, 16usize);
    let weights: Vec<u64> = (0..layers * 4)
        .map(|_| b.alloc(width * width * 2))
        .collect();
    for _ in 0..requests {
        let batch = r.range(1, 32) as usize;
        let seq = r.range(16, 2048) as usize;
        let kv: Vec<u64> = (0..layers)
            .map(|_| b.alloc(2 * batch * seq * width * 2))
            .collect();
        let mut x = b.alloc(batch * seq * width * 2);
        for _ in 0..layers {
            let qkv = b.alloc(3 * batch * seq * width * 2);
            let scores = b.alloc(batch * heads * seq * seq.min(512) * 2);
            let out = b.alloc(batch * seq * width * 2);
            b.free(scores);
            b.free(qkv);
            let mlp = b.alloc(4 * batch * seq * width * 2);
            b.free(mlp);
            b.free(x);
            x = out;
        }
        b.free(x);
        for k in kv {
            b.free(k);
        }
    }
    for w in weights {
        b.free(w);
    }
    b.finish(format!("synthetic-inference-{seed}"))
}

/// Convolutional training: a ResNet-like stack whose feature maps halve in
/// resolution and double in channels; forward activations live until the backward
/// pass frees them in reverse order; image sizes vary per step (multi-scale).
pub fn conv_training(seed: u64, steps: usize) -> Trace {
    let mut r = Rng(seed | 1);
    let mut b = Builder::default();
    let stages = [(64usize, 3usize), (128, 4), (256, 6), (512, 3)];
    let mut params = Vec::new();
    for &(c, n) in &stages {
        for _ in 0..n {
            params.push(b.alloc(c * c * 9 * 4));
            params.push(b.alloc(c * c * 9 * 4)); // optimizer state
        }
    }
    for _ in 0..steps {
        let batch = r.range(16, 64) as usize;
        let res = [160usize, 192, 224, 256, 288][r.range(0, 4) as usize];
        let mut acts = Vec::new();
        let mut hw = res / 4;
        for &(c, n) in &stages {
            for _ in 0..n {
                acts.push(b.alloc(batch * c * hw * hw * 2));
                acts.push(b.alloc(batch * c * hw * hw * 2)); // batch-norm output
                let ws = b.alloc((r.range(1, 64) as usize) << 20); // cuDNN workspace
                b.free(ws);
            }
            hw = (hw / 2).max(1);
        }
        while let Some(a) = acts.pop() {
            let grad = b.alloc(512 * 1024 + (a as usize % 7) * (1 << 20));
            b.free(a);
            b.free(grad);
        }
    }
    for p in params {
        b.free(p);
    }
    b.finish(format!("synthetic-conv-{seed}"))
}
