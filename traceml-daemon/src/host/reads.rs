//! What a task blocked in a read is reading, where `/proc` says so: the system call it sleeps in
//! (`/proc/<pid>/syscall`: a `read`, `pread64`, `readv`, `preadv` or `preadv2`, its first argument
//! the descriptor), the file that descriptor names (`/proc/<pid>/fd/<fd>`), what kind of file it
//! is, and the mount that holds it (`/proc/<pid>/mountinfo`: the longest mount point that
//! prefixes the path). Read by the DataLoader workers' sampler when a worker is asleep or in
//! uninterruptible I/O; the parsing is pure and tested on text.
use std::path::Path;

use crate::event::{ReadKind, ReadSite};

/// The read system calls of this architecture.
const READ_CALLS: [libc::c_long; 5] = [
    libc::SYS_read,
    libc::SYS_pread64,
    libc::SYS_readv,
    libc::SYS_preadv,
    libc::SYS_preadv2,
];

/// The descriptor a task sleeping in a read system call reads, from the text of
/// `/proc/<pid>/syscall` (`"0 0x5 0x7f12 0x1000 …"`: the call's number and its arguments);
/// `None` when it runs (`running`), is in no call (`-1 …`) or in another one.
pub fn read_fd_of(syscall: &str) -> Option<i32> {
    let mut fields = syscall.split_whitespace();
    let nr: libc::c_long = fields.next()?.parse().ok()?;
    if !READ_CALLS.contains(&nr) {
        return None;
    }
    let fd = fields.next()?.strip_prefix("0x")?;
    i32::try_from(u64::from_str_radix(fd, 16).ok()?).ok()
}

/// One line of `/proc/<pid>/mountinfo`: (mount point, file-system type, source). Octal escapes
/// (`\040` for a space) are decoded.
pub fn mount_of_line(line: &str) -> Option<(String, String, String)> {
    let (left, right) = line.split_once(" - ")?;
    let point = left.split_whitespace().nth(4)?;
    let mut r = right.split_whitespace();
    let (fs_type, source) = (r.next()?, r.next().unwrap_or(""));
    Some((unescape(point), fs_type.to_owned(), unescape(source)))
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount that holds `path`: the longest mount point that prefixes it (at a `/`), the last
/// such line winning (a mount over another at the same point hides it).
pub fn mount_for<'m>(
    mounts: &'m [(String, String, String)],
    path: &str,
) -> Option<&'m (String, String, String)> {
    let under = |point: &str| {
        point == "/"
            || path == point
            || path
                .strip_prefix(point)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| under(&m.0))
        .max_by_key(|(i, m)| (m.0.len(), *i))
        .map(|(_, m)| m)
}

/// The kind of file a descriptor's link names: `pipe:[…]` and `socket:[…]` by name, else by the
/// file's own type (a named pipe is a pipe).
pub fn kind_of(link: &str, meta: Option<&std::fs::Metadata>) -> ReadKind {
    use std::os::unix::fs::FileTypeExt as _;
    if link.starts_with("pipe:") {
        return ReadKind::Pipe;
    }
    if link.starts_with("socket:") {
        return ReadKind::Socket;
    }
    match meta.map(|m| m.file_type()) {
        Some(t) if t.is_fifo() => ReadKind::Pipe,
        Some(t) if t.is_socket() => ReadKind::Socket,
        Some(t) if t.is_block_device() || t.is_char_device() => ReadKind::Device,
        Some(t) if t.is_file() => ReadKind::File,
        _ => ReadKind::Other,
    }
}

/// What the task `pid` is reading now, if it sleeps in a read (`mounts`: its mount table, from
/// [`mounts`]).
pub fn reading(pid: u32, mounts: &[(String, String, String)]) -> Option<ReadSite> {
    let proc = Path::new("/proc").join(pid.to_string());
    let fd = read_fd_of(&std::fs::read_to_string(proc.join("syscall")).ok()?)?;
    let link_path = proc.join("fd").join(fd.to_string());
    let link = std::fs::read_link(&link_path).ok()?;
    let path = link.to_string_lossy().into_owned();
    let meta = std::fs::metadata(&link_path).ok();
    let kind = kind_of(&path, meta.as_ref());
    let (mount, fs_type, source) = match kind {
        ReadKind::File | ReadKind::Device => mount_for(mounts, &path).cloned().unwrap_or_default(),
        _ => Default::default(),
    };
    Some(ReadSite {
        path,
        kind,
        mount,
        fs_type,
        source,
    })
}

/// The mount table of `pid` (its mount namespace's), one entry per line of its mountinfo.
pub fn mounts(pid: u32) -> Vec<(String, String, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .map(|t| t.lines().filter_map(mount_of_line).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_call_names_its_descriptor() {
        let read = format!(
            "{} 0x5 0x7ffd1000 0x1000 0x0 0x0 0x0 0x7ffd 0x7f01",
            libc::SYS_read
        );
        assert_eq!(read_fd_of(&read), Some(5));
        let pread = format!(
            "{} 0x1c 0x7f 0x10 0x200 0x0 0x0 0x7ffd 0x7f01",
            libc::SYS_pread64
        );
        assert_eq!(read_fd_of(&pread), Some(28));
        assert_eq!(read_fd_of("running"), None);
        assert_eq!(read_fd_of("-1 0x7ffd 0x7f01"), None);
        let poll = format!("{} 0x3 0x1 0x0", libc::SYS_ppoll);
        assert_eq!(read_fd_of(&poll), None);
        assert_eq!(read_fd_of(""), None);
        assert_eq!(read_fd_of(&format!("{} zz", libc::SYS_read)), None);
    }

    #[test]
    fn the_longest_mount_point_holds_the_path() {
        let text = "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    30 22 0:25 / /data rw shared:2 - nfs4 srv:/export rw,vers=4.2\n\
                    31 30 0:26 / /data/cache rw shared:3 - tmpfs tmpfs rw\n\
                    32 22 0:27 / /mnt/my\\040disk rw shared:4 - xfs /dev/sdb1 rw\n\
                    garbage line";
        let mounts: Vec<_> = text.lines().filter_map(mount_of_line).collect();
        assert_eq!(mounts.len(), 4);
        let at = |p: &str| mount_for(&mounts, p).map(|m| (m.0.as_str(), m.1.as_str()));
        assert_eq!(at("/data/train/shard-1.tar"), Some(("/data", "nfs4")));
        assert_eq!(at("/data/cache/x"), Some(("/data/cache", "tmpfs")));
        // A sibling whose name only starts like a mount point is not under it.
        assert_eq!(at("/database/x"), Some(("/", "ext4")));
        assert_eq!(at("/mnt/my disk/a.bin"), Some(("/mnt/my disk", "xfs")));
        assert_eq!(mounts[1].2, "srv:/export");
    }

    #[test]
    fn a_pipe_is_a_pipe_by_name_or_by_type() {
        assert_eq!(kind_of("pipe:[1234]", None), ReadKind::Pipe);
        assert_eq!(kind_of("socket:[99]", None), ReadKind::Socket);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!(kind_of(file.to_str().unwrap(), Some(&meta)), ReadKind::File);
        let fifo = dir.path().join("q");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let meta = std::fs::metadata(&fifo).unwrap();
        assert_eq!(kind_of(fifo.to_str().unwrap(), Some(&meta)), ReadKind::Pipe);
    }
}
