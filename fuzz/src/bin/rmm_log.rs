//! AFL++ entry point of the `rmm_log` target ([`emm_fuzz::rmm_log`]).

fn main() {
    emm_fuzz::init();
    afl::fuzz!(|data: &[u8]| {
        emm_fuzz::rmm_log(data);
    });
}
