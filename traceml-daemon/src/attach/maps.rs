//! The target's memory maps (read and parsed by [`crate::host::procinfo`]): which files it maps, where,
//! and which of them matter to us (the Python evaluator, CUDA runtime and driver, torch).
use std::path::{Path, PathBuf};

pub use crate::host::procinfo::Mapping;

/// Parses the text of a maps file (see [`crate::host::procinfo::maps_from`]).
pub fn parse(text: &str) -> Vec<Mapping> {
    crate::host::procinfo::maps_from(text.as_bytes())
}

/// Reads and parses `/proc/<pid>/maps` (see [`crate::host::procinfo::maps`]).
pub fn read(pid: u32) -> std::io::Result<Vec<Mapping>> {
    crate::host::procinfo::maps(pid)
}

/// The distinct file paths, in first-mapped order.
pub fn files(maps: &[Mapping]) -> Vec<PathBuf> {
    // A torch process maps thousands of regions; compared as bytes (a `Path` compares component
    // by component) and hashed, once per scan of the maps.
    let mut seen: std::collections::HashSet<&[u8]> = std::collections::HashSet::new();
    let mut out: Vec<PathBuf> = Vec::new();
    for m in maps {
        if seen.insert(m.path.as_os_str().as_encoded_bytes()) {
            out.push(m.path.clone());
        }
    }
    out
}

/// The lowest address at which `path` is mapped with file offset 0 (the ELF load base before
/// the first segment's virtual address is subtracted).
pub fn base_of(maps: &[Mapping], path: &Path) -> Option<u64> {
    maps.iter()
        .filter(|m| m.path == path && m.offset == 0)
        .map(|m| m.start)
        .min()
}

/// What role a mapped file plays for us, by its file name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// `libpython3.X.so*` or a `python3.X` executable: may hold the frame evaluator.
    Python,
    /// `libcudart.so*`: the CUDA runtime.
    CudaRuntime,
    /// `libcuda.so*`: the CUDA driver.
    CudaDriver,
    /// `libtorch*.so*`: torch's native libraries (its training markers).
    Torch,
    /// `libc10.so`: torch's core (grad mode); held back with the CUDA libraries while the
    /// daemon only watches for training (an inference server switches grad mode per request).
    TorchCore,
    /// `libnccl.so*`: NCCL's collectives.
    Nccl,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Python => "python",
            Role::CudaRuntime => "cudart",
            Role::CudaDriver => "cuda_driver",
            Role::Torch => "torch",
            Role::TorchCore => "torch_core",
            Role::Nccl => "nccl",
        }
    }
}

/// Classifies a mapped file by its name, a wheel's hash in it ignored
/// (`libcudart-1a2b3c4d.so.13`, as auditwheel renames the libraries it bundles, is a runtime).
pub fn role_of(path: &Path) -> Option<Role> {
    let name = unhashed(path.file_name()?.to_str()?);
    let name = name.as_ref();
    if name.starts_with("libcudart.so") {
        Some(Role::CudaRuntime)
    } else if name.starts_with("libcuda.so") {
        Some(Role::CudaDriver)
    } else if name.starts_with("libtorch") && name.contains(".so") {
        Some(Role::Torch)
    } else if name.starts_with("libc10.so") {
        Some(Role::TorchCore)
    } else if name.starts_with("libnccl.so") {
        Some(Role::Nccl)
    } else if name.starts_with("libpython3") && name.contains(".so") {
        Some(Role::Python)
    } else {
        None
    }
}

/// `name` without a `-<hash>` before its `.so` (8 or more hex digits, as auditwheel and
/// similar tools rename the libraries they bundle).
fn unhashed(name: &str) -> std::borrow::Cow<'_, str> {
    if let Some(so) = name.find(".so")
        && let Some(dash) = name[..so].rfind('-')
    {
        let hash = &name[dash + 1..so];
        if hash.len() >= 8 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return format!("{}{}", &name[..dash], &name[so..]).into();
        }
    }
    name.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d4c8a00000-55d4c8a01000 r--p 00000000 fe:01 123 /usr/bin/python3.11
55d4c8a01000-55d4c8a02000 r-xp 00001000 fe:01 123 /usr/bin/python3.11
7f00aa000000-7f00aa100000 r--p 00000000 fe:01 456 /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0
7f00aa100000-7f00aa300000 r-xp 00100000 fe:01 456 /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0
7f00bb000000-7f00bb010000 r-xp 00000000 fe:01 789 /opt/my libs/libcudart.so.12
7f00cc000000-7f00cc001000 rw-p 00000000 00:00 0
7f00dd000000-7f00dd001000 r-xp 00000000 fe:01 790 /tmp/gone.so (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn parses_file_mappings_only() {
        let maps = parse(MAPS);
        assert_eq!(maps.len(), 5);
        assert_eq!(maps[4].path, PathBuf::from("/opt/my libs/libcudart.so.12"));
        assert_eq!(maps[3].offset, 0x100000);
        assert_eq!(files(&maps).len(), 3);
    }

    #[test]
    fn base_is_offset_zero_mapping() {
        let maps = parse(MAPS);
        let lib = PathBuf::from("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0");
        assert_eq!(base_of(&maps, &lib), Some(0x7f00aa000000));
    }

    #[test]
    fn roles_by_name() {
        assert_eq!(
            role_of(Path::new("/x/libcudart.so.13")),
            Some(Role::CudaRuntime)
        );
        // Renamed by a wheel's repair tool: the same libraries.
        assert_eq!(
            role_of(Path::new("/site/torch.libs/libcudart-1a2b3c4d.so.13")),
            Some(Role::CudaRuntime)
        );
        assert_eq!(
            role_of(Path::new("/site/x.libs/libnccl-0f1e2d3c4b.so.2")),
            Some(Role::Nccl)
        );
        assert_eq!(role_of(Path::new("/x/libcudart-plugin.so")), None);
        assert_eq!(
            role_of(Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1")),
            Some(Role::CudaDriver)
        );
        assert_eq!(
            role_of(Path::new("/site/torch/lib/libtorch_python.so")),
            Some(Role::Torch)
        );
        assert_eq!(
            role_of(Path::new("/site/torch/lib/libc10.so")),
            Some(Role::TorchCore)
        );
        assert_eq!(
            role_of(Path::new("/lib/libpython3.9.so.1.0")),
            Some(Role::Python)
        );
        assert_eq!(role_of(Path::new("/lib/libc.so.6")), None);
    }
}
