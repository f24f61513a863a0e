//! deploy/: the compose file and the Kubernetes manifests, checked with the tools this machine
//! has: `docker-compose config` (or the `docker compose` plugin where there is one), the
//! Kubernetes JSON schemas of `kubernetes-validate --strict` (offline), `kubectl kustomize`
//! where kubectl is installed, and the invariants the deployment depends on, read from every
//! YAML document: each role a Deployment with both probes on the right paths and port,
//! non-root, resources, the Secret references; a PodDisruptionBudget; the migration Job; the
//! compose services; and every setting they pass one the binary reads.
//!
//! Not run here: `docker compose up`, `docker build` (no Docker engine on these machines) and
//! `kubectl apply --dry-run` (it asks an API server for its schemas; there is none).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use super::{deploy_dir, on_path, yaml_documents};

/// The configuration key each fixed environment name sets (the book's "Configuration",
/// docs/src/configuration.md).
const FIXED_NAMES: &[(&str, &str)] = &[
    ("DATABASE_URL", "database_url"),
    ("DEDUP_LISTEN", "http.listen"),
    ("DEDUP_TRANSPORT", "transport.kind"),
    ("AMQP_URL", "transport.amqp_url"),
    ("DEDUP_QUEUE", "transport.queue"),
    ("STRIPE_WEBHOOK_SECRET", "stripe.secrets"),
    ("DEDUP_SINK", "outbox.sink"),
];

/// Settings as `dedup-worker ROLE` would load them from `env` (names to values): every name must
/// be a fixed one, `RUST_LOG`, or `DEDUP_<SECTION>__<KEY>` of a key that exists, and the result
/// must validate for that role (ingest needs a Stripe secret, the others do not). A misspelt
/// name would otherwise be silently ignored by the binary.
fn assert_settings_load(role: &str, what: &str, env: &BTreeMap<String, String>) {
    use figment::providers::Serialized;
    let mut figment = dedup_worker_core::config::defaults();
    // As crates/dedup-worker-core/src/cli/mod.rs sets them for each subcommand.
    for (key, on) in [
        ("ingress", "ingest"),
        ("consumer", "consume"),
        ("relay", "relay"),
    ] {
        figment = figment.merge(Serialized::default(&format!("roles.{key}"), role == on));
    }
    for (name, value) in env {
        let key = match FIXED_NAMES.iter().find(|(n, _)| n == name) {
            Some((_, key)) => key.to_string(),
            None if name == "RUST_LOG" => continue,
            None => name
                .strip_prefix("DEDUP_")
                .unwrap_or_else(|| panic!("{what}: {name} is no setting of the binary"))
                .to_ascii_lowercase()
                .replace("__", "."),
        };
        // As figment's Env provider reads them: `false` is a boolean, digits a number.
        let parsed: Value = serde_json::from_str(value).unwrap_or_else(|_| json!(value));
        figment = figment.merge(Serialized::default(&key, parsed));
    }
    if let Err(error) = dedup_worker_core::config::Settings::from_figment(figment) {
        panic!("{what}: the binary would refuse these settings: {error}");
    }
}

/// The Dockerfile's numeric `USER`, which the manifests must run as.
fn dockerfile_user() -> u64 {
    let dockerfile = std::fs::read_to_string(deploy_dir().join("../Dockerfile")).unwrap();
    let user = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("a USER line");
    user.split(':')
        .next()
        .unwrap()
        .trim()
        .parse()
        .expect("a numeric USER")
}

fn str_list(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn the_compose_file_runs_the_stack_in_split_roles() {
    let path = deploy_dir().join("compose.yaml");
    let docs = yaml_documents(&path);
    let services = &docs[0]["services"];
    for name in [
        "postgres", "rabbitmq", "migrate", "ingest", "consume", "relay",
    ] {
        assert!(services[name].is_object(), "service {name}");
    }
    let migrate = &services["migrate"];
    assert_eq!(str_list(&migrate["command"]), ["migrate"]);
    assert_eq!(migrate["restart"], "no", "migrate is one-shot");
    let env = serde_json::from_value(migrate["environment"].clone()).expect("a map of strings");
    assert_settings_load("migrate", "compose migrate", &env);
    for (role, replicas) in [("ingest", 2), ("consume", 2), ("relay", 1)] {
        let service = &services[role];
        assert_eq!(str_list(&service["command"]), [role], "{role}");
        assert_eq!(
            service["deploy"]["replicas"].as_u64().unwrap_or(1),
            replicas,
            "{role} replicas"
        );
        assert_eq!(
            service["image"], migrate["image"],
            "{role} runs the image migrate does"
        );
        let context = service["build"]["context"].as_str().expect("built here");
        let dockerfile = service["build"]["dockerfile"].as_str().unwrap();
        assert!(
            path.parent()
                .unwrap()
                .join(context)
                .join(dockerfile)
                .is_file(),
            "{role} builds the repository's Dockerfile"
        );
        let depends = &service["depends_on"];
        assert_eq!(
            depends["migrate"]["condition"],
            "service_completed_successfully"
        );
        assert_eq!(depends["rabbitmq"]["condition"], "service_healthy");
        let env: BTreeMap<String, String> =
            serde_json::from_value(service["environment"].clone()).expect("a map of strings");
        assert_eq!(env["DEDUP_TRANSPORT"], "rabbitmq", "{role}");
        assert!(env["DATABASE_URL"].contains("@postgres:5432/"), "{role}");
        assert!(env["AMQP_URL"].contains("@rabbitmq:5672/"), "{role}");
        assert_eq!(env["DEDUP_DATABASE__MIGRATE_ON_START"], "false", "{role}");
        assert_eq!(
            env.contains_key("STRIPE_WEBHOOK_SECRET"),
            role == "ingest",
            "{role}"
        );
        let mut resolved = env.clone();
        // What compose substitutes (`${VAR:-default}`, `${VAR:?message}`): a sample value.
        for value in resolved.values_mut() {
            if value.starts_with("${DEDUP_SINK") {
                *value = "log".into();
            } else if value.starts_with("${STRIPE_WEBHOOK_SECRET") {
                *value = "whsec_compose".into();
            }
        }
        assert_settings_load(role, &format!("compose {role}"), &resolved);
    }
    assert!(
        str_list(&services["ingest"]["ports"])
            .iter()
            .any(|p| p.ends_with(":8080")),
        "ingest publishes its port"
    );
}

#[test]
fn docker_compose_config_accepts_the_compose_file() {
    let plugin = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let program: &[&str] = if plugin {
        &["docker", "compose"]
    } else if on_path("docker-compose") {
        &["docker-compose"]
    } else {
        // A check that cannot run must not pass: scripts/test.sh installs docker-compose.
        panic!(
            "neither the `docker compose` plugin nor `docker-compose` is installed \
             (scripts/test.sh installs docker-compose)"
        );
    };
    for profile in [&[][..], &["--profile", "observability"][..]] {
        let out = Command::new(program[0])
            .args(&program[1..])
            .args(["-f", "compose.yaml"])
            .args(profile)
            .args(["config", "-q"])
            .current_dir(deploy_dir())
            .env("STRIPE_WEBHOOK_SECRET", "whsec_compose")
            .output()
            .expect("run compose");
        assert!(
            out.status.success(),
            "{program:?} config {profile:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every Kubernetes object of deploy/k8s, by `Kind/name`.
fn k8s_objects() -> BTreeMap<String, Value> {
    let dir = deploy_dir().join("k8s");
    let mut objects = BTreeMap::new();
    for file in manifest_files(&dir) {
        for doc in yaml_documents(&dir.join(&file)) {
            let id = format!(
                "{}/{}",
                doc["kind"].as_str().unwrap(),
                doc["metadata"]["name"].as_str().unwrap()
            );
            assert!(objects.insert(id.clone(), doc).is_none(), "{id} twice");
        }
    }
    objects
}

/// The manifest files (everything but kustomization.yaml), sorted.
fn manifest_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    files.sort();
    files
}

/// Whether `selector`'s matchLabels all hold in `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let wanted = selector["matchLabels"].as_object().expect("matchLabels");
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels[k] == *v)
}

/// Non-root, no privilege escalation, no capabilities, resources requested and memory capped.
fn assert_hardened(what: &str, pod: &Value, container: &Value) {
    let pod_security = &pod["securityContext"];
    assert_eq!(pod_security["runAsNonRoot"], true, "{what}");
    assert_eq!(
        pod_security["runAsUser"].as_u64(),
        Some(dockerfile_user()),
        "{what}"
    );
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false, "{what}");
    assert_eq!(security["readOnlyRootFilesystem"], true, "{what}");
    assert_eq!(
        str_list(&security["capabilities"]["drop"]),
        ["ALL"],
        "{what}"
    );
    let resources = &container["resources"];
    for (kind, name) in [
        ("requests", "cpu"),
        ("requests", "memory"),
        ("limits", "memory"),
    ] {
        assert!(
            resources[kind][name].is_string(),
            "{what}: resources.{kind}.{name}"
        );
    }
}

/// The container's environment: ConfigMap values, and Secret references as sample values.
fn container_env(
    what: &str,
    container: &Value,
    objects: &BTreeMap<String, Value>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for source in container["envFrom"].as_array().into_iter().flatten() {
        let name = source["configMapRef"]["name"]
            .as_str()
            .expect("a ConfigMap");
        let map = &objects[&format!("ConfigMap/{name}")]["data"];
        env.extend(serde_json::from_value::<BTreeMap<String, String>>(map.clone()).unwrap());
    }
    for var in container["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap().to_owned();
        let secret = &var["valueFrom"]["secretKeyRef"];
        assert_eq!(
            secret["name"], "dedup-worker",
            "{what}: {name} from the Secret"
        );
        assert_eq!(secret["key"], name.as_str(), "{what}");
        let sample = match name.as_str() {
            "STRIPE_WEBHOOK_SECRET" => "whsec_k8s",
            "DATABASE_URL" => "postgres://dedup@postgres:5432/dedup",
            _ => "amqp://dedup@rabbitmq:5672/%2f",
        };
        env.insert(name, sample.to_owned());
    }
    env
}

#[test]
fn each_role_is_a_probed_non_root_deployment_with_a_pdb_and_a_migration_job() {
    let objects = k8s_objects();
    let mut pdbs: Vec<&Value> = objects
        .iter()
        .filter(|(id, _)| id.starts_with("PodDisruptionBudget/"))
        .map(|(_, o)| o)
        .collect();
    assert!(!pdbs.is_empty(), "a PodDisruptionBudget");
    for (role, replicas) in [("ingest", 2), ("consume", 2), ("relay", 1)] {
        let deployment = &objects[&format!("Deployment/dedup-worker-{role}")];
        let spec = &deployment["spec"];
        assert_eq!(spec["replicas"], replicas, "{role}");
        let template = &spec["template"];
        assert!(
            selects(&spec["selector"], &template["metadata"]["labels"]),
            "{role}"
        );
        let pod = &template["spec"];
        let containers = pod["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1, "{role}");
        let container = &containers[0];
        assert_eq!(str_list(&container["args"]), [role], "{role}");
        assert!(container["image"]
            .as_str()
            .unwrap()
            .starts_with("dedup-worker:"));
        let port = &container["ports"][0];
        assert_eq!(
            (port["name"].as_str(), port["containerPort"].as_u64()),
            (Some("http"), Some(8080))
        );
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let get = &container[probe]["httpGet"];
            assert_eq!(get["path"], path, "{role} {probe}");
            assert_eq!(get["port"], "http", "{role} {probe}");
        }
        assert_hardened(role, pod, container);
        // Past the worker's own grace period, so it drains and gives back its work.
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
        assert!(grace > 30, "{role}: {grace} s");
        let env = container_env(role, container, &objects);
        assert_eq!(
            env.contains_key("STRIPE_WEBHOOK_SECRET"),
            role == "ingest",
            "{role}"
        );
        assert_eq!(
            env["DEDUP_DATABASE__MIGRATE_ON_START"], "false",
            "{role}: the Job migrates"
        );
        assert_settings_load(role, &format!("k8s {role}"), &env);
        // Each replicated role keeps a pod through voluntary disruptions.
        let labels = &template["metadata"]["labels"];
        let covering: Vec<_> = pdbs
            .iter()
            .filter(|p| selects(&p["spec"]["selector"], labels))
            .collect();
        if replicas > 1 {
            assert_eq!(covering.len(), 1, "{role}: one PodDisruptionBudget");
            let min = covering[0]["spec"]["minAvailable"]
                .as_u64()
                .expect("minAvailable");
            assert!(
                min >= 1 && min < replicas,
                "{role}: minAvailable {min} of {replicas}"
            );
        }
        pdbs.retain(|p| !selects(&p["spec"]["selector"], labels));
    }
    assert!(pdbs.is_empty(), "a PodDisruptionBudget selecting no role");

    let job = &objects["Job/dedup-worker-migrate"]["spec"]["template"]["spec"];
    let container = &job["containers"][0];
    assert_eq!(str_list(&container["args"]), ["migrate"]);
    assert!(["OnFailure", "Never"].contains(&job["restartPolicy"].as_str().unwrap()));
    assert_hardened("migrate", job, container);
    let env = container_env("migrate", container, &objects);
    assert!(env.contains_key("DATABASE_URL"));
    assert_settings_load("migrate", "k8s migrate", &env);

    let service = &objects["Service/dedup-worker-ingest"]["spec"];
    let ingest =
        &objects["Deployment/dedup-worker-ingest"]["spec"]["template"]["metadata"]["labels"];
    let selector = json!({ "matchLabels": service["selector"] });
    assert!(
        selects(&selector, ingest),
        "the Service reaches the ingest pods"
    );
    assert_eq!(service["ports"][0]["targetPort"], "http");

    // kustomization.yaml lists every manifest.
    let dir = deploy_dir().join("k8s");
    let kustomization = &yaml_documents(&dir.join("kustomization.yaml"))[0];
    let mut listed: Vec<&str> = str_list(&kustomization["resources"]);
    listed.sort();
    assert_eq!(listed, manifest_files(&dir));
}

#[test]
fn the_manifests_pass_the_kubernetes_schemas_and_kustomize() {
    let dir = deploy_dir().join("k8s");
    assert!(
        on_path("kubernetes-validate"),
        "kubernetes-validate is not installed: pip install kubernetes-validate (scripts/test.sh does)"
    );
    // Strict: a field Kubernetes does not know (a misspelt probe, say) is an error, not ignored.
    // The oldest version checked is one clusters still run.
    for version in ["1.29.0", "1.33.0"] {
        let out = Command::new("kubernetes-validate")
            .args(["--strict", "--quiet", "-k", version])
            .args(manifest_files(&dir))
            .current_dir(&dir)
            .output()
            .expect("run kubernetes-validate");
        assert!(
            out.status.success(),
            "kubernetes {version}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if !on_path("kubectl") {
        println!("skipped kubectl kustomize: kubectl is not installed");
        return;
    }
    let out = Command::new("kubectl")
        .args(["kustomize", "."])
        .current_dir(&dir)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8_lossy(&out.stdout);
    let kinds = rendered.lines().filter(|l| l.starts_with("kind: ")).count();
    assert_eq!(kinds, k8s_objects().len(), "every object rendered");
    assert!(rendered.contains("app.kubernetes.io/part-of: dedup-worker"));
}
