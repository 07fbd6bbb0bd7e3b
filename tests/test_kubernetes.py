"""deploy/kubernetes without a cluster: every overlay, alone and with each component, builds with `kubectl
kustomize`; every object validates against its schema (kubernetes-validate for the built-in kinds, the projects'
own CRD schemas in tests/k8s_schemas for the rest), strictly; the generated monitoring objects are their sources'
copies; the probes, ports and flags fit the real server; the objects that refer to each other agree.

tests/test_fleet_e2e.py runs the autoscalers' and the PrometheusRule's PromQL against a live fleet."""

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy.kubernetes.build import COMPOSE_ONLY
from server.__main__ import build_parser
from server.api.health import PROBE_PATHS, UNAUTHENTICATED_PATHS
from tests.api_server import APIServer
from tests.dashboard_queries import VIGIL_METRICS
from tests.kubernetes_objects import KUBERNETES, ROOT, build, find, of_kind, variants

KUBERNETES_VERSION = "1.32.0"  # the oldest release the objects are meant for (native sidecars, HPA v2, policy/v1)
SCHEMAS = Path(__file__).parent / "k8s_schemas"
CUSTOM_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda.sh-v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring.coreos.com-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring.coreos.com-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-gateway.networking.k8s.io-v1.json",
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-inference.networking.k8s.io-v1.json",
    ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"): "alertmanagerconfig-monitoring.coreos.com-v1alpha1.json",
}
VARIANTS = variants()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[tuple[str, tuple[str, ...]], list[dict]]:
    workdir = tmp_path_factory.mktemp("kustomize")
    return {variant: build(*variant, workdir) for variant in VARIANTS}


def servers(objects: list[dict]) -> list[dict]:
    return [obj for obj in of_kind(objects, "Deployment")
            if obj["metadata"]["labels"]["app.kubernetes.io/component"] == "server"]  # fmt: skip


def container(deployment: dict) -> dict:
    [found] = deployment["spec"]["template"]["spec"]["containers"]
    return found


# --- building and validating ---------------------------------------------------------------------------------


def test_every_variant_builds_into_one_namespace(built):
    for variant, objects in built.items():
        assert objects, variant
        namespaced = [obj for obj in objects if obj["kind"] != "Namespace"]
        assert {obj["metadata"].get("namespace") for obj in namespaced} == {"vigil"}, variant
        assert all(obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "vigil" for obj in namespaced), variant


def strict(schema: object) -> object:
    """The schema with unknown fields refused wherever the API server would refuse them (kubectl's default
    field validation is strict): objects with declared properties and no preserve-unknown-fields."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    found = {key: strict(value) for key, value in schema.items()}
    pattern = found.get("pattern")
    if isinstance(pattern, str) and "(?i)" in pattern[1:]:
        # Go's regexp takes a flag group anywhere (AlertmanagerConfig's weekdays); Python's only at the start.
        found["pattern"] = "(?i)" + pattern.replace("(?i)", "")
    if "properties" in found and "additionalProperties" not in found and \
            not found.get("x-kubernetes-preserve-unknown-fields"):  # fmt: skip
        found["additionalProperties"] = False
    return found


@pytest.fixture(scope="module")
def custom_schemas() -> dict[tuple[str, str], dict]:
    return {kind: strict(json.loads((SCHEMAS / name).read_text())) for kind, name in CUSTOM_KINDS.items()}


def test_every_object_validates_against_its_schema(built, custom_schemas):
    kinds = set()
    for variant, objects in built.items():
        for obj in objects:
            kind = (obj["apiVersion"], obj["kind"])
            kinds.add(kind)
            where = f"{variant}: {obj['kind']}/{obj['metadata']['name']}"
            if kind in custom_schemas:
                errors = [error.message for error in
                          jsonschema.Draft7Validator(custom_schemas[kind]).iter_errors(obj)]  # fmt: skip
                assert not errors, f"{where}: {errors}"
            else:
                try:
                    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
                except kubernetes_validate.ValidationError as error:
                    raise AssertionError(f"{where}: {'.'.join(map(str, error.path))}: {error.message}") from None
    assert set(CUSTOM_KINDS) <= kinds, "a schema no object uses"


def test_the_schema_check_refuses_a_misspelt_field(custom_schemas):
    scaled = find(build("cpu", (), Path("/nonexistent")), "ScaledObject", "vigil")
    scaled["spec"]["minReplicas"] = 1  # KEDA's field is minReplicaCount
    assert list(jsonschema.Draft7Validator(custom_schemas[("keda.sh/v1alpha1", "ScaledObject")]).iter_errors(scaled))
    deployment = servers(build("cpu", (), Path("/nonexistent")))[0]
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 90
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_generated_monitoring_objects_are_up_to_date():
    result = subprocess.run([sys.executable, str(KUBERNETES / "build.py"), "--check"], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_the_prometheusrule_holds_the_compose_rules_less_their_own_and_the_kubernetes_ones(built):
    rule = find(built[("cpu", ())], "PrometheusRule", "vigil")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    compose = [item for path in sorted((ROOT / "alerts/rules").glob("*.yml"))
               for group in yaml.safe_load(path.read_text())["groups"] for item in group["rules"]]  # fmt: skip
    kubernetes = [item for group in yaml.safe_load((KUBERNETES / "rules/kubernetes.yml").read_text())["groups"]
                  for item in group["rules"]]  # fmt: skip
    shipped = [item for group in rule["spec"]["groups"] for item in group["rules"]]
    alerts = {item.get("alert") for item in compose}
    assert alerts >= COMPOSE_ONLY, "a name that no longer exists"
    # The same rule, word for word, wherever the meaning is the same; every alert labelled with its namespace,
    # which the AlertmanagerConfig's routes match on.
    assert all(item["labels"]["namespace"] == "vigil" for item in shipped if "alert" in item)
    unlabelled = [{**item, "labels": {k: v for k, v in item["labels"].items() if k != "namespace"}}
                  if "alert" in item else item for item in shipped]  # fmt: skip
    assert unlabelled == [item for item in compose if item.get("alert") not in COMPOSE_ONLY] + kubernetes
    # Nothing that pages on Kubernetes keys a replica's health on its instance, a pod IP that changes.
    assert not any("max_over_time(up{" in item["expr"] for item in shipped)


def test_the_kubernetes_rules_pass_their_promtool_tests_and_follow_the_alert_conventions():
    tests = [str(path) for path in sorted((KUBERNETES / "rules/tests").glob("*.yml"))]
    result = subprocess.run(["promtool", "test", "rules", *tests], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    runbook = (ROOT / "docs/runbook.md").read_text().lower()
    for group in yaml.safe_load((KUBERNETES / "rules/kubernetes.yml").read_text())["groups"]:
        for item in group["rules"]:
            assert item["labels"]["severity"] in ("critical", "warning")
            assert {"summary", "description", "runbook_url", "dashboard_url"} <= set(item["annotations"])
            assert f"### {item['alert'].lower()}" in runbook, item["alert"]


def test_every_dashboard_is_a_configmap_for_grafanas_sidecar(built):
    maps = {obj["metadata"]["name"]: obj for obj in of_kind(built[("cpu", ())], "ConfigMap")
            if obj["metadata"].get("labels", {}).get("grafana_dashboard") == "1"}  # fmt: skip
    dashboards = sorted((ROOT / "dashboards").glob("*.json"))
    assert sorted(maps) == [f"vigil-dashboard-{path.stem}" for path in dashboards]
    for path in dashboards:
        [(key, text)] = maps[f"vigil-dashboard-{path.stem}"]["data"].items()
        assert key.endswith(".json") and json.loads(text) == json.loads(path.read_text())


# --- the replicas --------------------------------------------------------------------------------------------


def serve_flags(deployment: dict):
    """The Deployment's command line, parsed by the server's own parser."""
    args = container(deployment)["args"]
    assert args[:4] == ["python", "-m", "server", "serve"]
    return build_parser().parse_args(args[3:])


def test_probes_and_ports_are_the_servers(built):
    for variant, objects in built.items():
        for deployment in servers(objects):
            flags, spec = serve_flags(deployment), container(deployment)
            [port] = spec["ports"]
            assert (port["name"], port["containerPort"]) == ("http", flags.port)
            probes = {kind: spec[f"{kind}Probe"]["httpGet"] for kind in ("startup", "liveness", "readiness")}
            assert {kind: probe["path"] for kind, probe in probes.items()} == {
                "startup": "/readyz", "liveness": "/livez", "readiness": "/readyz"}, variant  # fmt: skip
            assert all(probe["port"] == "http" for probe in probes.values())
            # API keys are on: the probes must be paths that need none.
            assert {probe["path"] for probe in probes.values()} <= UNAUTHENTICATED_PATHS <= PROBE_PATHS


def test_pods_stop_after_their_drain_and_start_slow_enough_for_a_model_load(built):
    for deployment in servers(built[("gpu", ("canary",))]):
        flags, spec = serve_flags(deployment), container(deployment)
        pod = deployment["spec"]["template"]["spec"]
        [sleep] = [int(word) for word in spec["lifecycle"]["preStop"]["exec"]["command"] if word.isdigit()]
        assert pod["terminationGracePeriodSeconds"] > sleep + flags.shutdown_timeout
        startup = spec["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "ten minutes to load a model"
        strategy = deployment["spec"]["strategy"]["rollingUpdate"]
        assert strategy["maxUnavailable"] == 0 and strategy["maxSurge"] >= 1


def test_replicas_run_as_non_root_on_a_read_only_root_with_api_keys_from_a_secret(built):
    for deployment in servers(built[("cpu", ("canary",))]):
        pod, spec = deployment["spec"]["template"]["spec"], container(deployment)
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        context = spec["securityContext"]
        assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
        assert context["capabilities"]["drop"] == ["ALL"]
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        mounts = {mount["mountPath"]: mount["name"] for mount in spec["volumeMounts"]}
        key_file = Path(serve_flags(deployment).api_key_file)
        assert volumes[mounts[str(key_file.parent)]]["secret"]["secretName"] == "vigil-api-keys"
        assert "emptyDir" in volumes[mounts["/tmp"]], "the caches written at run time need a writable /tmp"
        assert not [env for env in spec.get("env", []) if "KEY" in env["name"]], "keys come from the file only"


def test_only_the_gpu_overlay_asks_for_gpus(built):
    for (overlay, _), objects in built.items():
        for deployment in servers(objects):
            resources = container(deployment)["resources"]
            assert resources["requests"]["cpu"] and resources["limits"]["memory"]
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", container(deployment)["image"]), "the overlay tags every image"
            gpus = resources["limits"].get("nvidia.com/gpu")
            assert gpus == (1 if overlay == "gpu" else None), (overlay, deployment["metadata"]["name"])


@pytest.mark.server
def test_the_deployments_command_line_serves_its_probes(tiny_folder, tmp_path, built):
    """The real server, started with the Deployment's flags (its address and key file moved to this machine),
    answers every probe path on its port without credentials, and the API only with a key."""
    deployment = find(built[("cpu", ())], "Deployment", "vigil")
    args = container(deployment)["args"][4:]
    keys = tmp_path / "keys"
    keys.write_text("k8s-test-key\n")
    args = [str(keys) if arg == "/etc/vigil/api-keys/keys" else arg for arg in args]
    args = [arg for index, arg in enumerate(args) if arg not in ("--host", "--port")
            and (index == 0 or args[index - 1] not in ("--host", "--port"))]  # fmt: skip
    server = APIServer(tiny_folder, *args).wait_ready()
    try:
        spec = container(deployment)
        for kind in ("startup", "liveness", "readiness"):
            path = spec[f"{kind}Probe"]["httpGet"]["path"]
            assert httpx.get(server.base_url + path, timeout=30).status_code == 200, path
        assert httpx.get(f"{server.base_url}/v1/models", timeout=30).status_code == 401
        headers = {"Authorization": "Bearer k8s-test-key"}
        assert httpx.get(f"{server.base_url}/v1/models", headers=headers, timeout=30).status_code == 200
    finally:
        server.stop()


# --- what refers to what -----------------------------------------------------------------------------------


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_services_budgets_and_pools_select_their_tracks_pods(built):
    objects = built[("cpu", ("canary",))]
    pods = {obj["metadata"]["name"]: obj["spec"]["template"]["metadata"]["labels"] for obj in servers(objects)}
    assert set(pods) == {"vigil", "vigil-canary"}
    assert all(selects(find(objects, "Service", "vigil")["spec"]["selector"], labels) for labels in pods.values())
    for track in pods:
        for kind in ("PodDisruptionBudget", "InferencePool"):
            selector = find(objects, kind, track)["spec"]["selector"]["matchLabels"]
            assert [name for name, labels in pods.items() if selects(selector, labels)] == [track], (kind, track)
        pool, port = find(objects, "InferencePool", track), container(find(objects, "Deployment", track))["ports"][0]
        assert pool["spec"]["targetPorts"] == [{"number": port["containerPort"]}]
        picker = pool["spec"]["endpointPickerRef"]
        service = find(objects, "Service", picker["name"])
        assert picker["port"]["number"] in [entry["port"] for entry in service["spec"]["ports"]]
        epp = find(objects, "Deployment", picker["name"])
        assert selects(service["spec"]["selector"], epp["spec"]["template"]["metadata"]["labels"])
        args = container(epp)["args"]
        assert args[args.index("--pool-name") + 1] == track


def test_a_drain_never_takes_the_last_replica_and_replicas_spread_over_nodes(built):
    for (overlay, components), objects in built.items():
        assert find(objects, "PodDisruptionBudget", "vigil")["spec"] == {
            "minAvailable": 1, "selector": find(objects, "PodDisruptionBudget", "vigil")["spec"]["selector"]}
        scaler = (of_kind(objects, "ScaledObject") + of_kind(objects, "HorizontalPodAutoscaler"))[0]["spec"]
        assert scaler.get("minReplicaCount", scaler.get("minReplicas")) == 2, (overlay, components)
        spread = find(objects, "Deployment", "vigil")["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert [rule["topologyKey"] for rule in spread] == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
        labels = find(objects, "Deployment", "vigil")["spec"]["template"]["metadata"]["labels"]
        assert all(selects(rule["labelSelector"]["matchLabels"], labels) for rule in spread)
        if "canary" in components:  # one canary replica may go, or it would block every drain of its node
            assert find(objects, "PodDisruptionBudget", "vigil-canary")["spec"]["maxUnavailable"] == 1


def test_the_route_weighs_the_tracks_pools(built):
    for components, weights in (((), {"vigil": 100}), (("canary",), {"vigil": 90, "vigil-canary": 10})):
        objects = built[("gpu", components)]
        [rule] = find(objects, "HTTPRoute", "vigil")["spec"]["rules"]
        assert {ref["name"]: ref["weight"] for ref in rule["backendRefs"]} == weights
        for ref in rule["backendRefs"]:
            assert ref["kind"] == "InferencePool" and find(objects, "InferencePool", ref["name"])


def test_one_autoscaler_owns_the_stable_track_and_none_the_canary(built):
    for (overlay, components), objects in built.items():
        scalers = of_kind(objects, "ScaledObject") + of_kind(objects, "HorizontalPodAutoscaler")
        assert [scaler["kind"] for scaler in scalers] == [
            "HorizontalPodAutoscaler" if "hpa" in components else "ScaledObject"], (overlay, components)
        [scaler] = scalers
        assert scaler["spec"]["scaleTargetRef"]["name"] == "vigil"
        assert "replicas" not in find(objects, "Deployment", "vigil")["spec"], "the autoscaler owns the count"
        if "canary" in components:
            assert find(objects, "Deployment", "vigil-canary")["spec"]["replicas"] == 1


def test_keda_scales_on_waiting_requests_per_replica_and_gpu_utilisation(built):
    scaled = find(built[("gpu", ())], "ScaledObject", "vigil")["spec"]
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"], scaled["cooldownPeriod"]) == (2, 8, 300)
    assert scaled["fallback"] == {"failureThreshold": 3, "replicas": 2}
    triggers = {trigger["name"]: trigger for trigger in scaled["triggers"]}
    assert {trigger["type"] for trigger in triggers.values()} == {"prometheus"}
    waiting, gpu = triggers["waiting-requests-per-replica"], triggers["gpu-utilisation"]
    assert waiting["metricType"] == "AverageValue" and "vigil_num_requests_waiting{" in waiting["metadata"]["query"]
    assert gpu["metricType"] == "Value" and "vigil_gpu_utilization_ratio{" in gpu["metadata"]["query"]
    # A query that finds nothing is a failure that reaches the fallback, never a silent zero.
    for trigger in triggers.values():
        assert trigger["metadata"]["ignoreNullValues"] == "false"
        assert "vector(0)" not in trigger["metadata"]["query"]
    cpu = find(built[("cpu", ())], "ScaledObject", "vigil")["spec"]["triggers"]
    assert [trigger["name"] for trigger in cpu] == ["waiting-requests-per-replica"], "a CPU replica has no GPU"


def test_the_overlays_namespace_reaches_every_query_and_alert(tmp_path):
    """kustomize's namespace setting rewrites metadata only; the overlays' replacements carry it into the KEDA
    queries, the kube-state-metrics queries and the alerts' namespace label the AlertmanagerConfig matches on."""
    for overlay in ("cpu", "gpu"):
        objects = build(overlay, ("alerting",), tmp_path, namespace="team-a")
        assert {obj["metadata"].get("namespace") for obj in objects if obj["kind"] != "Namespace"} == {"team-a"}
        for trigger in find(objects, "ScaledObject", "vigil")["spec"]["triggers"]:
            assert 'namespace="team-a"' in trigger["metadata"]["query"], trigger
        rules = [item for group in find(objects, "PrometheusRule", "vigil")["spec"]["groups"]
                 for item in group["rules"]]  # fmt: skip
        assert all(item["labels"]["namespace"] == "team-a" for item in rules if "alert" in item)
        text = yaml.safe_dump(objects)
        assert 'namespace="vigil"' not in text and "namespace: vigil\n" not in text


def routes(route: dict) -> list[tuple]:
    """A CRD route tree as compose's alertmanager.yml writes it: (receiver, matchers, timings) depth first."""
    matchers = [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in route.get("matchers", [])]
    timings = tuple(route.get(key) for key in ("groupWait", "groupInterval", "repeatInterval"))
    found = [(route["receiver"], matchers, timings, route.get("activeTimeIntervals", []))]
    return found + [entry for child in route.get("routes", []) for entry in routes(child)]


def compose_routes(route: dict) -> list[tuple]:
    timings = tuple(route.get(key) for key in ("group_wait", "group_interval", "repeat_interval"))
    found = [(route["receiver"], route.get("matchers", []), timings, route.get("active_time_intervals", []))]
    return found + [entry for child in route.get("routes", []) for entry in compose_routes(child)]


def test_the_alertmanagerconfig_routes_inhibits_and_beats_as_compose_does(built):
    objects = built[("cpu", ("alerting",))]
    config = find(objects, "AlertmanagerConfig", "vigil")["spec"]
    compose = yaml.safe_load((ROOT / "alerts/alertmanager.yml").read_text())
    assert routes(config["route"]) == compose_routes(compose["route"])
    assert config["route"]["groupBy"] == compose["route"]["group_by"]
    assert {receiver["name"] for receiver in config["receivers"]} == {r["name"] for r in compose["receivers"]}
    assert len(config["inhibitRules"]) == len(compose["inhibit_rules"])
    [hours] = config["muteTimeIntervals"]
    assert hours["timeIntervals"] == [{"weekdays": ["monday:friday"], "times": [
        {"startTime": "09:00", "endTime": "18:00"}]}]
    # Every alert an inhibition or route names is one this cluster's rules raise; the heartbeat is among them.
    alerts = {item["alert"]: item for group in find(objects, "PrometheusRule", "vigil")["spec"]["groups"]
              for item in group["rules"] if "alert" in item}  # fmt: skip
    named = [m["value"] for rule in config["inhibitRules"] for m in rule["sourceMatch"] + rule["targetMatch"]
             if m["name"] == "alertname"]  # fmt: skip
    named += [m["value"] for route in config["route"]["routes"] for m in route.get("matchers", [])
              if m["name"] == "alertname"]  # fmt: skip
    assert "VigilWatchdog" in named
    for value in named:
        assert set(value.split("|")) <= set(alerts), value
    severities = {item["labels"]["severity"] for item in alerts.values()} - {"none"}
    routed = {m["value"] for route in config["route"]["routes"] for m in route.get("matchers", [])
              if m["name"] == "severity"}  # fmt: skip
    assert severities == routed
    # Secrets stay in a Secret: every receiver reads its key from vigil-alerting.
    for receiver in config["receivers"]:
        [[settings]] = [value for key, value in receiver.items() if key != "name"]
        secrets = [value for value in settings.values() if isinstance(value, dict)]
        assert secrets and all(secret["name"] == "vigil-alerting" for secret in secrets), receiver


def test_the_endpoint_picker_reads_vigils_own_metrics(built):
    config_map = find(built[("cpu", ())], "ConfigMap", "vigil-epp")
    [config] = [yaml.safe_load(text) for text in config_map["data"].values()]
    plugins = {plugin["type"]: plugin for plugin in config["plugins"]}
    extractor = plugins["core-metrics-extractor"]["parameters"]
    [engine] = [entry for entry in extractor["engineConfigs"] if entry["name"] == extractor["defaultEngine"]]
    mapping = {field: engine[field] for field in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")}
    assert mapping == {"queuedRequestsSpec": "vigil_num_requests_waiting",
                       "runningRequestsSpec": "vigil_num_requests_running",
                       "kvUsageSpec": "vigil_kv_cache_usage_ratio"}  # fmt: skip
    assert all(VIGIL_METRICS[name] == "gauge" for name in mapping.values())
    assert engine["cacheInfoSpec"] == "vigil_kv_cache_config_info"
    # The cache info's labels, as telemetry/metrics.py defines them.
    metrics_source = (ROOT / "telemetry/metrics.py").read_text()
    definition = re.search(r'"vigil_kv_cache_config_info".*?\)', metrics_source, flags=re.S).group(0)
    assert engine["cacheBlockSizeLabelName"] in definition and engine["cacheNumBlocksLabelName"] in definition
    referenced = {ref["pluginRef"] for profile in config["schedulingProfiles"] for ref in profile["plugins"]}
    referenced |= {source["pluginRef"] for source in config["dataLayer"]["sources"]}
    referenced |= {ref["pluginRef"] for source in config["dataLayer"]["sources"] for ref in source["extractors"]}
    assert referenced == set(plugins)
    epp = container(find(built[("cpu", ())], "Deployment", "vigil-epp"))
    assert epp["args"][epp["args"].index("--config-file") + 1] == f"/config/{next(iter(config_map['data']))}"


def test_the_network_policy_lets_in_the_http_port_only(built):
    policy = find(built[("cpu", ())], "NetworkPolicy", "vigil")["spec"]
    assert selects(policy["podSelector"]["matchLabels"], find(built[("cpu", ())], "Deployment", "vigil")["spec"][
        "template"]["metadata"]["labels"])  # fmt: skip
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    assert [port["port"] for rule in policy["ingress"] for port in rule["ports"]] == ["http"]


def test_spans_go_to_the_collector_a_configmap_names_through_the_port_the_policy_opens(built):
    objects = built[("cpu", ())]
    env = {var["name"]: var for var in container(find(objects, "Deployment", "vigil"))["env"]}
    endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"]["valueFrom"]["configMapKeyRef"]
    assert endpoint == {"name": "vigil-telemetry", "key": "otlp-endpoint", "optional": True}  # no ConfigMap: off
    assert env["OTEL_SERVICE_NAME"]["value"] == "vigil"
    assert env["OTEL_RESOURCE_ATTRIBUTES"]["value"] == "k8s.pod.name=$(POD_NAME)"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    names = list(env)
    assert names.index("POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES"), "defined before it is expanded"
    policy = find(objects, "NetworkPolicy", "vigil")["spec"]
    assert 4317 in [port["port"] for rule in policy["egress"] for port in rule["ports"]]


def test_the_service_monitor_scrapes_the_replicas_as_job_vigil_with_their_track(built):
    objects = built[("cpu", ())]
    monitor, service = find(objects, "ServiceMonitor", "vigil")["spec"], find(objects, "Service", "vigil")
    assert selects(monitor["selector"]["matchLabels"], service["metadata"]["labels"])
    assert [endpoint["port"] for endpoint in monitor["endpoints"]] == [service["spec"]["ports"][0]["name"]]
    assert [endpoint["path"] for endpoint in monitor["endpoints"]] == ["/metrics"]
    # No jobLabel: the job is the Service's name, which the alert rules select on.
    assert "jobLabel" not in monitor and service["metadata"]["name"] == "vigil"
    assert monitor["podTargetLabels"] == ["app.kubernetes.io/track"]


@pytest.mark.parametrize("component", ["model-volume", "model-init"])
def test_a_model_from_a_volume_or_a_model_image_reaches_every_server_read_only(built, component):
    objects = built[("cpu", ("canary", component))]
    deployments = servers(objects)
    assert {d["metadata"]["name"] for d in deployments} == {"vigil", "vigil-canary"}
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        spec = container(deployment)
        assert spec["args"][-2:] == ["--model", "/models"] and spec["args"].count("--model") == 1
        assert {"name": "models", "mountPath": "/models", "readOnly": True} in spec["volumeMounts"]
        [volume] = [volume for volume in pod["volumes"] if volume["name"] == "models"]
        if component == "model-volume":
            assert volume["persistentVolumeClaim"] == {"claimName": "vigil-models", "readOnly": True}
            assert "initContainers" not in pod
        else:
            assert "emptyDir" in volume
            [init] = pod["initContainers"]
            assert init["image"] == "vigil-model"
            assert {"name": "models", "mountPath": "/models"} in init["volumeMounts"]
            assert init["securityContext"]["readOnlyRootFilesystem"] and init["resources"]["limits"]["memory"]
    if component == "model-volume":
        claim = find(objects, "PersistentVolumeClaim", "vigil-models")
        assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    # Without either, the model is the image's own: no --model flag, no models volume.
    baked = container(servers(built[("cpu", ())])[0])
    assert "--model" not in baked["args"] and all(m["name"] != "models" for m in baked["volumeMounts"])
