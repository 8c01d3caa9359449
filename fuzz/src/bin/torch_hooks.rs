//! AFL++ entry point of the `torch_hooks` target ([`emm_fuzz::torch_hooks`]).

fn main() {
    emm_fuzz::init();
    afl::fuzz!(|data: &[u8]| {
        emm_fuzz::torch_hooks(data);
    });
}
