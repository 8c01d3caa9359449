//! Model-based test of the default manager's bookkeeping over the host stand-in:
//! nothing freed twice, nothing lost, flushes exactly when the thresholds say.

use emm_core::{DeferGuard, DeviceAllocation, MemoryManager};
use emm_default::{DefaultManager, HostUpstream, PendingConfig};
use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};

const CAPACITY: usize = 1 << 20;

#[derive(Clone, Debug)]
struct Model {
    max_count: usize,
    max_bytes: usize,
    ratio: f64,
    live: Vec<usize>,
    pending: Vec<usize>,
    depth: usize,
}

impl Model {
    fn used(&self) -> usize {
        self.live.iter().sum::<usize>() + self.pending.iter().sum::<usize>()
    }
    fn over(&self) -> bool {
        self.pending.len() > self.max_count || self.pending.iter().sum::<usize>() > self.max_bytes
    }
    fn flush(&mut self) {
        self.pending.clear();
    }
}

#[derive(Clone, Debug)]
enum Step {
    Alloc(usize),
    Free(usize),
    Defer,
    Undefer,
    Reset,
    ReleaseCached,
}

struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        (0usize..12, 0.05f64..0.6)
            .prop_map(|(max_count, ratio)| Model {
                max_count,
                max_bytes: (CAPACITY as f64 * ratio) as usize,
                ratio,
                live: vec![],
                pending: vec![],
                depth: 0,
            })
            .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Step> {
        let n = state.live.len().max(1);
        prop_oneof![
            6 => prop_oneof![Just(0usize), 1usize..4096, 4096usize..300_000, Just(CAPACITY + 1)].prop_map(Step::Alloc),
            5 => (0..n).prop_map(Step::Free),
            1 => Just(Step::Defer),
            1 => Just(Step::Undefer),
            1 => Just(Step::Reset),
            1 => Just(Step::ReleaseCached),
        ]
        .boxed()
    }

    fn preconditions(state: &Model, step: &Step) -> bool {
        match step {
            Step::Free(i) => *i < state.live.len(),
            Step::Undefer => state.depth > 0,
            _ => true,
        }
    }

    fn apply(mut m: Model, step: &Step) -> Model {
        match *step {
            Step::Alloc(0) => m.live.push(0),
            Step::Alloc(s) => {
                if m.used() + s > CAPACITY && m.depth == 0 {
                    m.flush();
                }
                if m.used() + s <= CAPACITY {
                    m.live.push(s);
                }
            }
            Step::Free(i) => {
                let s = m.live.remove(i);
                if s > 0 {
                    m.pending.push(s);
                    if m.depth == 0 && m.over() {
                        m.flush();
                    }
                }
            }
            Step::Defer => m.depth += 1,
            Step::Undefer => {
                m.depth -= 1;
                if m.depth == 0 && m.over() {
                    m.flush();
                }
            }
            Step::Reset => {
                m.live.clear();
                m.pending.clear();
            }
            Step::ReleaseCached => {
                if m.depth == 0 {
                    m.flush();
                }
            }
        }
        m
    }
}

struct Sut {
    manager: DefaultManager<HostUpstream>,
    live: Vec<DeviceAllocation>,
    invalidated: Vec<DeviceAllocation>,
    guards: Vec<DeferGuard>,
}

impl StateMachineTest for Sut {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(m: &Model) -> Sut {
        let config = PendingConfig {
            max_count: m.max_count,
            max_ratio: m.ratio,
        };
        let manager = DefaultManager::over(HostUpstream::new(CAPACITY, false), config);
        manager.initialize().unwrap();
        Sut {
            manager,
            live: vec![],
            invalidated: vec![],
            guards: vec![],
        }
    }

    fn apply(mut sut: Sut, m: &Model, step: Step) -> Sut {
        // Allocations invalidated by an earlier reset are dropped now: that must
        // free nothing (checked by the invariants below).
        sut.invalidated.clear();
        match step {
            Step::Alloc(s) => match sut.manager.memalloc(s) {
                Ok(a) => {
                    assert_eq!(a.size(), s);
                    assert!(s == 0 || a.ptr() % 256 == 0);
                    sut.live.push(a);
                }
                Err(e) => {
                    assert!(e.is_out_of_memory(), "{e}");
                    assert_eq!(
                        m.live.len(),
                        sut.live.len(),
                        "the model expected success for {s} bytes: {e}"
                    );
                    assert!(
                        e.to_string()
                            .contains(&format!("requested {}", emm_core::fmt_bytes(s))),
                        "{e}"
                    );
                }
            },
            Step::Free(i) => drop(sut.live.remove(i)),
            Step::Defer => sut.guards.push(sut.manager.defer_cleanup()),
            Step::Undefer => drop(sut.guards.pop()),
            Step::Reset => {
                sut.manager.reset().unwrap();
                sut.invalidated = std::mem::take(&mut sut.live);
            }
            Step::ReleaseCached => {
                sut.manager.release_cached().unwrap();
            }
        }
        sut
    }

    fn check_invariants(sut: &Sut, m: &Model) {
        let up = sut.manager.upstream();
        assert_eq!(up.misuse(), 0, "a block was freed twice or was foreign");
        let pending_bytes: usize = m.pending.iter().sum();
        assert_eq!(
            sut.manager.pending(),
            (m.pending.len(), pending_bytes),
            "pending queue"
        );
        let live_blocks = m.live.iter().filter(|&&s| s > 0).count();
        let upstream_blocks = live_blocks + m.pending.len();
        if sut.invalidated.is_empty() {
            assert_eq!(up.used(), m.used(), "bytes held upstream");
            assert_eq!(up.live_blocks(), upstream_blocks, "blocks held upstream");
        }
        assert_eq!(sut.manager.stats().live, live_blocks);
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn default_manager_matches_its_model(sequential 1..60 => Sut);
}
