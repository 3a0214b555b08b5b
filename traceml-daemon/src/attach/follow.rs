//! Following the CUDA driver's function pointers. The runtime, and every library that carries
//! its own copy of it (cuBLAS, cuDNN, NCCL), takes its driver entry points from
//! `cuGetProcAddress` and calls them through those pointers, never by link. Where a pointer is
//! the exported function's address, the driver's probes already see the calls; where the
//! driver hands out another entry point (an internal implementation, a tool's wrapper), the
//! probe of that entry point goes on the pointer, found in whatever file holds it.
//!
//! The probe on `cuGetProcAddress`'s return reports each pointer (the kernel's
//! `ProcAddress` event); the live loop calls [`Attacher::follow`] for it within a poll. A
//! pointer handed out before the daemon attached is not seen: docs/gpu-validation.md.
use std::path::{Path, PathBuf};

use super::maps::Mapping;
use super::specs::{CUDA_DRIVER, Matcher, ProbeSpec};
use super::{Attacher, ElfFile, Placed, python};

/// One pointer followed: a probe placed on a driver entry point that is not an export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Followed {
    /// The entry point asked for (`cuLaunchKernel`).
    pub name: String,
    /// The file holding the code it points to, as the target names it.
    pub path: PathBuf,
    /// Its file offset.
    pub offset: u64,
}

/// The name without the version and default-stream suffixes `cuGetProcAddress` resolves
/// itself (asked for `cuMemcpyHtoDAsync`, it hands out `_v2`; with the per-thread flag, `_ptsz`).
fn base(name: &str) -> &str {
    let mut n = name;
    for suffix in ["_ptsz", "_ptds", "_v2", "_v3"] {
        n = n.strip_suffix(suffix).unwrap_or(n);
    }
    n
}

/// The driver probe for an entry point asked for by `name`, and every exported name it goes by.
pub fn driver_spec(name: &str) -> Option<(&'static ProbeSpec, Vec<&'static str>)> {
    let want = base(name);
    let names: Vec<(&'static ProbeSpec, &'static str)> = CUDA_DRIVER
        .iter()
        .filter(|s| s.entry != "procaddr_enter")
        .filter_map(|s| match s.matcher {
            Matcher::Exact(n) if base(n) == want => Some((s, n)),
            _ => None,
        })
        .collect();
    let (spec, _) = names.first()?;
    Some((spec, names.iter().map(|(_, n)| *n).collect()))
}

/// The file and file offset `ptr` falls in, from the target's executable mappings.
pub fn locate(mappings: &[Mapping], ptr: u64) -> Option<(&Path, u64)> {
    mappings
        .iter()
        .find(|m| m.perms.contains('x') && m.start <= ptr && ptr < m.end)
        .map(|m| (m.path.as_path(), ptr - m.start + m.offset))
}

impl Attacher {
    /// `cuGetProcAddress` handed out `ptr` for `name`: places the probe of that entry point
    /// there, unless it is not one the daemon probes, it is an exported function's address
    /// (probed already) or it was followed before. `Ok(None)` when nothing was placed.
    pub fn follow(
        &mut self,
        name: &str,
        ptr: u64,
        mappings: &[Mapping],
    ) -> Result<Option<Followed>, String> {
        let Some((spec, exports)) = driver_spec(name) else {
            return Ok(None);
        };
        let Some((path, offset)) = locate(mappings, ptr) else {
            return Err(format!(
                "{name}: the pointer {ptr:#x} is in no executable file mapping"
            ));
        };
        let key = (path.to_path_buf(), offset);
        if self.followed.contains(&key) {
            return Ok(None);
        }
        let host = python::host_path(self.pid.get(), path);
        let file = ElfFile::open(&host).map_err(|e| e.to_string())?;
        // The export's own address: its probe is placed already (where the driver was probed).
        for n in exports {
            if let Ok(Some(sym)) = file.find(|s| s == n)
                && file.file_offset(sym.addr) == Some(offset)
            {
                self.followed.insert(key);
                return Ok(None);
            }
        }
        let site = file
            .site_at(offset)
            .map_err(|e| format!("{name} at {}+{offset:#x}: {e}", path.display()))?;
        let links = self.place(spec, &host, site)?;
        for l in links {
            match l {
                Placed::Multi(l) => self.links.push(l),
                Placed::Perf(..) => self.perf_links += 1,
            }
        }
        self.followed.insert(key);
        Ok(Some(Followed {
            name: name.to_owned(),
            path: path.to_path_buf(),
            offset,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use traceml_common::ProbeId;

    #[test]
    fn entry_points_are_found_by_the_name_asked_for() {
        let (spec, names) = driver_spec("cuLaunchKernel").unwrap();
        assert_eq!(spec.probe, ProbeId::CuLaunchKernel);
        assert_eq!(names, ["cuLaunchKernel", "cuLaunchKernel_ptsz"]);
        let (spec, _) = driver_spec("cuMemcpyHtoDAsync").unwrap();
        assert_eq!(spec.probe, ProbeId::CuMemcpyHtoDAsync);
        assert_eq!(
            driver_spec("cuLaunchCooperativeKernel").unwrap().0.probe,
            ProbeId::CuLaunchCooperativeKernel
        );
        // Not probed, and never the probe of cuGetProcAddress itself.
        assert!(driver_spec("cuMemAlloc").is_none());
        assert!(driver_spec("cuGetProcAddress").is_none());
    }

    #[test]
    fn a_pointer_is_located_in_its_file() {
        let maps = super::super::maps::parse(
            "7f0000000000-7f0000001000 r--p 00000000 fe:01 1 /usr/lib/libcuda.so.1\n\
             7f0000001000-7f0000009000 r-xp 00001000 fe:01 1 /usr/lib/libcuda.so.1\n",
        );
        assert_eq!(
            locate(&maps, 0x7f0000001234),
            Some((Path::new("/usr/lib/libcuda.so.1"), 0x1234))
        );
        assert_eq!(locate(&maps, 0x7f0000000010), None);
    }
}
