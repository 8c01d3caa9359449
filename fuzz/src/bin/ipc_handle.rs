//! AFL++ entry point of the `ipc_handle` target ([`emm_fuzz::ipc_handle`]).

fn main() {
    emm_fuzz::init();
    afl::fuzz!(|data: &[u8]| {
        emm_fuzz::ipc_handle(data);
    });
}
