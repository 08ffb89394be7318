//! examples/kubernetes: every path and port the manifests name (probes, PodMonitor endpoints) is
//! served by the binary run with the manifests' own command line, in front of the replay server
//! (node rank 1 for the LeaderWorkerSet's worker: no API there, readiness all the same).
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]
mod common;
mod deploy;
use common::ExpectSuccess;
use deploy::{repo, Deployed};
use serde_json::Value;
use std::process::Command;

/// The manifest's documents, as JSON (PyYAML: anchors and aliases resolved as kubectl does).
fn manifest(name: &str) -> Vec<Value> {
    let path = repo().join("examples/kubernetes").join(name);
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(&path)
        .output()
        .unwrap()
        .expect_success(&format!(
            "{} (Debian's python3-yaml: scripts/setup.sh installs it)",
            path.display()
        ));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A pod spec's one container, checked against the binary: the probes' ports are the
/// supervisor's metrics port, `http` is SGLang's --port, and every probe path is served there.
/// LWS_* variables as LeaderWorkerSet sets them for `worker_index`. The running deployment.
fn serve_pod(name: &str, spec: &Value, worker_index: usize) -> (Deployed, Value) {
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "{name}: one container");
    let c = &containers[0];
    let command: Vec<String> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            a.as_str()
                .unwrap()
                .replace("$(LWS_LEADER_ADDRESS)", "127.0.0.1")
                .replace("$(LWS_GROUP_SIZE)", "2")
                .replace("$(LWS_WORKER_INDEX)", &worker_index.to_string())
        })
        .collect();
    assert_eq!(
        command[..2],
        ["sglang-supervisor", "run"],
        "{name}: {command:?}"
    );
    let dashes = command.iter().position(|a| a == "--").unwrap();
    let (options, launch) = (&command[2..dashes], &command[dashes + 1..]);
    assert_eq!(
        launch[..3],
        ["python3", "-m", "sglang.launch_server"],
        "{name}"
    );
    let port_of = |port: &Value| -> u64 {
        match port {
            Value::String(named) => c["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == named.as_str())
                .unwrap_or_else(|| panic!("{name}: no container port named {named}"))
                ["containerPort"]
                .as_u64()
                .unwrap(),
            n => n.as_u64().unwrap(),
        }
    };
    let http = port_of(&Value::from("http"));
    let sglang_port = &launch[launch.iter().position(|a| a == "--port").unwrap() + 1];
    assert_eq!(
        http.to_string(),
        *sglang_port,
        "{name}: the http port is SGLang's"
    );

    let mut run = Deployed::start(name, options, &launch[3..]);
    let metrics_port: u64 = run
        .named_metrics
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        run.named_metrics.starts_with("0.0.0.0:"),
        "{name}: probes come from the kubelet, not loopback"
    );
    // Liveness is answered from the start, long before the model is loaded.
    let liveness = &c["livenessProbe"]["httpGet"];
    assert_eq!(
        port_of(&liveness["port"]),
        metrics_port,
        "{name}: {liveness}"
    );
    let status = run.get(liveness["path"].as_str().unwrap());
    assert!(
        status.contains("200"),
        "{name}: liveness {liveness}: {status}"
    );
    let ready = run.wait_event("ready");
    let readiness = &c["readinessProbe"]["httpGet"];
    assert_eq!(
        port_of(&readiness["port"]),
        metrics_port,
        "{name}: {readiness}"
    );
    let status = run.get(readiness["path"].as_str().unwrap());
    assert!(
        status.contains("200"),
        "{name}: readiness {readiness}: {status}"
    );
    assert!(
        c["startupProbe"].is_null(),
        "{name}: a startup probe would need checking too"
    );
    (run, ready)
}

#[test]
fn the_pods_probes_name_paths_and_ports_the_supervisor_serves_and_sigterm_is_143() {
    let doc = &manifest("pod.yaml")[0];
    assert_eq!(doc["kind"], "Pod");
    let spec = &doc["spec"];
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
    let command = spec["containers"][0]["command"].as_array().unwrap();
    let g = command.iter().position(|a| a == "--grace").unwrap();
    let supervisor_grace = humantime::parse_duration(command[g + 1].as_str().unwrap()).unwrap();
    assert!(
        supervisor_grace.as_secs() < grace,
        "the supervisor's --grace must end before the kubelet's SIGKILL"
    );
    let (run, _) = serve_pod("k8s-pod", spec, 0);
    assert_eq!(run.stop(), Some(143));
}

#[test]
fn the_leaderworkersets_leader_and_worker_probes_are_served_node_rank_1_included() {
    let doc = &manifest("leaderworkerset.yaml")[0];
    assert_eq!(doc["kind"], "LeaderWorkerSet");
    let lws = &doc["spec"]["leaderWorkerTemplate"];
    assert_eq!(lws["size"], 2);
    let (leader, _) = serve_pod("k8s-lws-leader", &lws["leaderTemplate"]["spec"], 0);
    let (worker, ready) = serve_pod("k8s-lws-worker", &lws["workerTemplate"]["spec"], 1);
    if deploy::node_rank_mode() {
        assert_eq!(ready["node_rank"], 1, "{ready}");
        assert_eq!(ready["nnodes"], 2, "{ready}");
    }
    assert_eq!(worker.stop(), Some(143));
    assert_eq!(leader.stop(), Some(143));
}

#[test]
fn the_podmonitor_scrapes_a_port_and_path_that_every_pod_it_selects_serves() {
    let monitor = &manifest("podmonitor.yaml")[0];
    assert_eq!(monitor["kind"], "PodMonitor");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    let pod = &manifest("pod.yaml")[0];
    let lws = &manifest("leaderworkerset.yaml")[0]["spec"]["leaderWorkerTemplate"];
    let pods = [
        ("pod.yaml", &pod["metadata"], &pod["spec"]),
        (
            "lws leader",
            &lws["leaderTemplate"]["metadata"],
            &lws["leaderTemplate"]["spec"],
        ),
        (
            "lws worker",
            &lws["workerTemplate"]["metadata"],
            &lws["workerTemplate"]["spec"],
        ),
    ];
    for (name, meta, spec) in pods {
        let selected = selector.iter().all(|(k, v)| &meta["labels"][k] == v);
        assert!(selected, "{name} is not selected by the PodMonitor");
        let (run, _) = serve_pod(&format!("k8s-monitor-{}", name.replace(' ', "-")), spec, 0);
        for endpoint in monitor["spec"]["podMetricsEndpoints"].as_array().unwrap() {
            let port = spec["containers"][0]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == endpoint["port"])
                .unwrap_or_else(|| panic!("{name}: no port {}", endpoint["port"]));
            assert_eq!(
                run.named_metrics,
                format!("0.0.0.0:{}", port["containerPort"]),
                "{name}"
            );
            let status = run.get(endpoint["path"].as_str().unwrap());
            assert!(status.contains("200"), "{name}: {endpoint}: {status}");
        }
        assert_eq!(run.stop(), Some(143));
    }
}
