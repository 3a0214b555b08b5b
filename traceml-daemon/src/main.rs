fn main() {
    println!("{}", traceml_daemon::EBPF_OBJECT.len());
}
