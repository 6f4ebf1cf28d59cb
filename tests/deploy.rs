//! The deployment examples agree with the code: the Grafana dashboard queries only metrics
//! tollgate exports, the compose file and the Kubernetes manifest set only variables tollgate
//! reads and form valid configurations, their stop grace periods outlast the drain, and the
//! `Dockerfile` probes, exposes and pins what it should.
//!
//! No Docker engine or cluster is needed (there is none on our machines): the files are read as
//! text. The parsing is line-based on purpose, with no YAML or JSON crate: the files are ours,
//! keep a plain layout, and a test that cannot find what it looks for fails saying so.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use tollgate::Config;
use tollgate::config::VARIABLES;
use tollgate::testing::METRIC_NAMES;

const DASHBOARD: &str = "docs/deploy/grafana-dashboard.json";
const COMPOSE: &str = "docs/deploy/docker-compose.yml";
const KUBERNETES: &str = "docs/deploy/kubernetes.yaml";
const DOCKERFILE: &str = "Dockerfile";

/// `docker stop`'s grace before SIGKILL when neither the image user nor the compose file says
/// otherwise.
const DOCKER_STOP_GRACE: Duration = Duration::from_secs(10);

/// Stands in for the `KEY_HASH_SECRET` an operator puts in the Kubernetes Secret.
const TEST_SECRET: &str = "0123456789abcdef0123456789abcdef";

// --- the dashboard ---------------------------------------------------------------------------

#[test]
fn dashboard_queries_only_exported_metrics() {
    let dashboard = read(DASHBOARD);
    let queries = dashboard_queries(&dashboard);
    let exprs = dashboard
        .lines()
        .filter(|line| line.trim_start().starts_with("\"expr\":"))
        .count();
    assert!(
        exprs >= 10,
        "{DASHBOARD}: only {exprs} \"expr\" lines: has its layout changed?"
    );

    // A query on a metric that is not ours (a typo in the prefix) would escape the name check.
    for query in &queries {
        assert!(
            !metric_names(query).is_empty(),
            "{DASHBOARD}: a query names no tollgate_ metric: {query}"
        );
    }
    let unknown: BTreeSet<String> = queries
        .iter()
        .flat_map(|query| metric_names(query))
        .filter(|name| !METRIC_NAMES.contains(&name.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "{DASHBOARD} queries metrics tollgate does not export: {unknown:?} (exported: {METRIC_NAMES:?})"
    );
}

#[test]
fn dashboard_takes_its_datasource_from_a_variable() {
    let dashboard = read(DASHBOARD);
    assert!(dashboard.contains("\"name\": \"DS_PROMETHEUS\""));
    // Every datasource reference is the variable: none is a UID from someone's Grafana.
    for line in dashboard.lines().filter(|line| line.contains("\"uid\":")) {
        let line = line.trim();
        assert!(
            line.starts_with("\"uid\": \"${DS_PROMETHEUS}\"")
                || line.starts_with("\"uid\": \"-- Grafana --\"")
                || line.starts_with("\"uid\": \"tollgate\""),
            "{DASHBOARD}: a fixed datasource: {line}"
        );
    }
}

/// The PromQL of every panel (`"expr"`) and template variable (`"definition"`), unescaped
/// only as far as the metric names need: one JSON string value per line.
fn dashboard_queries(dashboard: &str) -> Vec<String> {
    dashboard
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            ["\"expr\": \"", "\"definition\": \""]
                .iter()
                .find_map(|key| line.strip_prefix(key))
        })
        .map(|rest| rest.trim_end_matches(',').trim_end_matches('"').to_owned())
        .collect()
}

/// The `tollgate_*` metric names in a PromQL expression, with a histogram's `_bucket`, `_sum`
/// and `_count` series named by their histogram.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let is_name_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    let mut names = BTreeSet::new();
    for (start, _) in expr.match_indices("tollgate_") {
        let preceded_by_name = expr[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if preceded_by_name {
            continue;
        }
        let rest = &expr[start..];
        let name = &rest[..rest.find(|c| !is_name_char(c)).unwrap_or(rest.len())];
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        names.insert(name.to_owned());
    }
    names
}

// --- the variables the examples set ------------------------------------------------------------

#[test]
fn examples_set_only_variables_tollgate_reads() {
    for (file, vars) in [
        (COMPOSE, compose_environment()),
        (KUBERNETES, kubernetes_environment()),
    ] {
        assert!(
            !vars.is_empty(),
            "{file}: no variables found: has its layout changed?"
        );
        let unknown: Vec<&str> = vars
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| !VARIABLES.contains(name))
            .collect();
        assert!(
            unknown.is_empty(),
            "{file} sets variables tollgate does not read: {unknown:?}"
        );
    }
}

#[test]
fn compose_environment_is_a_valid_configuration() {
    if let Err(error) = Config::from_vars(compose_environment()) {
        panic!("{COMPOSE}: {error}");
    }
}

#[test]
fn kubernetes_environment_is_valid_once_the_secret_is_filled() {
    // As shipped, the Secret is empty and tollgate refuses to start, naming the variable.
    match Config::from_vars(kubernetes_environment()) {
        Ok(_) => panic!("{KUBERNETES}: starts without KEY_HASH_SECRET, with Redis and header keys"),
        Err(error) => assert!(error.to_string().contains("KEY_HASH_SECRET"), "{error}"),
    }
    if let Err(error) = Config::from_vars(filled_kubernetes_environment()) {
        panic!("{KUBERNETES} with KEY_HASH_SECRET set: {error}");
    }
}

#[test]
fn kubernetes_rules_file_is_a_valid_rule_table_mounted_where_rules_file_says() {
    let manifest = read(KUBERNETES);
    let vars = kubernetes_variables(&manifest);
    let mounted = vars
        .iter()
        .find(|(name, _)| name == "RULES_FILE")
        .unwrap_or_else(|| panic!("{KUBERNETES}: RULES_FILE is not set"));
    assert!(
        mounted.1.starts_with("/etc/tollgate/rules/"),
        "{KUBERNETES}: RULES_FILE={} is not in the mounted directory",
        mounted.1
    );
    assert!(
        manifest.contains("mountPath: /etc/tollgate/rules\n"),
        "{KUBERNETES}: the rules directory is not mounted"
    );
    let config = match Config::from_vars(filled_kubernetes_environment()) {
        Ok(config) => config,
        Err(error) => panic!("{KUBERNETES}: the rules file: {error}"),
    };
    assert!(
        config.rule_table().rule("api").is_some(),
        "{KUBERNETES}: no api rule"
    );
    assert!(config.reloads_rules());
}

/// The `rules.toml` of the `tollgate-rules` ConfigMap.
fn kubernetes_rules(manifest: &str) -> String {
    let rules = kubernetes_named(manifest, "ConfigMap", Some("tollgate-rules"));
    let [block] = &blocks(&rules, "rules.toml: |")[..] else {
        panic!("{KUBERNETES}: expected one rules.toml in the tollgate-rules ConfigMap");
    };
    let depth = block.iter().map(|line| indent(line)).min().unwrap_or(0);
    let text: String = rules
        .iter()
        .skip_while(|line| line.trim() != "rules.toml: |")
        .skip(1)
        .take_while(|line| is_blank(line) || indent(line) >= depth)
        .map(|line| format!("{}\n", line.get(depth..).unwrap_or("")))
        .collect();
    assert!(
        text.contains("[[routes]]"),
        "{KUBERNETES}: the rules file: {text}"
    );
    text
}

// --- stopping: SIGTERM, the drain, then SIGKILL --------------------------------------------------

#[test]
fn default_drain_fits_in_dockers_default_stop_grace() {
    let config = match Config::from_vars([("BACKEND_URL", "http://127.0.0.1:8000")]) {
        Ok(config) => config,
        Err(error) => panic!("the minimal configuration: {error}"),
    };
    assert!(
        config.shutdown_timeout() < DOCKER_STOP_GRACE,
        "SHUTDOWN_TIMEOUT_MS defaults to {:?}: `docker stop` kills the drain at {DOCKER_STOP_GRACE:?}",
        config.shutdown_timeout()
    );
}

#[test]
fn compose_stop_grace_outlasts_the_drain() {
    let compose = read(COMPOSE);
    let service = compose_service(&compose, "tollgate");
    let grace = match values(&service, "stop_grace_period:").as_slice() {
        [grace] => compose_duration(grace),
        other => panic!("{COMPOSE}: expected one stop_grace_period for tollgate, found {other:?}"),
    };
    let drain = shutdown_timeout(COMPOSE, compose_environment());
    assert!(
        drain < grace,
        "{COMPOSE}: a drain of {drain:?} is killed at {grace:?}"
    );
}

#[test]
fn kubernetes_termination_grace_outlasts_pre_stop_and_drain() {
    let manifest = read(KUBERNETES);
    let deployment = kubernetes_document(&manifest, "Deployment");
    let grace = match values(&deployment, "terminationGracePeriodSeconds:").as_slice() {
        [seconds] => Duration::from_secs(number(KUBERNETES, seconds)),
        other => panic!("{KUBERNETES}: expected one terminationGracePeriodSeconds, found {other:?}"),
    };
    // The preStop sleep runs before SIGTERM, inside the same grace period.
    let pre_stop: Duration = blocks(&deployment, "sleep:")
        .iter()
        .flat_map(|block| values(block, "seconds:"))
        .map(|seconds| Duration::from_secs(number(KUBERNETES, &seconds)))
        .sum();
    let drain = shutdown_timeout(KUBERNETES, filled_kubernetes_environment());
    assert!(
        pre_stop + drain < grace,
        "{KUBERNETES}: preStop {pre_stop:?} plus a drain of {drain:?} is killed at {grace:?}"
    );
}

fn shutdown_timeout(file: &str, vars: Vec<(String, String)>) -> Duration {
    match Config::from_vars(vars) {
        Ok(config) => config.shutdown_timeout(),
        Err(error) => panic!("{file}: {error}"),
    }
}

// --- images ---------------------------------------------------------------------------------------

#[test]
fn dockerfile_probes_exposes_and_pins() {
    let dockerfile = read(DOCKERFILE);
    let instructions = dockerfile_instructions(&dockerfile);
    let arguments = |keyword: &str| -> Vec<&str> {
        instructions
            .iter()
            .filter_map(|(word, rest)| (word.eq_ignore_ascii_case(keyword)).then_some(rest.as_str()))
            .collect()
    };

    match arguments("HEALTHCHECK").as_slice() {
        [check] => {
            let command = check.split_once("CMD").map_or("", |(_, command)| command).trim();
            assert_eq!(
                json_strings(command),
                ["/usr/local/bin/tollgate", "healthcheck"],
                "{DOCKERFILE}: HEALTHCHECK must run `tollgate healthcheck` (exec form: no shell)"
            );
        }
        other => panic!("{DOCKERFILE}: expected one HEALTHCHECK, found {other:?}"),
    }

    let exposed: BTreeSet<&str> = arguments("EXPOSE")
        .iter()
        .flat_map(|ports| ports.split_whitespace())
        .collect();
    for port in ["8080", "9091"] {
        assert!(
            exposed.contains(port),
            "{DOCKERFILE}: EXPOSE lacks {port}: {exposed:?}"
        );
    }
    assert_eq!(arguments("STOPSIGNAL"), ["SIGTERM"], "{DOCKERFILE}: STOPSIGNAL");
    match arguments("USER").last() {
        Some(user) => assert!(
            user.split(':')
                .all(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())),
            "{DOCKERFILE}: the runtime USER must be numeric (for runAsNonRoot): {user}"
        ),
        None => panic!("{DOCKERFILE}: no USER: the image would run as root"),
    }

    // FROM image [AS stage]: a stage named earlier is not an image to pin.
    let mut stages = BTreeSet::new();
    let mut images = Vec::new();
    for from in arguments("FROM") {
        let words: Vec<&str> = from
            .split_whitespace()
            .filter(|word| !word.starts_with("--"))
            .collect();
        match words.as_slice() {
            [image, rest @ ..] => {
                if !stages.contains(*image) {
                    images.push(image.to_string());
                }
                if let [as_keyword, stage] = rest
                    && as_keyword.eq_ignore_ascii_case("as")
                {
                    stages.insert(stage.to_string());
                }
            }
            [] => panic!("{DOCKERFILE}: an empty FROM"),
        }
    }
    assert!(
        images.len() >= 2,
        "{DOCKERFILE}: expected a builder and a runtime image: {images:?}"
    );
    for image in &images {
        assert_pinned(DOCKERFILE, image);
    }
    let rust = images.iter().find(|image| repository(image).ends_with("rust"));
    match rust.map(|image| tag(image)) {
        Some(Some(tag)) => assert!(
            starts_with_minor_version(tag),
            "{DOCKERFILE}: the rust image must name a toolchain version such as 1.95.0-bookworm, not {tag}"
        ),
        other => panic!("{DOCKERFILE}: no versioned rust builder image: {other:?}"),
    }
}

#[test]
fn example_images_are_pinned() {
    for file in [COMPOSE, KUBERNETES] {
        let text = read(file);
        let images = values(&text.lines().collect::<Vec<_>>(), "image:");
        assert!(!images.is_empty(), "{file}: no image: lines found");
        for image in &images {
            assert_pinned(file, image);
        }
    }
}

#[test]
fn compose_health_check_is_tollgate_healthcheck() {
    let compose = read(COMPOSE);
    let service = compose_service(&compose, "tollgate");
    let tests: Vec<String> = blocks(&service, "healthcheck:")
        .iter()
        .flat_map(|block| values(block, "test:"))
        .collect();
    match tests.as_slice() {
        [test] => assert_eq!(
            json_strings(test),
            ["CMD", "/usr/local/bin/tollgate", "healthcheck"],
            "{COMPOSE}: tollgate's healthcheck"
        ),
        other => panic!("{COMPOSE}: expected one healthcheck test for tollgate, found {other:?}"),
    }
}

/// A tag other than `latest`, or a digest.
fn assert_pinned(file: &str, image: &str) {
    let digest = image.split_once("@sha256:").map(|(_, digest)| digest);
    if let Some(digest) = digest {
        assert!(
            digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "{file}: a malformed digest in {image}"
        );
    }
    match tag(image) {
        Some("latest") => panic!("{file}: {image} is :latest"),
        Some(_) => {}
        None => assert!(
            digest.is_some(),
            "{file}: {image} names neither a tag nor a digest"
        ),
    }
}

/// `registry:5000/name:tag@sha256:...` -> `registry:5000/name`.
fn repository(image: &str) -> &str {
    let name = image.split('@').next().unwrap_or(image);
    match name.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => repository,
        _ => name,
    }
}

/// `registry:5000/name:tag@sha256:...` -> `tag`.
fn tag(image: &str) -> Option<&str> {
    let name = image.split('@').next().unwrap_or(image);
    name.rsplit_once(':')
        .map(|(_, tag)| tag)
        .filter(|tag| !tag.contains('/'))
}

/// `1.95`, `1.95.0-bookworm`; not `1-bookworm` or `bookworm`.
fn starts_with_minor_version(tag: &str) -> bool {
    let mut parts = tag.split(['.', '-']);
    let is_number =
        |part: Option<&str>| part.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    is_number(parts.next()) && is_number(parts.next())
}

/// The Dockerfile's instructions as (keyword, arguments), continuation lines joined and
/// comments dropped.
fn dockerfile_instructions(dockerfile: &str) -> Vec<(String, String)> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let instruction = std::mem::take(&mut current);
                let (word, rest) = instruction
                    .split_once(char::is_whitespace)
                    .unwrap_or((&instruction, ""));
                instructions.push((word.to_owned(), rest.trim().to_owned()));
            }
        }
    }
    instructions
}

/// `["a", "b"]` -> `a`, `b` (no escapes: ours have none).
fn json_strings(array: &str) -> Vec<String> {
    array
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|item| item.trim().trim_matches('"').to_owned())
        .filter(|item| !item.is_empty())
        .collect()
}

// --- compose ----------------------------------------------------------------------------------

/// `KEY=value` pairs of the tollgate service's `environment:` list.
fn compose_environment() -> Vec<(String, String)> {
    let compose = read(COMPOSE);
    let service = compose_service(&compose, "tollgate");
    let mut vars = Vec::new();
    for block in blocks(&service, "environment:") {
        for item in children(&block) {
            let entry = match item.trim().strip_prefix("- ") {
                Some(entry) => unquote(entry),
                None => panic!("{COMPOSE}: write environment: as a list of KEY=value, not {item:?}"),
            };
            match entry.split_once('=') {
                Some((name, value)) => vars.push((name.to_owned(), value.to_owned())),
                None => panic!("{COMPOSE}: an environment entry without '=': {entry:?}"),
            }
        }
    }
    vars
}

/// The lines of service `name` under `services:`.
fn compose_service<'a>(compose: &'a str, name: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = compose.lines().collect();
    let services = blocks(&lines, "services:");
    let [services] = services.as_slice() else {
        panic!("{COMPOSE}: expected one services: block");
    };
    match blocks(services, &format!("{name}:")).as_slice() {
        [service] => service.clone(),
        other => panic!("{COMPOSE}: expected one service {name}, found {}", other.len()),
    }
}

/// `15s`, `1m`, `1m30s`.
fn compose_duration(text: &str) -> Duration {
    let mut total = Duration::ZERO;
    let mut digits = String::new();
    for c in unquote(text).chars() {
        match c {
            '0'..='9' => digits.push(c),
            's' | 'm' => {
                let n = number(COMPOSE, &std::mem::take(&mut digits));
                total += Duration::from_secs(if c == 'm' { n * 60 } else { n });
            }
            _ => panic!("{COMPOSE}: a duration this test does not read: {text}"),
        }
    }
    assert!(digits.is_empty(), "{COMPOSE}: a duration without a unit: {text}");
    total
}

// --- kubernetes -------------------------------------------------------------------------------

/// What the Deployment's containers see: every ConfigMap and Secret key (they come in through
/// `envFrom`) and every `env:` entry, as shipped.
fn kubernetes_environment() -> Vec<(String, String)> {
    let manifest = read(KUBERNETES);
    let mut vars = kubernetes_variables(&manifest);
    // The rules file where the pod has it mounted: here, a copy of the ConfigMap's.
    if let Some((_, path)) = vars.iter_mut().find(|(name, _)| name == "RULES_FILE") {
        // Written once per run: the tests run in parallel, and one must never read another's
        // half-written copy.
        static COPY: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
        let copy = COPY.get_or_init(|| {
            let copy =
                std::env::temp_dir().join(format!("tollgate-deploy-{}-rules.toml", std::process::id()));
            std::fs::write(&copy, kubernetes_rules(&manifest)).unwrap();
            copy
        });
        *path = copy.display().to_string();
    }
    vars
}

/// The variables the manifest sets, as written.
fn kubernetes_variables(manifest: &str) -> Vec<(String, String)> {
    let mut vars = Vec::new();
    for (kind, header) in [("ConfigMap", "data:"), ("Secret", "stringData:")] {
        let document = match kind {
            "ConfigMap" => kubernetes_named(manifest, kind, Some("tollgate")),
            _ => kubernetes_document(manifest, kind),
        };
        for block in blocks(&document, header) {
            for item in children(&block) {
                match item.trim().split_once(':') {
                    Some((name, value)) => vars.push((name.to_owned(), unquote(value.trim()).to_owned())),
                    None => panic!("{KUBERNETES}: a {kind} entry that is not KEY: value: {item:?}"),
                }
            }
        }
    }
    let deployment = kubernetes_document(manifest, "Deployment");
    for block in blocks(&deployment, "env:") {
        for item in children(&block) {
            if let Some(name) = item.trim().strip_prefix("- name:") {
                vars.push((unquote(name.trim()).to_owned(), String::new()));
            }
        }
    }
    vars
}

/// The shipped environment with the secret an operator is told to create.
fn filled_kubernetes_environment() -> Vec<(String, String)> {
    kubernetes_environment()
        .into_iter()
        .map(|(name, value)| match (name.as_str(), value.is_empty()) {
            ("KEY_HASH_SECRET", true) => (name, TEST_SECRET.to_owned()),
            _ => (name, value),
        })
        .collect()
}

/// The lines of the one `---`-separated document of `kind`.
fn kubernetes_document<'a>(manifest: &'a str, kind: &str) -> Vec<&'a str> {
    kubernetes_named(manifest, kind, None)
}

/// The document of `kind` named `name` (`None`: the only one of its kind).
fn kubernetes_named<'a>(manifest: &'a str, kind: &str, name: Option<&str>) -> Vec<&'a str> {
    let mut documents: Vec<Vec<&str>> = vec![Vec::new()];
    for line in manifest.lines() {
        if line.trim_end() == "---" {
            documents.push(Vec::new());
        } else if let Some(document) = documents.last_mut() {
            document.push(line);
        }
    }
    let kind_line = format!("kind: {kind}");
    let name_line = name.map(|name| format!("name: {name}"));
    let mut found = documents.into_iter().filter(|document| {
        document.iter().any(|line| line.trim_end() == kind_line)
            && name_line
                .as_ref()
                .is_none_or(|name| document.iter().any(|line| line.trim() == name))
    });
    match (found.next(), found.next()) {
        (Some(document), None) => document,
        _ => panic!("{KUBERNETES}: expected exactly one {kind}"),
    }
}

// --- plain YAML, by indentation -----------------------------------------------------------------

/// Every block whose header line (trimmed) is `header`, optionally a list item (`- header`):
/// the lines indented deeper than the header, up to the next line that is not.
fn blocks<'a>(lines: &[&'a str], header: &str) -> Vec<Vec<&'a str>> {
    let mut found = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        if trimmed != header && trimmed.strip_prefix("- ") != Some(header) {
            continue;
        }
        let depth = indent(line);
        let block = lines[at + 1..]
            .iter()
            .copied()
            .filter(|line| !is_blank(line))
            .take_while(|line| indent(line) > depth)
            .collect();
        found.push(block);
    }
    found
}

/// The lines of a block at its shallowest indentation: its direct entries.
fn children<'a>(block: &[&'a str]) -> Vec<&'a str> {
    let depth = block.iter().map(|line| indent(line)).min().unwrap_or(0);
    block
        .iter()
        .copied()
        .filter(|line| indent(line) == depth)
        .collect()
}

/// The values of every `key: value` line, comments and quotes removed.
fn values(lines: &[&str], key: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|line| !is_blank(line))
        .filter_map(|line| line.trim().strip_prefix(key))
        .map(|value| unquote(value.split(" #").next().unwrap_or(value).trim()).to_owned())
        .collect()
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Empty, or only a comment.
fn is_blank(line: &str) -> bool {
    let trimmed = line.trim();
    trimmed.is_empty() || trimmed.starts_with('#')
}

fn unquote(text: &str) -> &str {
    let text = text.trim();
    ['"', '\'']
        .iter()
        .find_map(|quote| {
            text.strip_prefix(*quote)
                .and_then(|rest| rest.strip_suffix(*quote))
        })
        .unwrap_or(text)
}

fn number(file: &str, text: &str) -> u64 {
    match text.parse() {
        Ok(n) => n,
        Err(error) => panic!("{file}: {text:?} is not a whole number: {error}"),
    }
}

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) => panic!("cannot read {}: {error}", path.display()),
    }
}
