//! Who calls the CUDA driver: the text ranges that tell a driver launch's path in the kernel
//! ([`traceml_common::CallerRanges`]). A driver launch returning into a CUDA runtime's text is
//! that runtime launch's own driver call; into a library that carries its own static copy of the
//! runtime (cuBLAS, cuDNN, NCCL as PyPI ships them: they import no `cu*` symbol, open
//! `libcuda.so.1` themselves and take every driver entry point from `cuGetProcAddress`) it is
//! that library's launch; anywhere else the driver was called directly (Triton's launcher).
//!
//! Libraries are told by what they are, not by name: a runtime by its role (soname or hashed
//! file name: [`super::maps::role_of`]), a library with its own runtime by its contents — it
//! imports no CUDA runtime or driver symbol, and its read-only data holds both
//! `libcuda.so.1` and `cuGetProcAddress` (what the static runtime opens and asks for).
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender};

use traceml_common::{CALLER_RANGES, CallerRanges, LaunchPath};

use super::maps::{self, Mapping, Role};
use super::{AttachError, Attacher, ElfFile, python};

/// A scanner's answer: the file, and whether it carries its own runtime.
type Answer = (PathBuf, bool);

/// What the attacher knows of the files it looked at for the caller ranges.
#[derive(Default)]
pub struct Callers {
    /// File → it carries its own runtime (a library the path `Library` names).
    own_runtime: HashMap<PathBuf, bool>,
    /// Files a scanner thread is reading (a real torch process maps hundreds of megabytes of
    /// CUDA libraries: seconds of reading, never on the attach's or the loop's path).
    scanning: std::collections::HashSet<PathBuf>,
    /// The scanners' answers.
    answers: Option<(Sender<Answer>, Receiver<Answer>)>,
    /// The ranges last written to the kernel.
    written: Vec<(u64, u64, u32)>,
    /// The attach's look waited for its scanner already (later looks take what has come).
    waited: bool,
}

/// How long [`Attacher::update_callers`] waits for its scanner (the stand-ins' files take
/// milliseconds; a real CUDA wheel's, seconds: those answers come at a later look).
const SCAN_WAIT: std::time::Duration = std::time::Duration::from_millis(300);

/// Files scanned by any attacher of this daemon, by identity (device, inode, size, mtime): the
/// ranks of a job map the same libraries. Held while scanning, so parallel attaches read each
/// file once.
static SCANNED: std::sync::Mutex<Option<HashMap<FileId, bool>>> = std::sync::Mutex::new(None);

/// A file's identity: device, inode, size, modification time.
type FileId = (u64, u64, u64, i64);

/// [`carries_own_runtime`] of the file at `host`, read once per daemon.
fn scanned(host: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let key = std::fs::metadata(host)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.size(), m.mtime()));
    let mut cache = SCANNED.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(own) = key.and_then(|k| cache.get(&k).copied()) {
        return own;
    }
    let own = ElfFile::open(host).is_ok_and(|f| carries_own_runtime(&f));
    if let Some(k) = key {
        cache.insert(k, own);
    }
    own
}

/// Whether an ELF file carries its own copy of the CUDA runtime (see the module's text).
pub fn carries_own_runtime(file: &ElfFile) -> bool {
    let cuda_import = |n: &str| {
        n.starts_with("cuda") || (n.starts_with("cu") && n[2..].starts_with(char::is_uppercase))
    };
    matches!(file.imports(cuda_import), Ok(false))
        && matches!(
            file.rodata_holds_all(&[b"libcuda.so.1\0", b"cuGetProcAddress"]),
            Ok(true)
        )
}

/// The executable ranges of `mappings` that decide a driver launch's path, given which files
/// carry their own runtime (`own`): runtimes' text `Nested`, the others' `Library`; at most
/// [`CALLER_RANGES`], runtimes first.
pub fn ranges(mappings: &[Mapping], own: impl Fn(&Path) -> bool) -> Vec<(u64, u64, u32)> {
    let mut out: Vec<(u64, u64, u32)> = mappings
        .iter()
        .filter(|m| m.perms.contains('x'))
        .filter_map(|m| {
            let path = if maps::role_of(&m.path) == Some(Role::CudaRuntime) {
                LaunchPath::Nested
            } else if own(&m.path) {
                LaunchPath::Library
            } else {
                return None;
            };
            Some((m.start, m.end, path as u32))
        })
        .collect();
    out.sort_by_key(|r| (r.2, r.0));
    out.truncate(CALLER_RANGES);
    out
}

impl Attacher {
    /// Whether `mappings` hold a file [`Attacher::update_callers`] has not looked at.
    pub fn callers_pending(&self, mappings: &[Mapping]) -> bool {
        !self.callers.scanning.is_empty()
            || mappings
                .iter()
                .any(|m| m.perms.contains('x') && !self.callers.own_runtime.contains_key(&m.path))
    }

    /// Looks at the executable files of `mappings` not seen before (their contents on a scanner
    /// thread, waited for up to [`SCAN_WAIT`] at the first call, the attach's; later answers at
    /// a later call) and writes the
    /// caller ranges to the kernel when they changed; returns the libraries newly found to
    /// carry their own runtime.
    pub fn update_callers(&mut self, mappings: &[Mapping]) -> Result<Vec<PathBuf>, AttachError> {
        let pid = self.pid.get();
        let c = &mut self.callers;
        let (tx, _) = c.answers.get_or_insert_with(std::sync::mpsc::channel);
        let mut batch = Vec::new();
        for m in mappings.iter().filter(|m| m.perms.contains('x')) {
            if c.own_runtime.contains_key(&m.path) || c.scanning.contains(&m.path) {
                continue;
            }
            // Files with a role of their own are the runtime, the driver, torch or Python.
            if maps::role_of(&m.path).is_some() {
                c.own_runtime.insert(m.path.clone(), false);
            } else {
                c.scanning.insert(m.path.clone());
                batch.push((m.path.clone(), python::host_path(pid, &m.path)));
            }
        }
        if !batch.is_empty() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for (path, host) in batch {
                    if tx.send((path, scanned(&host))).is_err() {
                        return;
                    }
                }
            });
        }
        let mut found = Vec::new();
        // Only the attach's look waits: the loop's never block on a scan.
        let wait = if c.waited {
            std::time::Duration::ZERO
        } else {
            SCAN_WAIT
        };
        c.waited = true;
        let deadline = std::time::Instant::now() + wait;
        if let Some((_, rx)) = &c.answers {
            while !c.scanning.is_empty() {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let Ok((path, own)) = rx.recv_timeout(left) else {
                    break;
                };
                c.scanning.remove(&path);
                if own {
                    found.push(path.clone());
                }
                c.own_runtime.insert(path, own);
            }
        }
        let known = &c.own_runtime;
        let ranges = ranges(mappings, |p| known.get(p).copied().unwrap_or(false));
        if ranges != c.written {
            self.write_callers(&ranges)?;
            self.callers.written = ranges;
        }
        Ok(found)
    }

    fn write_callers(&mut self, ranges: &[(u64, u64, u32)]) -> Result<(), AttachError> {
        let mut v = CallerRanges::empty();
        for (i, &(start, end, path)) in ranges.iter().take(CALLER_RANGES).enumerate() {
            v.start[i] = start;
            v.end[i] = end;
            v.path[i] = path;
            v.len = i as u32 + 1;
        }
        let map = self
            .ebpf
            .map_mut("CALLERS")
            .ok_or(AttachError::NoMap("CALLERS"))?;
        let mut a = aya::maps::Array::<_, CallerRanges>::try_from(map).map_err(AttachError::Map)?;
        a.set(0, v, 0).map_err(AttachError::Map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_and_own_runtime_libraries_make_the_ranges() {
        let maps = maps::parse(
            "\
7f0000000000-7f0000001000 r--p 00000000 fe:01 1 /v/nvidia/cu13/lib/libcudart-1a2b3c4d.so.13
7f0000001000-7f0000009000 r-xp 00001000 fe:01 1 /v/nvidia/cu13/lib/libcudart-1a2b3c4d.so.13
7f1000000000-7f1000100000 r-xp 00000000 fe:01 2 /v/nvidia/cu13/lib/libcublasLt.so.13
7f2000000000-7f2000100000 r-xp 00000000 fe:01 3 /v/torch/lib/libtorch_cuda.so
7f3000000000-7f3000100000 rw-p 00000000 fe:01 2 /v/nvidia/cu13/lib/libcublasLt.so.13
",
        );
        let own = |p: &Path| p.ends_with("libcublasLt.so.13");
        assert_eq!(
            ranges(&maps, own),
            [
                (0x7f0000001000, 0x7f0000009000, LaunchPath::Nested as u32),
                (0x7f1000000000, 0x7f1000100000, LaunchPath::Library as u32),
            ]
        );
    }
}
