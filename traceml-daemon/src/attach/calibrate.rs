//! The per-hit cost of a uprobe and a uretprobe on the machine the daemon runs on, measured:
//! the daemon places the programs its probes run (`launch` in count mode: a counter bump, the
//! cheapest entry; `any_exit`: a return probe on a thread with nothing open) on a function of its
//! own and times calls to it with and without them. The overhead estimate scales the cost model
//! (`overhead::CostModel::scaled`) by what this machine's kernel and CPU charge for a probe hit
//! against the machine the model was measured on. One measurement takes ~0.1 s of the daemon's
//! time, none of the target's; the caller caches it per kernel and CPU.
use std::hint::black_box;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Instant;

use aya::EbpfLoader;
use aya::programs::UProbe;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};

use super::multi;

/// Calls per timed pass: ~1 ms without probes, ~15–30 ms with one.
const CALLS: u64 = 20_000;
/// Timed passes of each kind (the fastest is kept: a pass only gets slower when the thread is
/// preempted or interrupted).
const PASSES: usize = 7;

pub use crate::event::Calibration;

// The probed function, in assembly so that its first instruction is one the kernel emulates
// (`push`), as at the sites the daemon probes (`attach::elf`'s `probe_site`): a single-stepped
// first instruction would cost ~10–20 µs a hit and measure something no probe of ours pays.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.traceml_calibration_site, \"ax\", @progbits",
    ".globl traceml_calibration_site",
    ".type traceml_calibration_site, @function",
    "traceml_calibration_site:",
    "push rbp",
    "lea rax, [rdi + rdi * 2]",
    "pop rbp",
    "ret",
    ".size traceml_calibration_site, . - traceml_calibration_site",
    ".popsection",
);

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    fn traceml_calibration_site(x: u64) -> u64;
}

/// A call the compiler cannot remove or inline.
#[cfg(target_arch = "x86_64")]
extern "C" fn calibration_site(x: u64) -> u64 {
    // SAFETY: the assembly above reads only its argument register and the stack it restores.
    unsafe { traceml_calibration_site(x) }
}

/// ns per call of [`calibration_site`] over [`CALLS`] calls.
fn pass() -> f64 {
    let site: extern "C" fn(u64) -> u64 = black_box(calibration_site);
    let t = Instant::now();
    let mut acc = 0u64;
    for i in 0..CALLS {
        acc = acc.wrapping_add(site(i));
    }
    black_box(acc);
    t.elapsed().as_nanos() as f64 / CALLS as f64
}

fn fastest(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::INFINITY, f64::min)
}

/// The file and file offset of [`calibration_site`] in this process, from `/proc/self/maps`.
fn site_location() -> Result<(PathBuf, u64), String> {
    let addr = traceml_calibration_site as *const () as u64;
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| e.to_string())?;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(_perms), Some(offset), Some(_dev), Some(_inode), Some(path)) =
            (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b), Ok(off)) = (
            u64::from_str_radix(a, 16),
            u64::from_str_radix(b, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        if (a..b).contains(&addr) {
            return Ok((PathBuf::from(path), addr - a + off));
        }
    }
    Err("the calibration function is in no file mapping".into())
}

/// Times [`CALLS`] calls with program `name` placed on the site (a return probe when `ret`),
/// ns per call (the fastest of [`PASSES`]); the probe is gone when this returns.
fn with_probe(name: &'static str, ret: bool, host: &PathBuf, offset: u64) -> Result<f64, String> {
    let pid = std::process::id();
    let mut ebpf = EbpfLoader::new()
        .override_global("TARGET_TGID", &pid, true)
        .load(crate::EBPF_OBJECT)
        .map_err(|e| super::error_chain(&e))?;
    let prog: &mut UProbe = ebpf
        .program_mut(name)
        .ok_or_else(|| format!("no program {name}"))?
        .try_into()
        .map_err(|e| super::error_chain(&e))?;
    let timed = || (0..PASSES).map(|_| pass()).collect::<Vec<_>>();
    let times = if multi::supported().is_ok() {
        prog.load_multi().map_err(|e| super::error_chain(&e))?;
        let fd = prog.fd().map_err(|e| super::error_chain(&e))?;
        let link = multi::attach(
            std::os::fd::AsFd::as_fd(fd),
            host,
            &[offset],
            &[0],
            ret,
            pid,
        )
        .map_err(|e| e.to_string())?;
        let t = timed();
        drop(link);
        t
    } else {
        prog.load().map_err(|e| super::error_chain(&e))?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: Some(0),
        };
        let link = prog
            .attach(
                point,
                host,
                UProbeScope::OneProcess(NonZeroU32::new(pid).ok_or("pid 0")?),
            )
            .map_err(|e| super::error_chain(&e))?;
        let t = timed();
        prog.detach(link).map_err(|e| super::error_chain(&e))?;
        t
    };
    Ok(fastest(times))
}

/// Measures this machine's per-hit costs (root or CAP_BPF + CAP_PERFMON, like the attach).
pub fn measure() -> Result<Calibration, String> {
    let (host, offset) = site_location()?;
    // Warm the code and the CPU's frequency before the baseline.
    for _ in 0..PASSES {
        pass();
    }
    let base_before = fastest((0..PASSES).map(|_| pass()).collect());
    let with_entry = with_probe("launch", false, &host, offset)?;
    let with_return = with_probe("any_exit", true, &host, offset)?;
    let base_after = fastest((0..PASSES).map(|_| pass()).collect());
    let base = (base_before + base_after) / 2.0;
    let c = Calibration {
        uprobe_ns: with_entry - base,
        uretprobe_ns: with_return - base,
    };
    // A probe hit costs a trap at least; microseconds mean the passes were preempted.
    let plausible = |ns: f64| (20.0..50_000.0).contains(&ns);
    if !plausible(c.uprobe_ns) || !plausible(c.uretprobe_ns) {
        return Err(format!(
            "implausible calibration (uprobe {:.0} ns, uretprobe {:.0} ns per hit; a busy \
             machine?)",
            c.uprobe_ns, c.uretprobe_ns
        ));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real probes on this process: each hit costs more than nothing and less than a
    /// single-stepped instruction's ~10 µs (root only).
    #[test]
    fn measures_a_probe_hit() {
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("TRACEML_REQUIRE_ROOT").is_none(),
                "TRACEML_REQUIRE_ROOT is set but the test does not run as root"
            );
            return;
        }
        let c = measure().expect("calibration");
        println!("calibration: {c:?}");
        assert!(c.uprobe_ns > 20.0 && c.uprobe_ns < 20_000.0, "{c:?}");
        assert!(c.uretprobe_ns > 20.0 && c.uretprobe_ns < 20_000.0, "{c:?}");
    }

    #[test]
    fn the_site_is_in_this_binary() {
        let (path, offset) = site_location().unwrap();
        assert!(path.exists(), "{}", path.display());
        assert!(offset > 0);
    }
}
