/// glibc's allocator spent a sixth of a turn's CPU in malloc/free (its fastbin consolidation)
/// and kept freed conversation memory from the OS; mimalloc does neither.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    colloquy::cli::run()
}
