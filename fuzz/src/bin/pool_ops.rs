//! AFL++ entry point of the `pool_ops` target ([`emm_fuzz::pool_ops`]).

fn main() {
    emm_fuzz::init();
    afl::fuzz!(|data: &[u8]| {
        emm_fuzz::pool_ops(data);
    });
}
