//! This machine's per-hit probe costs, measured once per kernel and CPU and cached: the first
//! daemon on a node pays the ~0.1 s of [`crate::attach::calibrate::measure`] (its own time, not a
//! target's), every later one reads the file. The cache lives in `$TRACEML_CACHE_DIR`, else
//! `/var/cache/traceml`; a cache that cannot be written only means measuring again next time.
use std::path::PathBuf;

use crate::attach::calibrate::{self, Calibration};

/// What the cache file holds: the calibration and what it is valid for.
#[derive(serde::Serialize, serde::Deserialize)]
struct Cached {
    /// `uname -r` and the CPU model: a new kernel or another machine measures again.
    kernel: String,
    cpu: String,
    calibration: Calibration,
}

fn cache_path() -> PathBuf {
    std::env::var_os("TRACEML_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/traceml"))
        .join("calibration.json")
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn cpu() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_owned())
        .unwrap_or_default()
}

/// The cached calibration for this kernel and CPU, else a new measurement (cached); `None` when
/// the measurement fails (the reference cost model is used, and the log says why).
pub fn this_machine() -> Option<Calibration> {
    let (kernel, cpu) = (kernel(), cpu());
    let path = cache_path();
    if let Some(c) = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Cached>(&b).ok())
        .filter(|c| c.kernel == kernel && c.cpu == cpu)
    {
        return Some(c.calibration);
    }
    let calibration = match calibrate::measure() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("per-hit probe costs not measured ({e}): the reference model is used");
            return None;
        }
    };
    tracing::info!(
        "probe costs on this machine: uprobe {:.0} ns, uretprobe {:.0} ns per hit (cached in {})",
        calibration.uprobe_ns,
        calibration.uretprobe_ns,
        path.display()
    );
    let cached = Cached {
        kernel,
        cpu,
        calibration,
    };
    // Written whole then renamed: daemons starting together never read half a file.
    let write = || -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".calibration.{}.tmp", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec_pretty(&cached)?)?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        tracing::debug!("calibration not cached in {}: {e}", path.display());
    }
    Some(calibration)
}
