//! AFL++ entry point of the `capi_args` target ([`emm_fuzz::capi_args`]).

fn main() {
    emm_fuzz::init();
    afl::fuzz!(|data: &[u8]| {
        emm_fuzz::capi_args(data);
    });
}
