//! The Kubernetes manifests (`packaging/kubernetes/`): each field the daemon needs, checked
//! against what the daemon and the rest of the packaging say, not against copies of it: the
//! ConfigMap's config passes the daemon's own `serve --check-config`; the DaemonSet's
//! capabilities are the systemd unit's bounding set; the probe, Service and ServiceMonitor use
//! the port the config binds; the image tag is the crate's version.
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes")
}

fn load(name: &str) -> Value {
    let p = dir().join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("not a list: {v:?}"))
        .iter()
        .map(|x| s(x).to_owned())
        .collect()
}

/// `CapabilityBoundingSet=` of the repository's systemd unit, without the `CAP_` prefix.
fn unit_capabilities() -> Vec<String> {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/traceml-daemon.service"),
    )
    .unwrap();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit's CapabilityBoundingSet");
    line.split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_owned())
        .collect()
}

#[test]
fn the_manifests_give_the_daemon_what_it_needs() {
    let kustom = load("kustomization.yaml");
    let mut listed = strings(&kustom["resources"]);
    listed.sort();
    let mut files: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    files.sort();
    assert_eq!(listed, files, "kustomization.yaml lists every manifest");

    let cm = load("configmap.yaml");
    let ds = load("daemonset.yaml");
    let svc = load("service.yaml");
    let sm = load("servicemonitor.yaml");
    let ns = s(&load("namespace.yaml")["metadata"]["name"]).to_owned();
    for m in [&cm, &ds, &svc, &sm] {
        assert_eq!(s(&m["metadata"]["namespace"]), ns, "{:?}", m["kind"]);
    }

    // The config: valid for the daemon itself, and what the other manifests assume.
    let config = s(&cm["data"]["config.toml"]).to_owned();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("config.toml");
    std::fs::write(&file, &config).unwrap();
    let out = Command::new(support::daemon())
        .args(["serve", "--check-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "serve --check-config: {said}");
    let toml: toml::Table = config.parse().unwrap();
    let addr = toml["metrics_addr"].as_str().expect("metrics_addr");
    let port: u64 = addr.rsplit(':').next().unwrap().parse().unwrap();
    assert!(
        addr.starts_with("0.0.0.0:"),
        "reachable from the pod network: {addr}"
    );
    let state_dir = toml["state_dir"].as_str().expect("state_dir");

    // The DaemonSet.
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(
        spec["hostPID"].as_bool(),
        Some(true),
        "hostPID: the node's processes"
    );
    assert!(
        spec["nodeSelector"]
            .as_mapping()
            .is_some_and(|m| !m.is_empty()),
        "a node selector for GPU nodes"
    );
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    assert_eq!(ds["spec"]["selector"]["matchLabels"], *labels);
    let c = &spec["containers"][0];
    assert_eq!(
        s(&c["image"]),
        format!("traceml-daemon:{}", env!("CARGO_PKG_VERSION")),
        "the tag `cargo xtask image` builds"
    );
    let args = strings(&c["args"]);
    assert_eq!(args[0], "serve");
    let cfg_path = &args[args.iter().position(|a| a == "--config").unwrap() + 1];
    let caps = strings(&c["securityContext"]["capabilities"]["add"]);
    for need in unit_capabilities() {
        assert!(
            caps.contains(&need),
            "capability {need} of the unit: {caps:?}"
        );
    }
    assert_eq!(
        strings(&c["securityContext"]["capabilities"]["drop"]),
        ["ALL"]
    );
    let ports = c["ports"].as_sequence().unwrap();
    let metrics = ports
        .iter()
        .find(|p| s(&p["name"]) == "metrics")
        .expect("a port named metrics");
    assert_eq!(
        metrics["containerPort"].as_u64(),
        Some(port),
        "the config's metrics_addr"
    );
    let probe = &c["livenessProbe"]["httpGet"];
    assert_eq!(s(&probe["path"]), "/metrics");
    assert_eq!(s(&probe["port"]), "metrics");
    for r in ["requests", "limits"] {
        for k in ["cpu", "memory"] {
            assert!(c["resources"][r][k].as_str().is_some(), "resources.{r}.{k}");
        }
    }
    // Volumes: the config from the ConfigMap at --config's directory, the state on a host path
    // at the config's state_dir, the host's /sys.
    let mounts = c["volumeMounts"].as_sequence().unwrap();
    let volumes = spec["volumes"].as_sequence().unwrap();
    let volume = |at: &str| -> &Value {
        let m = mounts
            .iter()
            .find(|m| s(&m["mountPath"]) == at)
            .unwrap_or_else(|| panic!("nothing mounted at {at}"));
        volumes
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap_or_else(|| panic!("no volume {:?}", m["name"]))
    };
    let cfg_dir = Path::new(cfg_path).parent().unwrap().to_str().unwrap();
    assert_eq!(
        s(&volume(cfg_dir)["configMap"]["name"]),
        s(&cm["metadata"]["name"])
    );
    assert!(
        volume(state_dir)["hostPath"]["path"].as_str().is_some(),
        "state on the node"
    );
    assert_eq!(s(&volume("/sys")["hostPath"]["path"]), "/sys");

    // The Service selects the DaemonSet's pods and serves the metrics port.
    for (k, v) in svc["spec"]["selector"].as_mapping().unwrap() {
        assert_eq!(&labels[k], v, "Service selector {k:?}");
    }
    let sp = &svc["spec"]["ports"][0];
    assert_eq!(sp["port"].as_u64(), Some(port));
    assert_eq!(s(&sp["targetPort"]), "metrics");
    // The ServiceMonitor selects the Service and scrapes its port.
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_mapping().unwrap() {
        assert_eq!(
            &svc["metadata"]["labels"][k], v,
            "ServiceMonitor selector {k:?}"
        );
    }
    assert_eq!(s(&sm["spec"]["endpoints"][0]["port"]), s(&sp["name"]));
    assert_eq!(s(&sm["spec"]["endpoints"][0]["path"]), "/metrics");
}
