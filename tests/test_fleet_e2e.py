"""The fleet on 127.0.0.1: three real Vigil replicas (blue vigil-1 and vigil-2, green vigil-green-1 with another
model version) behind the real HAProxy running deploy/haproxy/haproxy.cfg (tests/fleet.py), scraped by the real
Prometheus, which also loads the PrometheusRule of deploy/kubernetes.

A busy replica gets clearly fewer new requests; a SIGTERM under load, a scripted rolling restart under a client
loop and a blue-green switch under a client loop each fail no request. Then, on the fleet's live metrics: every
query of the KEDA ScaledObject, of the HPA's prometheus-adapter rules and of the PrometheusRule returns a number,
and so does every query of the fleet dashboard. The tests run in file order and share the fleet.
"""

import concurrent.futures
import math
import time
from types import SimpleNamespace

import httpx
import pytest
import yaml

from deploy.haproxy.rollout import restart, shift
from server.bench.local_server import free_port
from tests.dashboard_queries import HAPROXY_METRICS, dashboard_queries
from tests.fleet import ClientLoop, HAProxy, Replica, prometheus_config
from tests.kubernetes_objects import KUBERNETES, build, find
from tests.ops_stack import Prometheus, wait_until
from tests.tiny_model import write_tiny_llama

pytestmark = [pytest.mark.e2e, pytest.mark.server]

MAX_NUM_SEQS = 4
# Each replica: a small batch (so that a few long requests fill it) and a drain longer than any request here.
REPLICA_ARGS = ("--max-num-seqs", str(MAX_NUM_SEQS), "--shutdown-timeout", "60")
BLUE = ("vigil-1", "vigil-2")
GREEN = "vigil-green-1"
# A long request holds a batch slot for hundreds of steps: up to the tiny model's 512 positions.
LONG_REQUEST = {"model": "smollm", "prompt": "hello", "max_tokens": 480, "ignore_eos": True, "temperature": 1.0}
# Twice the batch: while the first ones run, the rest wait, and take over the batch as the first ones end.
LONG_REQUESTS = 2 * MAX_NUM_SEQS
# The waiting-requests test's queue on vigil-1: this many batches of long requests at once.
QUEUE_BATCHES = 4
SHORT_REQUEST = {"model": "smollm", "prompt": "Hi", "max_tokens": 4, "temperature": 0.0}
SHORT_REQUESTS = 40
SHORT_CLIENTS = 4
DRAIN_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 120.0
SERVED_AFTER = 20  # requests the client loop must get answered after each change, to show the fleet still serves


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_folder, smollm_folder):
    workdir = tmp_path_factory.mktemp("fleet")
    # Green serves the next version of the model: the same architecture, other weights.
    next_version = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-v2"), smollm_folder, seed=1)
    replicas = {name: Replica(name, tiny_folder, *REPLICA_ARGS) for name in BLUE}
    replicas[GREEN] = Replica(GREEN, next_version, *REPLICA_ARGS)
    haproxy = prometheus = None
    try:
        for replica in replicas.values():
            replica.server.wait_ready()
        haproxy = HAProxy(workdir, list(replicas.values()))
        haproxy.wait_up("blue", *BLUE)
        haproxy.wait_up("green", GREEN)
        prometheus = start_prometheus(workdir, replicas, haproxy)
        yield SimpleNamespace(haproxy=haproxy, replicas=replicas, prometheus=prometheus, workdir=workdir)
    finally:
        for daemon in (prometheus, haproxy):
            if daemon is not None:
                daemon.stop()
        for replica in replicas.values():
            replica.server.stop()


def start_prometheus(workdir, replicas: dict[str, Replica], haproxy: HAProxy) -> Prometheus:
    """Scraping the replicas (as the stable track, green as a canary) and HAProxy, with the PrometheusRule's groups
    as its rules."""
    rule = find(build("cpu", (), workdir), "PrometheusRule", "vigil")
    rule_file = workdir / "prometheusrule.yml"
    rule_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    targets = {name: (replica.address, "canary" if name == GREEN else "stable") for name, replica in replicas.items()}
    prometheus = Prometheus(prometheus_config(targets, haproxy.metrics_address, [rule_file]), workdir, free_port())
    wait_until(lambda: len([target for target in prometheus.active_targets() if target["health"] == "up"])
               == len(replicas) + 1, 60, what="Prometheus scrapes every replica and HAProxy")  # fmt: skip
    return prometheus


def test_every_replica_is_up_at_full_weight_and_blue_takes_the_traffic(fleet):
    states = {(state.backend, state.name): state for state in fleet.haproxy.api.servers()}
    assert {key: (state.status, state.weight) for key, state in states.items()} == {
        **{("blue", name): ("UP", 100) for name in BLUE}, ("green", GREEN): ("UP", 100)}  # fmt: skip
    before = fleet.haproxy.totals("green")
    for _ in range(5):
        assert httpx.post(f"{fleet.haproxy.url}/v1/completions", json=SHORT_REQUEST, timeout=60).status_code == 200
    assert fleet.haproxy.totals("green") == before, "green_percent 0 in routing.map: nothing goes to green"


def test_a_busy_replica_gets_clearly_fewer_new_requests(fleet):
    haproxy, busy = fleet.haproxy, fleet.replicas["vigil-1"]
    with concurrent.futures.ThreadPoolExecutor(LONG_REQUESTS) as pool:
        # Sent to vigil-1 directly, past HAProxy, so that only the replica's own agent check can tell HAProxy that
        # it is busy (HAProxy's count of its connections there stays 0): another balancer's traffic, say.
        longs = [pool.submit(httpx.post, f"{busy.server.base_url}/v1/completions", json=LONG_REQUEST, timeout=300)
                 for _ in range(LONG_REQUESTS)]  # fmt: skip
        wait_until(lambda: haproxy.api.server("blue", "vigil-1").weight <= 10, 30, interval=0.1,
                   what=lambda: f"vigil-1's agent lowers its weight: {haproxy.api.servers('blue')}")  # fmt: skip
        # vigil-2's last agent reply may still count a request of the previous test (one of four slots: 75%).
        wait_until(lambda: haproxy.api.server("blue", "vigil-2").weight == 100, 30, interval=0.1,
                   what=lambda: f"idle vigil-2 at full weight: {haproxy.api.servers('blue')}")  # fmt: skip

        before = haproxy.totals("blue")
        with ClientLoop(haproxy.url, clients=SHORT_CLIENTS, max_tokens=4, max_requests=SHORT_REQUESTS,
                        max_seconds=120) as loop:  # fmt: skip
            # A request HAProxy gave vigil-1 waits there behind the long ones, so count what HAProxy sent out.
            wait_until(lambda: sum(haproxy.totals("blue").values()) - sum(before.values()) >= SHORT_REQUESTS, 120,
                       interval=0.05, what="HAProxy has sent out the short requests")  # fmt: skip
            after = haproxy.totals("blue")
            # As many unfinished as the batch holds: vigil-1's batch was full all along.
            still_busy = sum(not future.done() for future in longs)
        assert [future.result().status_code for future in longs] == [200] * LONG_REQUESTS
    assert still_busy >= MAX_NUM_SEQS, "the long requests ended before the short ones: make them longer"
    assert loop.failures == [], loop.failures[:5]
    split = {name: after[name] - before[name] for name in BLUE}
    print(f"new requests while vigil-1 was busy: {split}")
    assert split["vigil-2"] >= 3 * split["vigil-1"], split


def test_sigterm_on_a_replica_under_load_fails_no_request(fleet):
    haproxy, replica = fleet.haproxy, fleet.replicas["vigil-1"]
    with ClientLoop(haproxy.url, clients=4, max_tokens=48, max_seconds=240) as loop:
        wait_until(lambda: haproxy.api.server("blue", "vigil-1").sessions > 0, 60, interval=0.02,
                   what="vigil-1 has requests in flight")  # fmt: skip
        exit_code = replica.stop()  # SIGTERM: its agent says drain, the requests in flight finish, it exits
        sent = loop.sent
        wait_until(lambda: loop.sent >= sent + SERVED_AFTER, 120, what="the loop is served by vigil-2 alone")
    print(f"SIGTERM under load: {dict(loop.codes)}")
    assert exit_code == 0
    assert loop.failures == [], loop.failures[:5]
    replica.start()
    haproxy.wait_up("blue", "vigil-1")


def test_a_scripted_rolling_restart_under_a_client_loop_fails_no_request(fleet):
    haproxy = fleet.haproxy
    generations = {name: fleet.replicas[name].generation for name in BLUE}
    steps: list[str] = []
    with ClientLoop(haproxy.url, clients=3, max_tokens=32, max_seconds=400) as loop:
        wait_until(lambda: loop.sent >= SERVED_AFTER, 60, what="the loop is served before the rollout")
        restart(haproxy.api, "blue", lambda name: fleet.replicas[name].replace(), DRAIN_TIMEOUT_S, READY_TIMEOUT_S,
                steps.append)  # fmt: skip
        sent = loop.sent
        wait_until(lambda: loop.sent >= sent + SERVED_AFTER, 120, what="the loop is served after the rollout")
    print(f"rolling restart: {dict(loop.codes)}; {steps}")
    assert loop.failures == [], loop.failures[:5]
    assert {name: fleet.replicas[name].generation for name in BLUE} == {n: g + 1 for n, g in generations.items()}
    assert [step.split(":")[0] for step in steps] == [f"blue/{name}" for name in BLUE for _ in range(3)]
    assert all(state.up and state.weight > 0 for state in haproxy.api.servers("blue"))


def test_a_blue_green_switch_under_a_client_loop_fails_no_request(fleet):
    haproxy = fleet.haproxy
    blue_answer = complete(fleet.replicas["vigil-2"].server.base_url)
    assert complete(fleet.replicas[GREEN].server.base_url) != blue_answer, "green serves another model version"
    with ClientLoop(haproxy.url, clients=4, max_tokens=32, max_seconds=300) as loop:
        wait_until(lambda: loop.sent >= SERVED_AFTER, 60, what="the loop is served by blue")
        shift(haproxy.api, 100, DRAIN_TIMEOUT_S, log=print)  # returns once blue has no request in flight
        blue, green, sent = haproxy.totals("blue"), haproxy.totals("green"), loop.sent
        wait_until(lambda: loop.sent >= sent + SERVED_AFTER, 120, what="the loop is served by green")
        blue_after, green_after = haproxy.totals("blue"), haproxy.totals("green")
    print(f"blue-green switch: {dict(loop.codes)}")
    assert loop.failures == [], loop.failures[:5]
    assert blue_after == blue, "after the switch, no new request goes to blue"
    assert green_after[GREEN] - green[GREEN] >= SERVED_AFTER
    assert complete(haproxy.url) != blue_answer

    shift(haproxy.api, 0, DRAIN_TIMEOUT_S, log=print)
    assert complete(haproxy.url) == blue_answer


def complete(base_url: str) -> str:
    body = {"model": "smollm", "prompt": "The colour of the sky is", "max_tokens": 8, "temperature": 0.0}
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


# --- the live fleet's metrics ----------------------------------------------------------------------------------


def values(prometheus: Prometheus, expr: str) -> list[float]:
    answer = prometheus.query(expr)
    assert answer["status"] == "success", f"{expr}: {answer}"
    return [float(series["value"][1]) for series in answer["data"]["result"]]


@pytest.fixture(scope="module")
def recent_traffic(fleet):
    """Requests through HAProxy to every replica of blue, seen by Prometheus: rates over the last minute exist."""
    prometheus = fleet.prometheus
    answered = 'sum(haproxy_frontend_http_requests_total{proxy="vigil"})'
    before = values(prometheus, answered)[0]
    for _ in range(20):
        assert httpx.post(f"{fleet.haproxy.url}/v1/completions", json=SHORT_REQUEST, timeout=60).status_code == 200
    wait_until(lambda: values(prometheus, answered)[0] >= before + 20, 30, interval=0.25,
               what="Prometheus has scraped the requests")  # fmt: skip


def test_the_autoscalers_queries_return_a_number_on_the_live_fleet(fleet, recent_traffic):
    objects = build("gpu", (), fleet.workdir)
    queries = {trigger["name"]: trigger["metadata"]["query"]
               for trigger in find(objects, "ScaledObject", "vigil")["spec"]["triggers"]}  # fmt: skip
    adapter = yaml.safe_load((KUBERNETES / "components/hpa/prometheus-adapter-values.yaml").read_text())["rules"]
    # What prometheus-adapter fills in: for the HPA's per-pod metric, the pods of its Deployment; for the external
    # one, the HPA's selector in the HPA's namespace.
    pods = {
        "<<.Series>>": "vigil_num_requests_waiting",
        "<<.LabelMatchers>>": 'namespace="vigil", pod=~"vigil-1|vigil-2"',
        "<<.GroupBy>>": "pod",
    }
    external = {
        "<<.Series>>": "vigil_engine_ready",
        "<<.LabelMatchers>>": 'namespace="vigil", app_kubernetes_io_track="stable"',
        "<<.GroupBy>>": "namespace",
    }
    for kind, rule, fill in (("custom", adapter["custom"][0], pods), ("external", adapter["external"][0], external)):
        query = rule["metricsQuery"]
        for placeholder, value in fill.items():
            query = query.replace(placeholder, value)
        queries[f"prometheus-adapter {kind}"] = query
    # This fleet has no GPU: the GPU trigger's query must run, and finds nothing (on a CPU-only cluster, KEDA would
    # take that for a failure and hold its fallback; overlays/cpu has no such trigger).
    assert values(fleet.prometheus, queries.pop("gpu-utilisation")) == []
    for name, query in queries.items():
        found = values(fleet.prometheus, query)
        print(f"{name}: {found}")
        assert found and all(math.isfinite(value) for value in found), f"{name}: {query} -> {found}"
    assert len(values(fleet.prometheus, queries["waiting-requests-per-replica"])) == 1
    # The per-pod metric has a value for each replica of the stable track.
    assert len(values(fleet.prometheus, queries["prometheus-adapter custom"])) == len(BLUE)


def test_the_waiting_requests_query_sees_a_busy_replicas_queue(fleet):
    """KEDA's query, asked as KEDA asks it, while a queue stands on vigil-1 for several scrapes."""
    triggers = find(build("cpu", (), fleet.workdir), "ScaledObject", "vigil")["spec"]["triggers"]
    [trigger] = [trigger for trigger in triggers if trigger["name"] == "waiting-requests-per-replica"]
    query, threshold = trigger["metadata"]["query"], float(trigger["metadata"]["threshold"])
    # The queue stands for all but the last batch: a batch of long requests lasts about a second on the tiny model,
    # as long as a scrape interval, so one batch's wait could fall between two scrapes.
    queued = QUEUE_BATCHES * MAX_NUM_SEQS
    seen: list[float] = []
    with concurrent.futures.ThreadPoolExecutor(queued) as pool:
        longs = [pool.submit(httpx.post, f"{fleet.replicas['vigil-1'].server.base_url}/v1/completions",
                             json=LONG_REQUEST, timeout=300) for _ in range(queued)]  # fmt: skip
        while not all(future.done() for future in longs) and max(seen, default=0) < threshold:
            seen.extend(values(fleet.prometheus, query))
            time.sleep(0.1)
        assert [future.result().status_code for future in longs] == [200] * queued
    assert max(seen, default=0) >= threshold, f"{query} while {queued} requests queued on vigil-1: {seen}"


def test_the_prometheusrule_loads_and_every_rule_evaluates(fleet, recent_traffic):
    rule = find(build("cpu", (), fleet.workdir), "PrometheusRule", "vigil")
    expected = [entry.get("alert") or entry["record"] for group in rule["spec"]["groups"] for entry in group["rules"]]
    wait_until(lambda: all(entry["health"] != "unknown" for entry in fleet.prometheus.rules()), 30,
               what="every rule has been evaluated")
    loaded = fleet.prometheus.rules()
    assert sorted(entry["name"] for entry in loaded) == sorted(expected)
    assert {entry["name"]: entry.get("lastError") for entry in loaded if entry["health"] != "ok"} == {}
    for group in rule["spec"]["groups"]:
        for entry in group["rules"]:
            query = entry["expr"]
            assert fleet.prometheus.query(query)["status"] == "success", query
            if "record" in entry:
                found = values(fleet.prometheus, entry["record"] + "{" + ", ".join(
                    f'{key}="{value}"' for key, value in entry.get("labels", {}).items()) + "}")  # fmt: skip
                assert found and all(math.isfinite(value) for value in found), entry["record"]


def test_haproxy_exports_what_the_fleet_dashboard_reads(fleet):
    missing = [name for name in sorted(HAPROXY_METRICS) if not values(fleet.prometheus, name)]
    assert not missing, f"HAProxy's exporter has no {missing}"


def test_every_fleet_dashboard_query_shows_data(fleet, recent_traffic):
    instances = "|".join(replica.address for replica in fleet.replicas.values())
    problems = []
    queries = [query for query in dashboard_queries("smollm", instances, balancer=fleet.haproxy.metrics_address)
               if query[0] == "Vigil / Fleet"]  # fmt: skip
    assert queries
    for _, panel, expr in queries:
        found = values(fleet.prometheus, expr)
        if not any(math.isfinite(value) for value in found):
            problems.append(f"{panel}: {found}\n    {expr}")
    assert not problems, "\n".join(problems)


def test_the_replicas_export_what_the_endpoint_picker_reads(fleet):
    config_map = find(build("cpu", (), fleet.workdir), "ConfigMap", "vigil-epp")
    [config] = [yaml.safe_load(text) for text in config_map["data"].values()]
    [extractor] = [plugin["parameters"] for plugin in config["plugins"] if plugin["type"] == "core-metrics-extractor"]
    [engine] = extractor["engineConfigs"]
    for field in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec"):
        found = values(fleet.prometheus, f'{engine[field]}{{job="vigil", app_kubernetes_io_track="stable"}}')
        assert len(found) == len(BLUE), field
    [info, *_] = fleet.prometheus.query('vigil_kv_cache_config_info{job="vigil"}')["data"]["result"]
    assert int(info["metric"][engine["cacheBlockSizeLabelName"]]) > 0
    assert int(info["metric"][engine["cacheNumBlocksLabelName"]]) > 0
