/// jemalloc: glibc's malloc/free were a sixth of a turn's CPU and kept evicted conversations'
/// memory from the OS. Its background thread returns freed pages within about a second.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[allow(non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn main() -> std::process::ExitCode {
    match colloquy::cli::run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("colloquy: {}", colloquy::error::chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
