//! `uprobe_multi` links (kernel 6.6+, with process filtering fixed in 6.10 and its stable
//! backports): one `BPF_LINK_CREATE` with attach type `BPF_TRACE_UPROBE_MULTI` places one
//! program at every offset of a set in one file, each with its cookie, scoped to one process.
//! Taking such a link out costs the kernel one synchronisation however many offsets it carries
//! (~35 ms on Linux 6.18, concurrent across threads), where each perf-event uprobe link costs
//! ~130 ms, one after another (docs/overhead.md, "Known limits"). aya 0.14 cannot make these
//! links; the programs are loaded for them by the vendored `UProbe::load_multi`
//! (vendor/aya/README.traceml.md) and the links are made here on the program's fd.
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

/// `BPF_PROG_LOAD` and `BPF_LINK_CREATE` (`enum bpf_cmd`).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_PROG_TYPE_KPROBE` (uprobes are kprobe-type programs).
const BPF_PROG_TYPE_KPROBE: u32 = 2;
/// `enum bpf_attach_type`.
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
/// `uprobe_multi.flags`: the program runs at the function's return.
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

/// The `link_create` member of `union bpf_attr` with its `uprobe_multi` arm (linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}
const _: () = assert!(size_of::<LinkCreate>() == 64);

/// The leading members of `union bpf_attr` for `BPF_PROG_LOAD`, up to `expected_attach_type`.
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}
const _: () = assert!(size_of::<ProgLoad>() == 72);

fn bpf<T>(cmd: libc::c_long, attr: &T) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a `#[repr(C)]` prefix of `union bpf_attr` for `cmd`, readable for its
    // size; the pointers in it stay valid for the call (the caller's borrows outlive it).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            size_of::<T>() as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a successful `BPF_PROG_LOAD`/`BPF_LINK_CREATE` returns a new fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// One `uprobe_multi` link; dropping it takes every probe of it out at once.
#[derive(Debug)]
pub struct MultiLink {
    _fd: OwnedFd,
    /// How many offsets it carries.
    pub probes: usize,
}

/// Places `prog` (loaded with `UProbe::load_multi`) at each file offset of `path`, the program
/// reading `cookies[i]` at `offsets[i]` with `bpf_get_attach_cookie`, in process `pid` only;
/// at the functions' returns when `ret`.
pub fn attach(
    prog: BorrowedFd<'_>,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    ret: bool,
    pid: u32,
) -> io::Result<MultiLink> {
    assert_eq!(offsets.len(), cookies.len(), "one cookie per offset");
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let attr = LinkCreate {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_TRACE_UPROBE_MULTI,
        path: c_path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: offsets.len() as u32,
        multi_flags: if ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 },
        pid,
        ..Default::default()
    };
    let fd = bpf(BPF_LINK_CREATE, &attr)?;
    Ok(MultiLink {
        _fd: fd,
        probes: offsets.len(),
    })
}

/// Whether this kernel makes `uprobe_multi` links that filter by process (probed once): `Ok`,
/// or why not, for a log line.
pub fn supported() -> Result<(), &'static str> {
    static ANSWER: OnceLock<Result<(), &'static str>> = OnceLock::new();
    *ANSWER.get_or_init(probe)
}

/// libbpf's probe, kernel ABI only: a trivial program loaded for `uprobe_multi`, then links
/// that must fail early. On `/` (not a regular file) a kernel with `uprobe_multi` answers
/// `EBADF`; with pid -1 on top, one whose process filtering is fixed (6.10, backported; before
/// that it filtered by thread, and other threads of the target would not be seen) answers
/// `EINVAL` before looking at the path.
fn probe() -> Result<(), &'static str> {
    // r0 = 0; exit
    let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
    let license = c"GPL";
    let load = ProgLoad {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        expected_attach_type: BPF_TRACE_UPROBE_MULTI,
        ..Default::default()
    };
    let prog =
        bpf(BPF_PROG_LOAD, &load).map_err(|_| "the kernel refused a uprobe_multi program")?;
    let link = |pid: u32| {
        let offset = 0u64;
        let attr = LinkCreate {
            prog_fd: prog.as_raw_fd() as u32,
            attach_type: BPF_TRACE_UPROBE_MULTI,
            path: c"/".as_ptr() as u64,
            offsets: &offset as *const u64 as u64,
            cnt: 1,
            pid,
            ..Default::default()
        };
        bpf(BPF_LINK_CREATE, &attr)
            .map(drop)
            .map_err(|e| e.raw_os_error())
    };
    if link(0) != Err(Some(libc::EBADF)) {
        return Err("the kernel has no uprobe_multi links (Linux < 6.6)");
    }
    if link(u32::MAX) != Err(Some(libc::EINVAL)) {
        return Err("the kernel's uprobe_multi links filter by thread, not process (Linux < 6.10)");
    }
    Ok(())
}
