//! Users from the system's name service, not from /etc/passwd (issue 24): on GPU nodes the users
//! of jobs come from LDAP or SSSD. Here a directory user is made with Debian's
//! `libnss-extrausers` (an NSS module reading `/var/lib/extrausers/passwd`): `serve` runs in a
//! private mount namespace whose `/etc/nsswitch.conf` says `passwd: files extrausers` and whose
//! `/var/lib/extrausers` holds `bob` (uid 4242, absent from /etc/passwd), so nothing of the
//! machine's own configuration changes. A job run as uid 4242 is then
//! - not attached under `exclude_users = ["bob"]` (the log says why, naming bob), and
//! - attached under `include_users = ["bob"]`, its summary naming the user `bob`;
//!
//! with the same job and the same policy through /etc/passwd alone the first would have been
//! attached (bob has no name there) and the second not.
mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

const UID: u32 = 4242;
const NSS_MODULE: &str = "/usr/lib/libnss_extrausers.so.2";
/// A step count no other test uses (the include glob picks this job only).
const STEPS: u32 = 4242;

/// `serve` with `config`, in a mount namespace that knows bob; stderr to `log`.
fn serve_as_directory_node(dir: &Path, config: &str, log: &Path) -> Proc {
    let nss = dir.join("nsswitch.conf");
    std::fs::write(
        &nss,
        "passwd: files extrausers\ngroup: files extrausers\nshadow: files\n",
    )
    .unwrap();
    let extra = dir.join("extrausers");
    std::fs::create_dir_all(&extra).unwrap();
    std::fs::write(
        extra.join("passwd"),
        format!("bob:x:{UID}:{UID}:a directory user:/nonexistent:/usr/sbin/nologin\n"),
    )
    .unwrap();
    std::fs::write(extra.join("group"), format!("bob:x:{UID}:\n")).unwrap();
    std::fs::write(dir.join("config.toml"), config).unwrap();
    let ready = dir.join("ready");
    let _ = std::fs::remove_file(&ready);
    let cmd = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "mount --bind \"$1\" /etc/nsswitch.conf && mount --bind \"$2\" /var/lib/extrausers \
             && shift 2 && exec \"$@\"",
        )
        .arg("sh")
        .arg(&nss)
        .arg(&extra)
        .arg(daemon())
        .arg("serve")
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--config")
        .arg(dir.join("config.toml"))
        .arg("--ready-file")
        .arg(&ready)
        .args(["--window", "60", "--scan-interval", "0.2"])
        .args([
            "--include",
            &format!("*input_bound_single.py --steps {STEPS} *"),
        ])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("unshare");
    let serve = Proc(cmd);
    wait_for("serve's ready file", Duration::from_secs(20), || {
        ready.exists()
    });
    serve
}

/// The ground-truth job, run as uid 4242 with the system's Python (readable by that user). What
/// it runs is copied into the test's scratch directory first: the checkout may lie where uid
/// 4242 cannot read (a clone under `mktemp -d`'s 0700 directory).
fn job_as_bob(dir: &Path) -> Proc {
    let out = dir.join("job");
    std::fs::create_dir_all(&out).unwrap();
    // SAFETY: chmod of a path we made; the job (uid 4242) writes its truth there.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    let code = dir.join("code");
    std::fs::create_dir_all(code.join("workloads")).unwrap();
    for f in ["input_bound_single.py", "groundtruth.py"] {
        std::fs::copy(
            workspace().join("tests/workloads").join(f),
            code.join("workloads").join(f),
        )
        .unwrap();
    }
    // faketorch finds its native half and the stand-in CUDA runtime in ../build.
    for (from, to) in [
        (workspace().join("tests/faketorch"), code.join("faketorch")),
        (tests_build(), code.join("build")),
    ] {
        let st = Command::new("cp")
            .arg("-r")
            .arg(&from)
            .arg(&to)
            .status()
            .expect("cp");
        assert!(
            st.success(),
            "copying {} to {}",
            from.display(),
            to.display()
        );
    }
    // Readable and searchable by every user, whatever the umask.
    let st = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(dir)
        .status()
        .expect("chmod");
    assert!(st.success());
    let cmd = Command::new("setpriv")
        .args([
            "--reuid",
            &UID.to_string(),
            "--regid",
            &UID.to_string(),
            "--clear-groups",
        ])
        .arg("/usr/bin/python3")
        .arg(code.join("workloads/input_bound_single.py"))
        .args([
            "--steps",
            &STEPS.to_string(),
            "--stop-on-sigterm",
            "--truth",
        ])
        .arg(out.join("truth.json"))
        .env("PYTHONPATH", code.join("faketorch"))
        .env("TRACEML_TESTS_BUILD", code.join("build"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("setpriv");
    Proc(cmd)
}

fn log_has(log: &Path, what: &str) -> bool {
    std::fs::read_to_string(log).is_ok_and(|l| l.contains(what))
}

fn sigterm(p: &Proc) {
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(p.0.id() as i32, libc::SIGTERM) };
}

#[test]
fn users_come_from_the_name_service_not_etc_passwd() {
    if !root_or_skip()
        || !tool_or_skip(NSS_MODULE, "libnss-extrausers")
        || !tool_or_skip("/usr/bin/python3", "python3")
    {
        return;
    }
    // The premise: /etc/passwd does not know uid 4242.
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    assert!(
        !passwd.lines().any(|l| l.split(':').nth(2) == Some("4242")),
        "uid {UID} is in /etc/passwd: the test needs a uid only the directory knows"
    );
    let dir = scratch("users");

    // exclude_users = ["bob"]: bob's job is left alone, and the log says so by name.
    let log = dir.join("exclude.log");
    let serve = serve_as_directory_node(&dir, "exclude_users = [\"bob\"]\n", &log);
    let job = job_as_bob(&dir);
    let pid = job.0.id();
    let why = format!("pid {pid} not attached: user {UID} (bob) is excluded");
    wait_for(
        "serve's decision on bob's job",
        Duration::from_secs(30),
        || {
            log_has(&log, &format!("pid {pid} not attached"))
                || log_has(&log, &format!("attaching to pid {pid}"))
        },
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(&why), "{text}");
    assert!(job_dir(&dir.join("state"), pid).is_none(), "{text}");
    sigterm(&job);
    drop(job);
    drop(serve);

    // include_users = ["bob"]: bob's job is the one attached, its summary names bob.
    let log = dir.join("include.log");
    let serve = serve_as_directory_node(&dir, "include_users = [\"bob\"]\n", &log);
    let job = job_as_bob(&dir);
    let pid = job.0.id();
    wait_for(
        "serve attaching to bob's job",
        Duration::from_secs(30),
        || {
            log_has(&log, &format!("attaching to pid {pid}"))
                || log_has(&log, &format!("pid {pid} not attached"))
        },
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(&format!("attaching to pid {pid}")), "{text}");
    std::thread::sleep(Duration::from_secs(2));
    sigterm(&job);
    let mut job = job;
    assert!(job.0.wait().unwrap().success());
    let state = dir.join("state");
    wait_for("bob's job's final summary", Duration::from_secs(10), || {
        job_dir(&state, pid).is_some_and(|d| d.join("final_summary.json").exists())
    });
    let s: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(job_dir(&state, pid).unwrap().join("final_summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(s["target"]["identity"]["user"], "bob", "{:#}", s["target"]);
    assert_eq!(s["target"]["identity"]["uid"], UID, "{:#}", s["target"]);
    sigterm(&serve);
    let mut serve = serve;
    let status = wait_with_timeout_status(&mut serve, Duration::from_secs(15));
    assert!(status.success(), "serve: {status}");
}

fn wait_with_timeout_status(p: &mut Proc, timeout: Duration) -> std::process::ExitStatus {
    let t = std::time::Instant::now();
    loop {
        if let Some(s) = p.0.try_wait().unwrap() {
            return s;
        }
        assert!(t.elapsed() < timeout, "still running after {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
