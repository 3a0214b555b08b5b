//! What an ELF executable needs from the system at run time (its interpreter, `DT_NEEDED`
//! libraries, RPATH/RUNPATH and `.gnu.version_r` symbol versions, read with `object`), and
//! what of it keeps the binary from running on an older node: a glibc symbol version newer
//! than the floor, a library outside the base system. `cargo xtask deb` refuses to package
//! such a binary; `traceml-daemon/tests/install.rs` includes this file (`#[path]`) and checks
//! the test build and the installed package's binary with it.

/// The newest glibc symbol version the shipped binary may need: RHEL/Rocky 8's glibc is 2.28
/// (Ubuntu 20.04 has 2.31). The release package's binary is linked against glibc 2.28's
/// symbols with cargo-zigbuild (docs/install.md).
pub const GLIBC_MAX: (u32, u32) = (2, 28);
/// The floor of a build linked on the build machine itself (the dev package `cargo xtask test`
/// installs, `cargo install`): Ubuntu 22.04's glibc is 2.35.
pub const GLIBC_MAX_HOST_BUILD: (u32, u32) = (2, 35);
/// The libraries the binary may link: glibc's and libgcc's, present on every glibc
/// distribution's base system (Debian and Ubuntu: packages libc6 and libgcc-s1).
pub const BASE_LIBS: [&str; 8] = [
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libutil.so.1",
];
pub const INTERPRETER: &str = "/lib64/ld-linux-x86-64.so.2";

use std::path::Path;

/// What an ELF executable needs from the system at run time.
#[derive(Debug, Default)]
pub struct Needs {
    /// `PT_INTERP`.
    pub interpreter: Option<String>,
    /// `DT_NEEDED`.
    pub libs: Vec<String>,
    /// `DT_RPATH` and `DT_RUNPATH`.
    pub search_paths: Vec<String>,
    /// (library, version) from `.gnu.version_r`: what the dynamic loader checks at start.
    pub versions: Vec<(String, String)>,
}

pub fn needs(data: &[u8]) -> object::read::Result<Needs> {
    use object::elf;
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let header = elf::FileHeader64::<object::Endianness>::parse(data)?;
    let endian = header.endian()?;
    let mut n = Needs::default();
    for ph in header.program_headers(endian, data)? {
        if let Some(i) = ph.interpreter(endian, data)? {
            n.interpreter = Some(text(i));
        }
    }
    let sections = header.sections(endian, data)?;
    let dynamic = sections.dynamic_table(endian, data)?;
    for d in &dynamic {
        match d.tag {
            elf::DT_NEEDED => n.libs.push(text(dynamic.string(d)?)),
            elf::DT_RPATH | elf::DT_RUNPATH => n.search_paths.push(text(dynamic.string(d)?)),
            _ => {}
        }
    }
    if let Some((mut verneed, link)) = sections.gnu_verneed(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        while let Some((need, mut aux)) = verneed.next()? {
            let lib = text(need.file(endian, strings)?);
            while let Some(a) = aux.next()? {
                n.versions
                    .push((lib.clone(), text(a.name(endian, strings)?)));
            }
        }
    }
    Ok(n)
}

/// `GLIBC_2.35` → (2, 35), `GLIBC_2.2.5` → (2, 2); anything else (`GLIBC_PRIVATE`) → `None`.
pub fn glibc_version(name: &str) -> Option<(u32, u32)> {
    let mut parts = name.strip_prefix("GLIBC_")?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

pub fn max_glibc(n: &Needs) -> Option<(u32, u32)> {
    n.versions
        .iter()
        .filter_map(|(_, v)| glibc_version(v))
        .max()
}

/// What in `n` keeps the binary from running on a node with glibc `max` and only the base
/// system: one line each, empty when nothing does.
pub fn problems(n: &Needs, max: (u32, u32)) -> Vec<String> {
    let mut out = Vec::new();
    if n.interpreter.as_deref() != Some(INTERPRETER) {
        out.push(format!(
            "interpreter {:?}, not {INTERPRETER}",
            n.interpreter
        ));
    }
    for lib in &n.libs {
        if !BASE_LIBS.contains(&lib.as_str()) {
            out.push(format!("links {lib}, which is not part of the base system"));
        }
    }
    for p in &n.search_paths {
        out.push(format!("searches libraries in {p} (RPATH/RUNPATH)"));
    }
    for (lib, v) in &n.versions {
        let fine = match glibc_version(v) {
            Some(have) => have <= max,
            // libgcc_s's own versions (GCC_3.0 ... GCC_4.2.0) are in every libgcc-s1.
            None => v.starts_with("GCC_") && lib == "libgcc_s.so.1",
        };
        if !fine {
            out.push(format!(
                "needs {v} from {lib} (newest allowed: GLIBC_{}.{})",
                max.0, max.1
            ));
        }
    }
    out
}

/// Reads the executable at `path` and checks it: its needs when it runs on a node with glibc
/// `max` and only the base system, else every problem, one a line. A file in which no libc and
/// no GLIBC version is found is refused too, so what the reader does not understand never
/// passes.
pub fn check(path: &Path, max: (u32, u32)) -> Result<Needs, String> {
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let n = needs(&data).map_err(|e| format!("{}: {e}", path.display()))?;
    if !n.libs.iter().any(|l| l == "libc.so.6") || max_glibc(&n).is_none() {
        return Err(format!(
            "{}: no libc.so.6 or GLIBC version found: {n:?}",
            path.display()
        ));
    }
    let p = problems(&n, max);
    if !p.is_empty() {
        return Err(format!(
            "{} would not run on a node with glibc {}.{} and only the base system:\n{}",
            path.display(),
            max.0,
            max.1,
            p.join("\n")
        ));
    }
    Ok(n)
}

/// `GLIBC_<major>.<minor>` of the newest glibc version `n` needs, for messages.
pub fn newest_glibc(n: &Needs) -> String {
    max_glibc(n).map_or("none".into(), |(a, b)| format!("GLIBC_{a}.{b}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_elf_check_finds_what_older_nodes_lack() {
        assert_eq!(glibc_version("GLIBC_2.2.5"), Some((2, 2)));
        assert_eq!(glibc_version("GLIBC_2.35"), Some((2, 35)));
        assert_eq!(glibc_version("GLIBC_2.36"), Some((2, 36)));
        assert_eq!(glibc_version("GLIBC_PRIVATE"), None);
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let good = || Needs {
            interpreter: Some(INTERPRETER.into()),
            libs: s(&["libc.so.6", "libgcc_s.so.1"]),
            search_paths: Vec::new(),
            versions: vec![
                ("libc.so.6".into(), "GLIBC_2.2.5".into()),
                ("libc.so.6".into(), "GLIBC_2.35".into()),
                ("libgcc_s.so.1".into(), "GCC_4.2.0".into()),
            ],
        };
        assert_eq!(
            problems(&good(), GLIBC_MAX_HOST_BUILD),
            Vec::<String>::new()
        );
        // The shipped floor: GLIBC_2.35 is too new for RHEL 8; GLIBC_2.28 is not.
        let p = problems(&good(), GLIBC_MAX);
        assert!(p.len() == 1 && p[0].contains("GLIBC_2.35"), "{p:?}");
        let mut el8 = good();
        el8.versions[1].1 = "GLIBC_2.28".into();
        assert_eq!(problems(&el8, GLIBC_MAX), Vec::<String>::new());
        let mut newer = good();
        newer
            .versions
            .push(("libc.so.6".into(), "GLIBC_2.36".into()));
        let mut private = good();
        private
            .versions
            .push(("libc.so.6".into(), "GLIBC_PRIVATE".into()));
        let mut lib = good();
        lib.libs.push("libssl.so.3".into());
        let mut rpath = good();
        rpath.search_paths.push("/opt/lib".into());
        let mut interp = good();
        interp.interpreter = Some("/nix/store/ld.so".into());
        for (bad, says) in [
            (newer, "GLIBC_2.36"),
            (private, "GLIBC_PRIVATE"),
            (lib, "libssl.so.3"),
            (rpath, "/opt/lib"),
            (interp, "/nix/store/ld.so"),
        ] {
            let p = problems(&bad, GLIBC_MAX_HOST_BUILD);
            assert!(p.len() == 1 && p[0].contains(says), "{says}: {p:?}");
        }
    }
}
