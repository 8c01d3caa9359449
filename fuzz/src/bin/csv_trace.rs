//! AFL++ entry point of the `csv_trace` target ([`emm_fuzz::csv_trace`]).

fn main() {
    emm_fuzz::init();
    afl::fuzz!(|data: &[u8]| {
        emm_fuzz::csv_trace(data);
    });
}
