//! AFL++ entry point of the `cupy_hooks` target ([`emm_fuzz::cupy_hooks`]).

fn main() {
    emm_fuzz::init();
    afl::fuzz!(|data: &[u8]| {
        emm_fuzz::cupy_hooks(data);
    });
}
