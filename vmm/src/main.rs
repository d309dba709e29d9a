fn main() {
    std::process::exit(mvm::cli::main());
}
