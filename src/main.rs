fn main() -> std::process::ExitCode {
    colloquy::cli::run()
}
