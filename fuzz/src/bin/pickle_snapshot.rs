//! AFL++ entry point of the `pickle_snapshot` target ([`emm_fuzz::pickle_snapshot`]).

fn main() {
    emm_fuzz::init();
    afl::fuzz!(|data: &[u8]| {
        emm_fuzz::pickle_snapshot(data);
    });
}
