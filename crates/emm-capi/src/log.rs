//! Log output of the C ABI: emm's `tracing` events reach the program.
//!
//! On first use the library installs a `tracing` subscriber (unless the process has
//! one already) filtered by `EMM_LOG` (the `tracing-subscriber` `EnvFilter` syntax,
//! e.g. `debug` or `emm_pool=trace`; default `warn`). Events go to standard error,
//! one line each. After [`emm_capture_warnings`](crate::emm_capture_warnings)`(1)` (Python's bindings do this),
//! warnings and errors go instead to a queue that [`emm_take_warning`](crate::emm_take_warning) empties, so a
//! binding can raise them in its own terms (Python: `warnings.warn`). The queue
//! keeps the newest [`QUEUE_CAP`] messages. An invalid `EMM_LOG` is replaced by
//! `warn`, with a notice on standard error that is also queued for
//! [`emm_take_warning`](crate::emm_take_warning).

//!
//! This module is the output itself (the subscriber, the filter, the queue); the
//! two C functions that read it are in `warnings.rs`. It imports nothing of the
//! crate, so `guard` can install it.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt as _};
use tracing_subscriber::{EnvFilter, Layer};

/// The environment variable that filters emm's log output.
pub const LOG_ENV: &str = "EMM_LOG";

/// Messages the warning queue keeps (the oldest are dropped first).
pub const QUEUE_CAP: usize = 256;

/// `*level` of an error in `emm_take_warning`.
pub const EMM_LOG_ERROR: c_int = 1;
/// `*level` of a warning in `emm_take_warning`.
pub const EMM_LOG_WARN: c_int = 2;

pub(crate) static CAPTURE: AtomicBool = AtomicBool::new(false);
static QUEUE: Mutex<VecDeque<(c_int, String)>> = Mutex::new(VecDeque::new());
/// Messages dropped from the full queue and not yet said to be
/// ([`emm_take_warning`](crate::emm_take_warning) says it before the next one).
pub(crate) static DROPPED: AtomicU64 = AtomicU64::new(0);

pub(crate) fn queue() -> std::sync::MutexGuard<'static, VecDeque<(c_int, String)>> {
    QUEUE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The filter used when `EMM_LOG` is unset or invalid.
const DEFAULT_FILTER: &str = "warn";

/// Installs the subscriber once (a process that set its own keeps it). An
/// `EMM_LOG` value that is not a valid filter is replaced by `warn`, and that is
/// said once: on standard error, and queued for [`emm_take_warning`](crate::emm_take_warning) (so a
/// binding that captures warnings after this sees it too).
pub(crate) fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let (filter, rejected) = filter_from(std::env::var_os(LOG_ENV));
        let subscriber = tracing_subscriber::registry().with(filter).with(Output);
        if tracing::subscriber::set_global_default(subscriber).is_ok() {
            if let Some(text) = rejected {
                to_stderr(format_args!(
                    "emm: {} {}: {text}",
                    Level::WARN,
                    module_path!()
                ));
                push(EMM_LOG_WARN, text);
            }
        }
    });
}

/// Writes one line to standard error. A line that cannot be written (standard
/// error closed, or on a full disk) is dropped: the log has nowhere else to
/// go, and `eprintln!` would panic there, across the C boundary for the events
/// a call logs after its guard.
fn to_stderr(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The filter for the value of `EMM_LOG` (`None`: unset), and, when the value was
/// rejected, the notice saying what was given, why it was rejected and what is
/// used instead.
pub(crate) fn filter_from(value: Option<std::ffi::OsString>) -> (EnvFilter, Option<String>) {
    let fallback = |why: String| (EnvFilter::new(DEFAULT_FILTER), Some(why));
    let Some(value) = value else {
        return (EnvFilter::new(DEFAULT_FILTER), None);
    };
    let Some(text) = value.to_str() else {
        return fallback(format!(
            "{LOG_ENV}={value:?} is not valid UTF-8; using `{DEFAULT_FILTER}` instead"
        ));
    };
    match EnvFilter::try_new(text) {
        Ok(f) => (f, None),
        Err(e) => fallback(format!(
            "{LOG_ENV}={text:?} is not a valid log filter ({e}); using `{DEFAULT_FILTER}` instead (the syntax: `debug`, `emm_pool=trace`, `warn,emm_capi=debug`)"
        )),
    }
}

/// Queues a message for [`emm_take_warning`](crate::emm_take_warning), dropping the oldest past
/// [`QUEUE_CAP`].
fn push(code: c_int, text: String) {
    let mut q = queue();
    if q.len() >= QUEUE_CAP {
        q.pop_front();
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
    q.push_back((code, text));
}

/// Collects an event's message and fields into one line.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn core::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            if !self.fields.is_empty() {
                self.fields.push_str(", ");
            }
            let _ = write!(self.fields, "{}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.record_debug(field, &value);
        }
    }
}

impl Line {
    fn text(self) -> String {
        if self.fields.is_empty() {
            self.message
        } else if self.message.is_empty() {
            self.fields
        } else {
            format!("{} ({})", self.message, self.fields)
        }
    }
}

/// The layer: warnings and errors to the queue while capturing, everything else
/// (and everything while not capturing) to standard error.
struct Output;

impl<S: Subscriber> Layer<S> for Output {
    fn on_event(&self, event: &Event<'_>, _ctx: LayerContext<'_, S>) {
        let meta = event.metadata();
        let mut line = Line::default();
        event.record(&mut line);
        let text = line.text();
        let level = *meta.level();
        if CAPTURE.load(Ordering::Relaxed) && level <= Level::WARN {
            let code = if level == Level::ERROR {
                EMM_LOG_ERROR
            } else {
                EMM_LOG_WARN
            };
            push(code, text);
        } else {
            to_stderr(format_args!("emm: {level} {}: {text}", meta.target()));
        }
    }
}
