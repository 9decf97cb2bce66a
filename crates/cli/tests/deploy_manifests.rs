//! The Kubernetes manifests in `deploy/kubernetes/`: checked as YAML against the fields a
//! JobSet and a Kubeflow TrainJob need to start a working job (the headless service and
//! the pod DNS name of the coordinator agree, the PET_* variables agree with the job's
//! shape), and then the pods' command is run here, one launcher per pod with the
//! environment the manifest gives it: its workers print the single-process bits. The
//! elastic JobSet's coordinator and workers run here the same way, one of the workers
//! killed and started again as its kubelet would. No Kubernetes cluster is involved.

use yaml_rust2::{Yaml, YamlLoader};

mod common;

fn load(name: &str) -> Vec<Yaml> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{name} is not YAML: {e}"))
}

fn text(y: &Yaml) -> String {
    match y {
        Yaml::String(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        other => panic!("expected a string or a number, found {other:?}"),
    }
}

/// The `value` (or the `valueFrom`) of variable `name` in a container's `env`.
fn env_var<'a>(env: &'a Yaml, name: &str) -> &'a Yaml {
    let list = env.as_vec().expect("env is a list");
    let var = list.iter().find(|v| v["name"].as_str() == Some(name)).unwrap_or_else(|| panic!("no {name}"));
    if var["value"].is_badvalue() { &var["valueFrom"] } else { &var["value"] }
}

/// The container command: `steadfast launch -- train ...`; returns the `train` part.
fn train_command(command: &Yaml) -> Vec<String> {
    let words: Vec<String> = command.as_vec().expect("command is a list").iter().map(text).collect();
    assert_eq!(words[..3], ["steadfast", "launch", "--"], "{words:?}");
    assert_eq!(words[3], "train");
    words[3..].to_vec()
}

/// `command` with the value after `flag` replaced.
fn with_value(mut command: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    let i = command.iter().position(|w| w == flag).unwrap_or_else(|| panic!("no {flag} in {command:?}"));
    command[i + 1] = value.to_owned();
    command
}

/// What an elastic JobSet's service and coordinator agree on, checked: the headless
/// service selects the set's pods, names their subdomain and serves the coordinator's
/// port; the set succeeds with its coordinator.
struct ElasticSet<'a> {
    name: String,
    subdomain: String,
    port: String,
    co_command: Vec<String>,
    workers: &'a Yaml,
}

impl<'a> ElasticSet<'a> {
    fn read(docs: &'a [Yaml]) -> ElasticSet<'a> {
        let service = docs.iter().find(|d| d["kind"].as_str() == Some("Service")).expect("a Service");
        let jobset = docs.iter().find(|d| d["kind"].as_str() == Some("JobSet")).expect("a JobSet");
        let name = jobset["metadata"]["name"].as_str().unwrap();
        let subdomain = jobset["spec"]["network"]["subdomain"].as_str().unwrap();
        assert_eq!(service["spec"]["clusterIP"].as_str(), Some("None"));
        assert_eq!(service["spec"]["selector"]["jobset.sigs.k8s.io/jobset-name"].as_str(), Some(name));
        assert_eq!(service["metadata"]["name"].as_str(), Some(subdomain));
        let jobs = jobset["spec"]["replicatedJobs"].as_vec().unwrap();
        let by_name = |n: &str| jobs.iter().find(|j| j["name"].as_str() == Some(n)).unwrap_or_else(|| panic!("no {n}"));
        let (coordinator, workers) = (by_name("coordinator"), by_name("workers"));
        // The set succeeds with its coordinator, which exits 0 once the job has finished.
        assert_eq!(jobset["spec"]["successPolicy"]["targetReplicatedJobs"][0].as_str(), Some("coordinator"));
        let co_container = &coordinator["template"]["spec"]["template"]["spec"]["containers"][0];
        let co_command: Vec<String> = co_container["command"].as_vec().unwrap().iter().map(text).collect();
        assert_eq!(co_command[..3], ["steadfast", "coordinator", "--elastic"]);
        let at = co_command.iter().position(|w| w == "--bind").expect("--bind");
        let port = co_command[at + 1].rsplit_once(':').unwrap().1.to_owned();
        assert_eq!(text(&service["spec"]["ports"][0]["port"]), port);
        assert_eq!(text(&co_container["ports"][0]["containerPort"]), port);
        ElasticSet { name: name.to_owned(), subdomain: subdomain.to_owned(), port, co_command, workers }
    }
}

#[test]
fn the_jobset_manifest_is_consistent_and_its_pods_command_gives_the_single_process_bits() {
    let docs = load("jobset.yaml");
    let service = docs.iter().find(|d| d["kind"].as_str() == Some("Service")).expect("a Service");
    let jobset = docs.iter().find(|d| d["kind"].as_str() == Some("JobSet")).expect("a JobSet");
    assert_eq!(jobset["apiVersion"].as_str(), Some("jobset.x-k8s.io/v1alpha2"));
    let name = jobset["metadata"]["name"].as_str().unwrap();
    // A headless service that selects the set's pods and names their DNS subdomain.
    assert_eq!(service["spec"]["clusterIP"].as_str(), Some("None"));
    assert_eq!(service["spec"]["selector"]["jobset.sigs.k8s.io/jobset-name"].as_str(), Some(name));
    let subdomain = jobset["spec"]["network"]["subdomain"].as_str().unwrap();
    assert_eq!(service["metadata"]["name"].as_str(), Some(subdomain));
    assert_eq!(jobset["spec"]["network"]["enableDNSHostnames"].as_bool(), Some(true));

    let replicated = &jobset["spec"]["replicatedJobs"][0];
    let job = &replicated["template"]["spec"];
    assert_eq!(job["completionMode"].as_str(), Some("Indexed"));
    let pods = job["parallelism"].as_i64().unwrap();
    assert_eq!(job["completions"].as_i64(), Some(pods));
    let container = &job["template"]["spec"]["containers"][0];
    let env = &container["env"];
    assert_eq!(text(env_var(env, "PET_NNODES")), pods.to_string());
    assert_eq!(
        env_var(env, "PET_NODE_RANK")["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.annotations['batch.kubernetes.io/job-completion-index']")
    );
    // Pod 0 of the first replica of the replicated job, under the service's subdomain.
    let rjob = replicated["name"].as_str().unwrap();
    assert_eq!(text(env_var(env, "PET_MASTER_ADDR")), format!("{name}-{rjob}-0-0.{subdomain}"));
    let port = text(env_var(env, "PET_MASTER_PORT"));
    assert_eq!(text(&service["spec"]["ports"][0]["port"]), port);
    assert_eq!(text(&container["ports"][0]["containerPort"]), port);
    assert!(env_var(env, "STEADFAST_SECRET")["secretKeyRef"]["key"].as_str().is_some());
    let nproc = text(env_var(env, "PET_NPROC_PER_NODE"));

    // The pods' command, shortened to a few steps and pointed at a scratch directory.
    let command = train_command(&container["command"]);
    let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
    assert!(command.iter().any(|w| w.starts_with(mount)), "checkpoints go to the shared volume");
    let data = &command[command.iter().position(|w| w == "--data").unwrap() + 1];
    if data == "fashion-mnist" && !common::have_data("/usr/share/datasets/fashion-mnist") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().to_str().unwrap();
    let command: Vec<String> = with_value(command, "--steps", "4")
        .into_iter()
        .map(|w| if w.starts_with(mount) { w.replacen(mount, scratch, 1) } else { w })
        .collect();
    // One launcher per pod with the manifest's variables (pod 0's DNS name: loopback).
    let outputs = common::launch_pet_nodes(&command, pods as usize, &nproc, Some("from-the-kubernetes-secret"));
    let single_out = format!("{scratch}/single");
    let single = with_value(
        command.iter().filter(|w| *w != "auto" && *w != "--resume").cloned().collect(),
        "--out",
        &single_out,
    );
    let single = common::fingerprint(&common::steadfast(&single.iter().map(String::as_str).collect::<Vec<_>>()));
    let mut count = 0;
    for (node, out) in outputs.into_iter().enumerate() {
        for fp in common::fingerprints_in(&common::ok(out)) {
            assert_eq!(fp, single, "pod {node}");
            count += 1;
        }
    }
    assert_eq!(count as i64, pods * nproc.parse::<i64>().unwrap(), "one summary per worker");
}

#[test]
fn the_trainjob_manifest_uses_the_torch_runtime_and_a_command_launch_runs() {
    let docs = load("trainjob.yaml");
    let job = &docs[0];
    assert_eq!(job["apiVersion"].as_str(), Some("trainer.kubeflow.org/v1alpha1"));
    assert_eq!(job["kind"].as_str(), Some("TrainJob"));
    // The runtime that sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
    // PET_MASTER_ADDR and PET_MASTER_PORT from these two fields.
    assert_eq!(job["spec"]["runtimeRef"]["name"].as_str(), Some("torch-distributed"));
    let trainer = &job["spec"]["trainer"];
    let nodes = trainer["numNodes"].as_i64().expect("numNodes");
    let nproc = text(&trainer["numProcPerNode"]);
    assert!(env_var(&trainer["env"], "STEADFAST_SECRET")["secretKeyRef"]["key"].as_str().is_some());
    let command = train_command(&trainer["command"]);
    // The same command with the variables the runtime would set, and generated data so
    // that it runs without the data set: every worker finishes.
    let dir = tempfile::tempdir().unwrap();
    let command = with_value(command, "--steps", "2");
    let command = with_value(command, "--data", "synthetic");
    let command = with_value(command, "--out", dir.path().to_str().unwrap());
    let secret = Some("from-the-kubernetes-secret");
    for (node, out) in common::launch_pet_nodes(&command, nodes as usize, &nproc, secret).into_iter().enumerate() {
        assert_eq!(common::fingerprints_in(&common::ok(out)).len().to_string(), nproc, "pod {node}");
    }
    // Without the secret the runtime's pods would fail at once, saying why.
    let refused = common::launch_pet_nodes(&command, 2, "1", None);
    assert!(String::from_utf8_lossy(&refused[1].stderr).contains("needs STEADFAST_SECRET"));
}

/// The elastic JobSet: a coordinator pod and indexed worker pods whose dead containers the
/// kubelet starts again. Checked for consistency, then run here: the coordinator's command,
/// and one worker per pod with the manifest's variables; a worker is killed with SIGKILL in
/// the middle and its command started again (as the kubelet would), and every worker ends
/// with the single-process bits.
#[test]
fn the_elastic_jobset_is_consistent_and_survives_a_worker_its_kubelet_restarts() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    let docs = load("elastic.yaml");
    let set = ElasticSet::read(&docs);
    let (name, subdomain, port, co_command) = (set.name, set.subdomain, set.port, set.co_command);
    let flag = |command: &[String], f: &str| {
        command[command.iter().position(|w| w == f).unwrap_or_else(|| panic!("no {f}")) + 1].clone()
    };
    let workers = set.workers;
    let job = &workers["template"]["spec"];
    assert_eq!(job["completionMode"].as_str(), Some("Indexed"));
    let pods = job["parallelism"].as_i64().unwrap();
    assert_eq!(job["completions"].as_i64(), Some(pods));
    assert_eq!(job["template"]["spec"]["restartPolicy"].as_str(), Some("OnFailure"));
    let container = &job["template"]["spec"]["containers"][0];
    let env = &container["env"];
    assert_eq!(
        env_var(env, "STEADFAST_RANK")["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.annotations['batch.kubernetes.io/job-completion-index']")
    );
    assert!(env_var(env, "STEADFAST_SECRET")["secretKeyRef"]["key"].as_str().is_some());
    let command: Vec<String> = container["command"].as_vec().unwrap().iter().map(text).collect();
    assert_eq!(command[..3], ["steadfast", "train", "--elastic"]);
    // The coordinator pod's DNS name under the service, on its port; the world is the pods.
    assert_eq!(flag(&command, "--coordinator"), format!("{name}-coordinator-0-0.{subdomain}:{port}"));
    assert_eq!(flag(&command, "--world-size"), pods.to_string());
    assert_eq!(flag(&co_command, "--world-size"), pods.to_string());

    // Run it here: loopback for the pods' addresses, generated data, 300 steps.
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().to_str().unwrap();
    let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
    let port = common::free_port().to_string();
    let command: Vec<String> = command[1..]
        .iter()
        .map(|w| if w.starts_with(mount) { w.replacen(mount, scratch, 1) } else { w.clone() })
        .collect();
    let command = with_value(command, "--coordinator", &format!("127.0.0.1:{port}"));
    let command = with_value(with_value(command, "--data", "synthetic"), "--steps", "300");
    let co_command = with_value(co_command[1..].to_vec(), "--bind", &format!("127.0.0.1:{port}"));
    let secret = "from-the-kubernetes-secret";
    let start = |args: &[String], rank: Option<i64>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_steadfast"));
        c.args(args).env("STEADFAST_SECRET", secret).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(r) = rank {
            c.env("STEADFAST_RANK", r.to_string());
        }
        c.spawn().unwrap()
    };
    let co = start(&co_command, None);
    let mut pods_running: Vec<_> = (0..pods).map(|r| start(&command, Some(r))).collect();
    let out = std::path::Path::new(scratch).join(flag(&command, "--out").rsplit('/').next().unwrap());
    let deadline = Instant::now() + Duration::from_secs(120);
    while common::steps_recorded(&out).last().is_none_or(|&s| s < 60) {
        assert!(Instant::now() < deadline, "training did not reach step 60");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The kubelet's restart of a dead container: the same command, in the same pod.
    let victim = pods_running.remove(2);
    assert!(Command::new("kill").args(["-9", &victim.id().to_string()]).status().unwrap().success());
    let _ = victim.wait_with_output();
    pods_running.push(start(&command, Some(2)));

    let co_out = co.wait_with_output().unwrap();
    let co_text = String::from_utf8_lossy(&co_out.stdout).into_owned();
    assert!(co_out.status.success(), "the coordinator: {co_text}");
    assert!(co_text.contains("[2] fetch the state from"), "the restarted worker fetched: {co_text}");
    let mut prints = Vec::new();
    for p in pods_running {
        prints.extend(common::fingerprints_in(&common::ok(p.wait_with_output().unwrap())));
    }
    // Single-process `train` of the same flags, without the job's.
    let mut reference = vec!["train".to_owned()];
    let mut rest = command[1..].iter();
    while let Some(w) = rest.next() {
        match w.as_str() {
            "--elastic" => {}
            "--coordinator" | "--world-size" | "--resume" | "--checkpoint-dir" | "--checkpoint-every" => {
                rest.next();
            }
            "--out" => {
                rest.next();
                reference.extend(["--out".to_owned(), format!("{scratch}/single")]);
            }
            _ => reference.push(w.clone()),
        }
    }
    let single = common::fingerprint(&common::steadfast(&reference.iter().map(String::as_str).collect::<Vec<_>>()));
    assert_eq!(prints, vec![single; pods as usize], "{co_text}");
}

/// The PyTorch job's JobSet: the elastic set's shape, whose worker pods run the user's
/// script and tell it its job through the environment the elastic worker reads (its run,
/// a coordinator and Python workers restarted as the kubelet would, is
/// python/tests/test_elastic.py's).
#[test]
fn the_pytorch_jobset_tells_its_python_workers_their_job_in_their_environment() {
    let docs = load("elastic-pytorch.yaml");
    let set = ElasticSet::read(&docs);
    let job = &set.workers["template"]["spec"];
    assert_eq!(job["completionMode"].as_str(), Some("Indexed"));
    assert_eq!(job["template"]["spec"]["restartPolicy"].as_str(), Some("OnFailure"));
    let pods = job["parallelism"].as_i64().unwrap().to_string();
    let container = &job["template"]["spec"]["containers"][0];
    let command: Vec<String> = container["command"].as_vec().unwrap().iter().map(text).collect();
    assert_eq!(command[..2], ["python", "/app/train.py"]);
    let env = &container["env"];
    assert_eq!(text(env_var(env, "STEADFAST_ELASTIC")), "1");
    assert_eq!(text(env_var(env, "STEADFAST_WORLD_SIZE")), pods);
    let world = set.co_command.iter().position(|w| w == "--world-size").expect("--world-size");
    assert_eq!(set.co_command[world + 1], pods);
    assert_eq!(
        text(env_var(env, "STEADFAST_COORDINATOR")),
        format!("{}-coordinator-0-0.{}:{}", set.name, set.subdomain, set.port)
    );
    assert_eq!(
        env_var(env, "STEADFAST_RANK")["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.annotations['batch.kubernetes.io/job-completion-index']")
    );
    assert!(env_var(env, "STEADFAST_SECRET")["secretKeyRef"]["key"].as_str().is_some());
    // The image puts the example where the command runs it.
    let dockerfile =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/Dockerfile"))
            .unwrap();
    assert!(dockerfile.contains("COPY python/examples/elastic_ddp.py /app/train.py"), "{dockerfile}");
}
