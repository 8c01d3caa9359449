//! The control language of `emmStandinControl`: one command per call, words
//! separated by spaces, a `u64` answer.
//!
//! | command | effect / answer |
//! |---|---|
//! | `is_standin` | 1 |
//! | `capacity [BYTES]` | sets (K/M/G suffixes allowed) / answers the capacity per device |
//! | `devices [N]` | sets / answers the device count |
//! | `reset_primary D` | device `D`'s primary context is reset (a new `cuCtxGetId`; allocations stay, as in `cuDevicePrimaryCtxReset_v2`); answers its resets |
//! | `vmm 0\|1`, `mempools 0\|1`, `managed 0\|1` | whether devices report VMM / memory pools / managed memory |
//! | `not_ready N` | the first N queries after each record report `CUDA_ERROR_NOT_READY` |
//! | `capturing HANDLE\|off` | `cuStreamIsCapturing` reports the stream HANDLE (a number; 0 is the null stream) as capturing |
//! | `fail FUNCTION NTH CODE` | the NTH next call (1: the next) of FUNCTION fails with CODE |
//! | `fail_at CLASS NTH CODE` | the NTH next call (1: the next) of CLASS (`any`, `frees`, `events`; see [`CallClass`]), whatever its name, fails with CODE |
//! | `lose_context_at CLASS NTH` | the context is lost from the NTH next call of CLASS on, until `reset` |
//! | `fail_always FUNCTION CODE` | every call of FUNCTION fails with CODE until `reset` |
//! | `fail_frees CODE\|off` | every free (`cuMemFree_v2`, `cuMemFreeAsync`, `cuMemRelease`, …) fails |
//! | `lose_context` | every call fails with `CUDA_ERROR_CONTEXT_IS_DESTROYED` until `reset` |
//! | `reset` | clears every fault and knob above except capacity and devices; counters stay |
//! | `live_allocs`, `live_bytes` | device allocations (plain, managed, stream-ordered, VMM physical handles) |
//! | `live_managed`, `live_managed_bytes` | managed allocations (`cuMemAllocManaged`) alone |
//! | `live_vmm_handles`, `live_reservations` | VMM physical handles, address reservations |
//! | `live_host` | pinned and registered host ranges |
//! | `live_events`, `live_streams`, `live_pools` | created and not destroyed |
//! | `pool_cached_bytes` | bytes pools hold reserved but not allocated |
//! | `used_bytes [DEVICE]` | bytes charged against the capacity |
//! | `context_refs` | primary-context retains outstanding |
//! | `ipc_open` | legacy IPC handles opened and not closed |
//! | `calls FUNCTION` | calls made to FUNCTION (failed ones included) |
//! | `class_calls CLASS` | calls made of CLASS (failed ones included) |
//! | `double_frees`, `invalid_frees` | frees of freed / never-allocated addresses |
//! | `injected`, `pending_faults` | faults injected so far / planned and not yet hit |
//!
//! CODE is a number or a name (`CUDA_ERROR_OUT_OF_MEMORY`, `ERROR_OUT_OF_MEMORY`).

use emm_sys::CUresult;

use crate::faults::{parse_code, CallClass};
use crate::memory::RegionKind;
use crate::state::{parse_bytes, State};

/// Runs one command on the model.
pub fn run(st: &mut State, command: &str) -> Result<u64, CUresult> {
    let bad = CUresult::ERROR_INVALID_VALUE;
    let words: Vec<&str> = command.split_whitespace().collect();
    let arg = |i: usize| words.get(i).copied().ok_or(bad);
    let num = |i: usize| arg(i).and_then(|w| w.parse::<u64>().map_err(|_| bad));
    let flag = |i: usize| arg(i).map(|w| w != "0" && w != "off");
    let code = |i: usize| arg(i).and_then(|w| parse_code(w).ok_or(bad));
    let class = |i: usize| arg(i).and_then(|w| CallClass::parse(w).ok_or(bad));
    let device_live = |k: RegionKind| {
        matches!(
            k,
            RegionKind::Device | RegionKind::Managed { .. } | RegionKind::Async { .. }
        )
    };
    let managed_live = |k: RegionKind| matches!(k, RegionKind::Managed { .. });
    Ok(match *words.first().ok_or(bad)? {
        "is_standin" => 1,
        "capacity" => {
            if let Ok(w) = arg(1) {
                st.config.capacity = parse_bytes(w).ok_or(bad)?;
            }
            st.config.capacity as u64
        }
        "reset_primary" => {
            // As `cuDevicePrimaryCtxReset` would: the device's context gets a
            // new `cuCtxGetId`.
            let d = num(1)? as usize;
            let resets = &mut st.contexts.resets;
            if resets.len() <= d {
                resets.resize(d + 1, 0);
            }
            resets[d] += 1;
            resets[d]
        }
        "devices" => {
            if let Ok(n) = num(1) {
                st.config.devices = (n as i32).clamp(1, 8);
            }
            st.config.devices as u64
        }
        "vmm" => {
            st.config.vmm = flag(1)?;
            u64::from(st.config.vmm)
        }
        "mempools" => {
            st.config.mempools = flag(1)?;
            u64::from(st.config.mempools)
        }
        "managed" => {
            st.config.managed = flag(1)?;
            u64::from(st.config.managed)
        }
        "not_ready" => {
            st.streams.not_ready_after_record = num(1)?;
            st.streams.not_ready_after_record
        }
        "capturing" => {
            st.streams.capturing = if arg(1)? == "off" {
                None
            } else {
                Some(num(1)?)
            };
            st.streams.capturing.unwrap_or(0)
        }
        "fail" => {
            st.faults.fail_nth(arg(1)?, num(2)?, code(3)?);
            st.faults.pending()
        }
        "fail_at" => {
            st.faults.fail_at(class(1)?, num(2)?, code(3)?);
            st.faults.pending()
        }
        "lose_context_at" => {
            st.faults.lose_context_at(class(1)?, num(2)?);
            st.faults.pending()
        }
        "fail_always" => {
            st.faults.fail_always(arg(1)?, code(2)?);
            0
        }
        "fail_frees" => {
            let c = if arg(1)? == "off" {
                None
            } else {
                Some(code(1)?)
            };
            st.faults.fail_frees(c);
            0
        }
        "lose_context" => {
            st.faults.context_lost = true;
            0
        }
        "reset" => {
            st.faults.reset();
            st.streams.not_ready_after_record = 0;
            st.streams.capturing = None;
            st.config.vmm = true;
            st.config.mempools = true;
            st.config.managed = true;
            0
        }
        "live_allocs" => st.mem.live(device_live).0 + st.vmm.live_handles().0,
        "live_bytes" => st.mem.live(device_live).1 + st.vmm.live_handles().1,
        "live_managed" => st.mem.live(managed_live).0,
        "live_managed_bytes" => st.mem.live(managed_live).1,
        "live_vmm_handles" => st.vmm.live_handles().0,
        "live_reservations" => st.vmm.live_reservations(),
        "live_host" => {
            st.mem
                .live(|k| matches!(k, RegionKind::HostAlloc | RegionKind::HostRegistered))
                .0
        }
        "live_events" => st.streams.live_events(),
        "live_streams" => st.streams.live_streams(),
        "live_pools" => st.pools.live_pools(),
        "pool_cached_bytes" => st.pools.cached().1,
        "used_bytes" => st.mem.used_on(num(1).unwrap_or(0) as i32) as u64,
        "context_refs" => st.contexts.total_refs(),
        "ipc_open" => st.ipc_open.values().sum(),
        "calls" => st.faults.calls(arg(1)?),
        "class_calls" => st.faults.class_calls(class(1)?),
        "double_frees" => st.mem.double_frees,
        "invalid_frees" => st.mem.invalid_frees,
        "injected" => st.faults.injected,
        "pending_faults" => st.faults.pending(),
        _ => return Err(bad),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_and_answer() {
        let mut st = State::default();
        assert_eq!(run(&mut st, "is_standin"), Ok(1));
        assert_eq!(run(&mut st, "capacity 1G"), Ok(1 << 30));
        assert_eq!(
            run(&mut st, "fail cuMemAlloc_v2 2 CUDA_ERROR_OUT_OF_MEMORY"),
            Ok(1)
        );
        assert_eq!(run(&mut st, "pending_faults"), Ok(1));
        assert_eq!(run(&mut st, "reset"), Ok(0));
        assert_eq!(run(&mut st, "pending_faults"), Ok(0));
        assert_eq!(run(&mut st, "calls cuMemAlloc_v2"), Ok(0));
        assert_eq!(run(&mut st, "live_allocs"), Ok(0));
        assert_eq!(run(&mut st, "bogus"), Err(CUresult::ERROR_INVALID_VALUE));
        assert_eq!(run(&mut st, "fail x"), Err(CUresult::ERROR_INVALID_VALUE));
        assert_eq!(run(&mut st, "fail_at any 3 2"), Ok(1));
        assert_eq!(run(&mut st, "lose_context_at frees 1"), Ok(2));
        assert_eq!(run(&mut st, "class_calls any"), Ok(0));
        assert_eq!(
            run(&mut st, "fail_at bogus 1 2"),
            Err(CUresult::ERROR_INVALID_VALUE)
        );
        assert_eq!(run(&mut st, "reset"), Ok(0));
        assert_eq!(run(&mut st, "pending_faults"), Ok(0));
    }

    #[test]
    fn managed_allocations_are_live_device_memory_and_the_knob_resets() {
        let mut st = State::default();
        let p = st.mem.alloc_managed(0, 4096, 2, 1 << 20).unwrap();
        assert_eq!(run(&mut st, "live_managed"), Ok(1));
        assert_eq!(run(&mut st, "live_managed_bytes"), Ok(4096));
        assert_eq!(run(&mut st, "live_allocs"), Ok(1));
        assert_eq!(run(&mut st, "live_bytes"), Ok(4096));
        st.mem.free_device(p).unwrap();
        assert_eq!(run(&mut st, "live_managed"), Ok(0));
        assert_eq!(run(&mut st, "managed 0"), Ok(0));
        assert!(!st.config.managed);
        assert_eq!(run(&mut st, "reset"), Ok(0));
        assert!(st.config.managed);
    }
}
