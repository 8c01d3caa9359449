//! [`Op`], one event of a trace, and [`Format`], the formats read.

/// One event of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes as `id` on `stream`.
    Alloc {
        /// The allocation's name while live.
        id: u64,
        /// Bytes requested.
        size: u64,
        /// The trace's stream number (0: the default stream).
        stream: u64,
    },
    /// Free `id`.
    Free {
        /// The allocation's name.
        id: u64,
    },
}

/// The formats a trace can be in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// emm's CSV: header `op,id,size,stream`, `op` `a` or `f`.
    EmmCsv,
    /// RMM's replay log (`logging_resource_adaptor`):
    /// `Thread,Time,Action,Pointer,Size,Stream`.
    RmmLog,
    /// A PyTorch memory snapshot pickle (`torch.cuda.memory._dump_snapshot`).
    TorchSnapshot,
    /// Events built in memory (synthetic traces).
    Memory,
}

impl Format {
    /// A short name for reports: `emm-csv`, `rmm-log`, `pytorch-snapshot`, `memory`.
    pub fn name(self) -> &'static str {
        match self {
            Format::EmmCsv => "emm-csv",
            Format::RmmLog => "rmm-log",
            Format::TorchSnapshot => "pytorch-snapshot",
            Format::Memory => "memory",
        }
    }
}
