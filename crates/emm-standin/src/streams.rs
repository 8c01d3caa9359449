//! Streams and events.
//!
//! Work runs at call time, so every stream is always idle and every recorded event
//! complete. To exercise code that waits across streams, `not_ready N` makes the
//! first `N` queries of an event after each record (and of a stream after each
//! operation queued on it) report `CUDA_ERROR_NOT_READY`; a synchronization clears
//! that.

use std::collections::HashMap;
use std::time::Instant;

use emm_sys::{event_flags, CUresult, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};

/// A created stream.
#[derive(Debug)]
pub struct StreamState {
    /// The device of the context it was created in.
    pub device: i32,
    /// Queries still to answer `NOT_READY`.
    pub not_ready: u64,
}

/// An event.
#[derive(Debug)]
pub struct EventState {
    /// `cuEventCreate` flags.
    pub flags: u32,
    /// When it was last recorded.
    pub recorded: Option<Instant>,
    /// Queries still to answer `NOT_READY`.
    pub not_ready: u64,
}

/// Every live stream and event.
#[derive(Debug, Default)]
pub struct Streams {
    streams: HashMap<u64, StreamState>,
    events: HashMap<u64, EventState>,
    /// `NOT_READY` answers after each record or queued operation.
    pub not_ready_after_record: u64,
    /// Queries of default streams still to answer `NOT_READY`.
    default_not_ready: u64,
    /// The stream `cuStreamIsCapturing` reports as capturing (`capturing` knob).
    pub capturing: Option<u64>,
}

/// `true` for the null, legacy and per-thread default streams.
pub fn is_default_stream(s: u64) -> bool {
    s == 0 || s == CU_STREAM_LEGACY.0 as u64 || s == CU_STREAM_PER_THREAD.0 as u64
}

impl Streams {
    /// Registers a new stream under `handle`.
    pub fn create_stream(&mut self, handle: u64, device: i32) {
        self.streams.insert(
            handle,
            StreamState {
                device,
                not_ready: 0,
            },
        );
    }

    /// Destroys a stream.
    pub fn destroy_stream(&mut self, handle: u64) -> Result<(), CUresult> {
        self.streams
            .remove(&handle)
            .map(|_| ())
            .ok_or(CUresult::ERROR_INVALID_HANDLE)
    }

    /// Checks that `s` is a default stream or a live created one.
    pub fn check_stream(&self, s: u64) -> Result<(), CUresult> {
        if is_default_stream(s) || self.streams.contains_key(&s) {
            Ok(())
        } else {
            Err(CUresult::ERROR_INVALID_HANDLE)
        }
    }

    /// Notes an operation queued on `s` (for the `not_ready` knob).
    pub fn queued(&mut self, s: u64) -> Result<(), CUresult> {
        self.check_stream(s)?;
        let n = self.not_ready_after_record;
        match self.streams.get_mut(&s) {
            Some(st) => st.not_ready = n,
            None => self.default_not_ready = n,
        }
        Ok(())
    }

    /// `cuStreamQuery`.
    pub fn query_stream(&mut self, s: u64) -> CUresult {
        if let Err(e) = self.check_stream(s) {
            return e;
        }
        let left = match self.streams.get_mut(&s) {
            Some(st) => &mut st.not_ready,
            None => &mut self.default_not_ready,
        };
        if *left > 0 {
            *left -= 1;
            CUresult::ERROR_NOT_READY
        } else {
            CUresult::SUCCESS
        }
    }

    /// `cuStreamSynchronize`: the stream (already idle) stops reporting `NOT_READY`.
    pub fn sync_stream(&mut self, s: u64) -> Result<(), CUresult> {
        self.check_stream(s)?;
        match self.streams.get_mut(&s) {
            Some(st) => st.not_ready = 0,
            None => self.default_not_ready = 0,
        }
        Ok(())
    }

    /// `cuCtxSynchronize`: everything is complete.
    pub fn sync_all(&mut self) {
        self.default_not_ready = 0;
        self.streams.values_mut().for_each(|s| s.not_ready = 0);
        self.events.values_mut().for_each(|e| e.not_ready = 0);
    }

    /// Registers a new event under `handle`.
    pub fn create_event(&mut self, handle: u64, flags: u32) {
        self.events.insert(
            handle,
            EventState {
                flags,
                recorded: None,
                not_ready: 0,
            },
        );
    }

    /// Destroys an event.
    pub fn destroy_event(&mut self, handle: u64) -> Result<(), CUresult> {
        self.events
            .remove(&handle)
            .map(|_| ())
            .ok_or(CUresult::ERROR_INVALID_HANDLE)
    }

    /// `cuEventRecord`.
    pub fn record(&mut self, e: u64, s: u64) -> Result<(), CUresult> {
        self.check_stream(s)?;
        let n = self.not_ready_after_record;
        let ev = self
            .events
            .get_mut(&e)
            .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
        ev.recorded = Some(Instant::now());
        ev.not_ready = n;
        Ok(())
    }

    /// `cuEventQuery`.
    pub fn query_event(&mut self, e: u64) -> CUresult {
        match self.events.get_mut(&e) {
            None => CUresult::ERROR_INVALID_HANDLE,
            Some(ev) if ev.not_ready > 0 => {
                ev.not_ready -= 1;
                CUresult::ERROR_NOT_READY
            }
            Some(_) => CUresult::SUCCESS,
        }
    }

    /// `cuEventSynchronize`.
    pub fn sync_event(&mut self, e: u64) -> Result<(), CUresult> {
        let ev = self
            .events
            .get_mut(&e)
            .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
        ev.not_ready = 0;
        Ok(())
    }

    /// `cuStreamWaitEvent`: nothing to wait for, but both handles must be valid.
    pub fn wait(&self, s: u64, e: u64) -> Result<(), CUresult> {
        self.check_stream(s)?;
        if self.events.contains_key(&e) {
            Ok(())
        } else {
            Err(CUresult::ERROR_INVALID_HANDLE)
        }
    }

    /// `cuEventElapsedTime` in milliseconds.
    pub fn elapsed(&self, start: u64, end: u64) -> Result<f32, CUresult> {
        let a = self
            .events
            .get(&start)
            .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
        let b = self
            .events
            .get(&end)
            .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
        if a.flags & event_flags::DISABLE_TIMING != 0 || b.flags & event_flags::DISABLE_TIMING != 0
        {
            return Err(CUresult::ERROR_INVALID_HANDLE);
        }
        match (a.recorded, b.recorded) {
            (Some(x), Some(y)) => Ok(if y >= x {
                (y - x).as_secs_f32() * 1e3
            } else {
                -((x - y).as_secs_f32() * 1e3)
            }),
            _ => Err(CUresult::ERROR_INVALID_HANDLE),
        }
    }

    /// Live created streams.
    pub fn live_streams(&self) -> u64 {
        self.streams.len() as u64
    }

    /// Live events.
    pub fn live_events(&self) -> u64 {
        self.events.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_knob_counts_queries_after_record() {
        let mut s = Streams {
            not_ready_after_record: 2,
            ..Streams::default()
        };
        s.create_stream(100, 0);
        s.create_event(200, event_flags::DISABLE_TIMING);
        s.record(200, 100).unwrap();
        assert_eq!(s.query_event(200), CUresult::ERROR_NOT_READY);
        assert_eq!(s.query_event(200), CUresult::ERROR_NOT_READY);
        assert_eq!(s.query_event(200), CUresult::SUCCESS);
        s.queued(100).unwrap();
        assert_eq!(s.query_stream(100), CUresult::ERROR_NOT_READY);
        s.sync_stream(100).unwrap();
        assert_eq!(s.query_stream(100), CUresult::SUCCESS);
        assert_eq!(s.query_event(999), CUresult::ERROR_INVALID_HANDLE);
        s.destroy_event(200).unwrap();
        s.destroy_stream(100).unwrap();
        assert_eq!(s.live_events() + s.live_streams(), 0);
    }
}
