//! Which job a target is, as a node operator names it: its user, its container (runtime and
//! id) and Kubernetes pod, or the systemd unit it runs in. Read from `/proc/<pid>/cgroup`, the
//! target's owner (named by the system's name service, [`crate::host::users`]) and, for a pod's name
//! and namespace, its environment.
//!
//! The cgroup path carries the container id and the pod's UID under every common runtime and
//! cgroup driver, cgroup v1 or v2:
//!
//! | runtime, driver | path (v2, or a v1 hierarchy's) |
//! |---|---|
//! | Docker, systemd | `/system.slice/docker-<id>.scope` |
//! | Docker, cgroupfs | `/docker/<id>` |
//! | Kubernetes + containerd, systemd | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope` |
//! | Kubernetes, cgroupfs | `/kubepods/burstable/pod<uid>/<id>` |
//! | Kubernetes + CRI-O | `.../kubepods-besteffort-pod<uid>.slice/crio-<id>.scope` |
//! | Podman | `.../libpod-<id>.scope` (or `/libpod_parent/libpod-<id>`) |
//! | no container | `/user.slice/user-1000.slice/session-3.scope`, `/system.slice/train.service` |
//!
//! A pod's name and namespace are not in the path: they come from the target's environment
//! (`POD_NAME`/`POD_NAMESPACE` when the pod spec passes them through the downward API, else
//! `HOSTNAME`, which Kubernetes sets to the pod's name). [`of`] reads; the rest is pure.
use crate::event::Identity;
use crate::host::procinfo;
use crate::sanitize;

/// The identity of process `pid` (whatever of it can be read).
pub fn of(pid: u32) -> Identity {
    let uid = procinfo::uid(pid);
    let user = uid.and_then(crate::host::users::name_of);
    let env: Vec<(String, String)> = procinfo::environ(pid)
        .map(|e| {
            ["POD_NAME", "POD_NAMESPACE", "HOSTNAME"]
                .into_iter()
                .filter_map(|k| {
                    let v = e.get(std::ffi::OsStr::new(k))?;
                    Some((k.to_owned(), v.to_string_lossy().into_owned()))
                })
                .collect()
        })
        .unwrap_or_default();
    identify(
        &procinfo::cgroup_file(pid).unwrap_or_default(),
        uid,
        user,
        &env,
    )
}

/// The identity from `/proc/<pid>/cgroup`'s text, the target's uid and user name, and its
/// environment variables (`(name, value)` pairs).
pub fn identify(
    cgroup_file: &str,
    uid: Option<u32>,
    user: Option<String>,
    env: &[(String, String)],
) -> Identity {
    let path = cgroup_path(cgroup_file);
    let mut id = Identity {
        uid,
        user,
        ..from_cgroup_path(path.unwrap_or(""))
    };
    id.cgroup = path
        .filter(|p| !p.is_empty() && *p != "/")
        .map(|p| sanitize::bounded(p, sanitize::NAME_MAX).into_owned());
    if id.pod_uid.is_some() {
        let var = |k: &str| {
            env.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| sanitize::bounded(v, 253).into_owned())
                .filter(|v| !v.is_empty())
        };
        id.pod_name = var("POD_NAME").or_else(|| var("HOSTNAME"));
        id.pod_namespace = var("POD_NAMESPACE");
    }
    id
}

/// The path that names the process's place: the first line (v2 `0::/...` or a v1 hierarchy)
/// that holds a container or a pod, else the v2 path, else the first v1 path that is not `/`
/// (hybrid hosts list a v2 line of `/` beside the v1 hierarchies).
pub fn cgroup_path(file: &str) -> Option<&str> {
    let paths: Vec<(bool, &str)> = file
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let (hier, controllers, path) = (it.next()?, it.next()?, it.next()?);
            Some((hier == "0" && controllers.is_empty(), path))
        })
        .collect();
    let named = |p: &str| {
        let id = from_cgroup_path(p);
        id.container_id.is_some() || id.pod_uid.is_some()
    };
    paths
        .iter()
        .find(|(_, p)| named(p))
        .or_else(|| paths.iter().find(|(v2, p)| *v2 && *p != "/"))
        .or_else(|| paths.iter().find(|(_, p)| *p != "/"))
        .map(|(_, p)| *p)
}

/// What a cgroup path says: container runtime and id, pod UID, systemd unit.
pub fn from_cgroup_path(path: &str) -> Identity {
    let mut id = Identity::default();
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        let part = part.strip_suffix(".scope").unwrap_or(part);
        // `<prefix>-<id>` (systemd driver) names the runtime.
        for (prefix, runtime) in [
            ("docker-", "docker"),
            ("cri-containerd-", "containerd"),
            ("crio-", "cri-o"),
            ("libpod-", "podman"),
            ("containerd-", "containerd"),
        ] {
            if let Some(rest) = part.strip_prefix(prefix)
                && is_container_id(rest)
            {
                id.container_runtime = Some(runtime.into());
                id.container_id = Some(rest.into());
            }
        }
        // cgroupfs driver: a bare id under `docker/` or a pod directory.
        if id.container_id.is_none() && is_container_id(part) && i > 0 {
            let parent = parts[i - 1];
            id.container_id = Some(part.into());
            id.container_runtime = if parent == "docker" {
                Some("docker".into())
            } else if parent.starts_with("pod") {
                // The kubelet's cgroupfs layout does not say which runtime.
                None
            } else {
                Some("unknown".into())
            };
        }
        if let Some(uid) = pod_uid(part) {
            id.pod_uid = Some(uid);
        }
        if part.ends_with(".service") || (parts[i].ends_with(".scope") && id.container_id.is_none())
        {
            id.unit = Some(parts[i].to_owned());
        }
    }
    if id.container_id.is_some() {
        id.unit = None;
    }
    id
}

/// A container id: 64 lowercase hex digits (Docker, containerd, CRI-O, Podman).
fn is_container_id(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The pod UID in a kubelet cgroup name: `pod<uid>` (cgroupfs) or
/// `kubepods-<qos>-pod<uid with _ for ->.slice` (systemd), as `xxxxxxxx-xxxx-...`.
fn pod_uid(part: &str) -> Option<String> {
    let part = part.strip_suffix(".slice").unwrap_or(part);
    let at = part.rfind("pod")?;
    if at > 0 && !part[..at].ends_with('-') {
        return None;
    }
    let uid = part[at + 3..].replace('_', "-");
    let groups: Vec<usize> = uid.split('-').map(str::len).collect();
    let hex = uid.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit());
    (hex && groups == [8, 4, 4, 4, 12]).then(|| uid.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1c2b3d4e5f60718293a4b5c6d7e8f90123456789abcdef0123456789abcdef";

    #[test]
    fn docker_under_both_drivers_and_both_versions() {
        let v2_systemd = format!("0::/system.slice/docker-{ID}.scope\n");
        let v2_cgroupfs = format!("0::/docker/{ID}\n");
        let v1 = format!(
            "12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n"
        );
        for file in [v2_systemd, v2_cgroupfs, v1] {
            let id = identify(&file, Some(0), Some("root".into()), &[]);
            assert_eq!(id.container_runtime.as_deref(), Some("docker"), "{file}");
            assert_eq!(id.container_id.as_deref(), Some(ID));
            assert_eq!((id.pod_uid, id.unit), (None, None));
        }
    }

    #[test]
    fn kubernetes_pods() {
        let env = [
            ("HOSTNAME".to_owned(), "trainer-0".to_owned()),
            ("POD_NAMESPACE".to_owned(), "ml".to_owned()),
        ];
        let containerd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3f9a1b2c_5d6e_4f70_8a9b_0c1d2e3f4a5b.slice/cri-containerd-{ID}.scope\n"
        );
        let id = identify(&containerd, Some(1000), None, &env);
        assert_eq!(id.container_runtime.as_deref(), Some("containerd"));
        assert_eq!(id.container_id.as_deref(), Some(ID));
        assert_eq!(
            id.pod_uid.as_deref(),
            Some("3f9a1b2c-5d6e-4f70-8a9b-0c1d2e3f4a5b")
        );
        assert_eq!(id.pod_name.as_deref(), Some("trainer-0"));
        assert_eq!(id.pod_namespace.as_deref(), Some("ml"));
        let crio = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod3f9a1b2c_5d6e_4f70_8a9b_0c1d2e3f4a5b.slice/crio-{ID}.scope\n"
        );
        assert_eq!(
            identify(&crio, None, None, &[])
                .container_runtime
                .as_deref(),
            Some("cri-o")
        );
        // cgroup v1, cgroupfs driver: the runtime is not named; the pod's name from POD_NAME.
        let v1 = format!(
            "11:cpu,cpuacct:/kubepods/burstable/pod3f9a1b2c-5d6e-4f70-8a9b-0c1d2e3f4a5b/{ID}\n\
             10:memory:/kubepods/burstable/pod3f9a1b2c-5d6e-4f70-8a9b-0c1d2e3f4a5b/{ID}\n"
        );
        let env = [("POD_NAME".to_owned(), "trainer-1".to_owned())];
        let id = identify(&v1, None, None, &env);
        assert_eq!(id.container_id.as_deref(), Some(ID));
        assert_eq!(id.container_runtime, None);
        assert_eq!(
            id.pod_uid.as_deref(),
            Some("3f9a1b2c-5d6e-4f70-8a9b-0c1d2e3f4a5b")
        );
        assert_eq!(id.pod_name.as_deref(), Some("trainer-1"));
    }

    #[test]
    fn podman_systemd_units_and_nothing() {
        let podman = format!(
            "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope\n"
        );
        let id = identify(&podman, None, None, &[]);
        assert_eq!(id.container_runtime.as_deref(), Some("podman"));
        assert_eq!(id.unit, None);
        let session = identify(
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            Some(1000),
            None,
            &[("HOSTNAME".into(), "login-node".into())],
        );
        assert_eq!(session.unit.as_deref(), Some("session-3.scope"));
        assert_eq!(session.container_id, None);
        assert_eq!(
            session.pod_name, None,
            "HOSTNAME is a pod's name only in a pod"
        );
        assert_eq!(
            session.cgroup.as_deref(),
            Some("/user.slice/user-1000.slice/session-3.scope")
        );
        let service = identify("0::/system.slice/train.service\n", None, None, &[]);
        assert_eq!(service.unit.as_deref(), Some("train.service"));
        // Inside a cgroup namespace everything is `/`: nothing known.
        let root = identify("0::/\n", None, None, &[]);
        assert_eq!(root, Identity::default());
        // A hostile path: not an id, bounded.
        let odd = identify(
            &format!("0::/docker-{}.scope\n", "\x1b".repeat(10_000)),
            None,
            None,
            &[],
        );
        assert_eq!(odd.container_id, None);
        assert!(odd.cgroup.unwrap().len() < sanitize::NAME_MAX + 40);
    }

    #[test]
    fn pod_uids() {
        assert_eq!(
            pod_uid("pod3f9a1b2c-5d6e-4f70-8a9b-0c1d2e3f4a5b").as_deref(),
            Some("3f9a1b2c-5d6e-4f70-8a9b-0c1d2e3f4a5b")
        );
        assert_eq!(pod_uid("podman"), None);
        assert_eq!(pod_uid("kubepods-burstable.slice"), None);
    }
}
