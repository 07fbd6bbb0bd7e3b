"""The whole observability pipeline on 127.0.0.1: Vigil -> Prometheus -> Alertmanager -> webhook receivers.

Prometheus and Alertmanager run with the project's own deploy/prometheus.yml, alerts/rules/*.yml and
alerts/alertmanager.yml, rewritten only in their addresses and intervals (see tests/ops_stack.py). Every
dashboard query must return data after real traffic; a repetition loop provoked by real requests must reach
the warning receiver alone; stopping the server must page the critical receiver.

The tests run in file order and share one stack: the last one stops the server.
"""

import concurrent.futures
import json
import math
import time

import httpx
import pytest
import yaml

from tests.api_server import APIServer
from tests.dashboard_queries import alert_rules, dashboard_queries, metric_names
from tests.ops_stack import (
    ALERTMANAGER_CONFIG,
    Alertmanager,
    Prometheus,
    WebhookReceiver,
    alertmanager_config,
    prometheus_config,
    rewrite_rules,
    wait_until,
)

MODEL = "smollm"
WARNING_ALERT = "VigilRepetitionLoops"
CRITICAL_ALERT = "VigilServerDown"
# Only the alerts this test exercises fire within seconds; every other rule keeps its `for:` of minutes, so
# that nothing unrelated can fire during the test (a critical one would hold back the warning by inhibition).
FAST_FOR = {WARNING_ALERT: "2s", CRITICAL_ALERT: "2s"}
SCRAPES_AFTER_TRAFFIC = 3
NOTIFICATION_TIMEOUT_S = 60.0
# Long enough for Alertmanager to send a misrouted copy too (its grouping delays are 1-2 s here).
MISROUTE_GRACE_S = 4.0
API_ROUTES = 'route!~"/metrics|/livez|/readyz|/health"'

# Step 2's traffic: concurrent completions (so that batches hold several sequences), a streamed and a plain
# chat, a repeated long prompt (prefix cache hits) and a rejected request. At most 15 new tokens each, so
# none can be a repetition loop (the detector needs 16 tokens), and the warning of step 4 starts from zero.
PARALLEL_COMPLETIONS = [
    {"prompt": "The three primary colours are", "temperature": 0.0, "max_tokens": 12},
    {"prompt": "A good breakfast has", "temperature": 0.7, "top_p": 0.9, "max_tokens": 10, "seed": 3},
    {"prompt": "Rivers flow into", "temperature": 1.0, "top_p": 0.8, "max_tokens": 8, "seed": 5},
    {"prompt": "The moon is", "temperature": 0.3, "max_tokens": 14, "seed": 7},
]
SHARED_PREFIX = "You are a careful assistant. Answer in one short sentence, plainly and without lists. " * 3
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
# Step 4: a prompt that loops under a repetition penalty below 1 (see tests/test_repetition_on_model.py); the
# server runs with --stop-on-repetition, so each request ends early with stop_reason "repetition".
LOOPING_REQUEST = {
    "prompt": "apple banana apple banana apple banana",
    "temperature": 0.0,
    "repetition_penalty": 0.5,
    "max_tokens": 64,
}
LOOPING_REQUESTS = 4


# --- the stack -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("ops-stack")


@pytest.fixture(scope="module")
def webhooks():
    receivers = {"critical": WebhookReceiver("critical"), "warning": WebhookReceiver("warning")}
    yield receivers
    for receiver in receivers.values():
        receiver.close()


@pytest.fixture(scope="module")
def server(smollm_folder):
    server = APIServer(smollm_folder, "--stop-on-repetition", "--max-num-seqs", "4")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def instance(server):
    return f"127.0.0.1:{server.port}"


@pytest.fixture(scope="module")
def alertmanager(webhooks, workdir):
    daemon = Alertmanager(alertmanager_config(webhooks["critical"].url, webhooks["warning"].url), workdir)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def prometheus(server, instance, alertmanager, workdir):
    rule_dir = workdir / "rules"
    rule_dir.mkdir()
    config = prometheus_config(instance, f"127.0.0.1:{alertmanager.port}", rewrite_rules(rule_dir, FAST_FOR))
    daemon = Prometheus(config, workdir)
    try:
        wait_until(
            lambda: scalar(daemon, f'up{{job="vigil", instance="{instance}"}}') == 1,
            30,
            what=f"Prometheus scrapes {instance} as job vigil",
        )
        wait_until(
            lambda: any(
                am["url"].startswith(alertmanager.base_url)
                for am in daemon.get("/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
            ),
            30,
            what="Prometheus has discovered the test Alertmanager",
        )
        yield daemon
    finally:
        daemon.stop()


def scalar(prometheus: Prometheus, expr: str) -> float | None:
    """The single value of an instant query, or None when it has no result."""
    answer = prometheus.query(expr)
    assert answer["status"] == "success", f"{expr}: {answer}"
    result = answer["data"]["result"]
    assert len(result) <= 1, f"{expr}: expected at most one series, got {result}"
    return float(result[0]["value"][1]) if result else None


def stack_logs(*daemons) -> str:
    return "\n".join(f"--- {daemon.name} log ---\n{daemon.log()}" for daemon in daemons)


# --- traffic -------------------------------------------------------------------------------------------------


def complete(server: APIServer, body: dict) -> dict:
    response = httpx.post(f"{server.base_url}/v1/completions", json={"model": MODEL, **body}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def stream_chat(server: APIServer) -> int:
    """Streams a chat completion to its end; returns the number of chunks."""
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 12, "temperature": 0.0, "stream": True}
    chunks, done = 0, False
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                assert json.loads(line[len("data: ") :])["object"] == "chat.completion.chunk"
                chunks += 1
    assert done, "the stream ended without [DONE]"
    return chunks


@pytest.fixture(scope="module")
def traffic(server, prometheus, instance):
    """Real requests of every kind the dashboards show, then enough scrapes that Prometheus holds them all."""
    with concurrent.futures.ThreadPoolExecutor(len(PARALLEL_COMPLETIONS)) as pool:
        completions = list(pool.map(lambda body: complete(server, body), PARALLEL_COMPLETIONS))
    streamed = stream_chat(server)
    chat = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        timeout=120,
        json={"model": MODEL, "messages": CHAT, "max_tokens": 10, "temperature": 0.0},
    )
    assert chat.status_code == 200, chat.text
    for question in ("the sky", "the sea"):
        complete(server, {"prompt": f"{SHARED_PREFIX}Describe {question}:", "max_tokens": 6, "temperature": 0.0})
    assert httpx.get(f"{server.base_url}/v1/models", timeout=30).status_code == 200
    rejected = httpx.post(
        f"{server.base_url}/v1/completions", timeout=30, json={"model": MODEL, "prompt": "x", "temperature": -1}
    )
    assert rejected.status_code == 400, rejected.text
    assert len(completions) == len(PARALLEL_COMPLETIONS) and streamed > 1
    api_requests = len(completions) + 2 + 2 + 2

    # Prometheus has scraped after the last request, then a few more times, so that rates span the traffic.
    # (Finished requests also count the readiness probe's canaries, so the HTTP counter is the one to wait on.)
    answered = f'sum(vigil_http_requests_total{{instance="{instance}", {API_ROUTES}}})'
    wait_until(
        lambda: (scalar(prometheus, answered) or 0) >= api_requests,
        30,
        interval=0.25,
        what=lambda: f"{api_requests} API requests in Prometheus: {answered} = {scalar(prometheus, answered)}",
    )
    time.sleep(SCRAPES_AFTER_TRAFFIC + 0.5)


# --- the rewritten configuration ------------------------------------------------------------------------------


def test_rewritten_configs_change_only_addresses_and_intervals(tmp_path):
    original = {rule["alert"]: rule for _, rule in alert_rules()}
    rewritten = {}
    for path in rewrite_rules(tmp_path, FAST_FOR):
        for group in yaml.safe_load(path.read_text())["groups"]:
            rewritten.update((rule["alert"], rule) for rule in group["rules"])
    assert set(rewritten) == set(original)
    for name, rule in rewritten.items():
        assert rule == {**original[name], **({"for": FAST_FOR[name]} if name in FAST_FOR else {})}, name

    prometheus = prometheus_config("127.0.0.1:1", "127.0.0.1:2", [tmp_path / "critical.yml"])
    [job] = prometheus["scrape_configs"]
    assert job["job_name"] == "vigil" and job["static_configs"] == [{"targets": ["127.0.0.1:1"]}]
    assert "dns_sd_configs" not in job
    assert prometheus["alerting"]["alertmanagers"][0]["static_configs"] == [{"targets": ["127.0.0.1:2"]}]

    project = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    test = alertmanager_config("http://127.0.0.1:3/alerts", "http://127.0.0.1:4/alerts")
    assert test["inhibit_rules"] == project["inhibit_rules"]
    assert test["route"]["group_by"] == project["route"]["group_by"]
    for ours, theirs in zip(test["route"]["routes"], project["route"]["routes"], strict=True):
        assert (ours["receiver"], ours["matchers"]) == (theirs["receiver"], theirs["matchers"])
        assert ours["repeat_interval"] == theirs["repeat_interval"]
    urls = {r["name"]: [w["url"] for w in r["webhook_configs"]] for r in test["receivers"]}
    assert urls == {"critical": ["http://127.0.0.1:3/alerts"], "warning": ["http://127.0.0.1:4/alerts"]}


# --- 2. dashboards -------------------------------------------------------------------------------------------


def is_gpu_query(expr: str) -> bool:
    """Reads only per-GPU metrics, which a machine without a GPU does not have."""
    names = metric_names(expr)
    return bool(names) and all(n.startswith("vigil_gpu_") and n != "vigil_gpu_count" for n in names)


def test_dashboards_have_queries():
    queries = dashboard_queries(MODEL, "127.0.0.1:1")
    assert len(queries) > 40
    assert any(is_gpu_query(expr) for _, _, expr in queries)
    assert not is_gpu_query('sum(vigil_gpu_count{instance=~"x"})')


def test_every_dashboard_panel_shows_data(prometheus, instance, traffic):
    problems = []
    queries = dashboard_queries(MODEL, instance)
    for dashboard, panel, expr in queries:
        answer = prometheus.query(expr)
        if answer.get("status") != "success":
            problems.append(f"{dashboard} / {panel}: error {answer.get('error')!r}\n    {expr}")
            continue
        if is_gpu_query(expr):
            continue  # no GPU here: evaluating without error is all that can be asked
        values = [float(series["value"][1]) for series in answer["data"]["result"]]
        if not values:
            problems.append(f"{dashboard} / {panel}: no data\n    {expr}")
        elif not any(math.isfinite(v) for v in values):
            problems.append(f"{dashboard} / {panel}: only {values}\n    {expr}")
    assert not problems, f"{len(problems)} of {len(queries)} dashboard queries show no data:\n" + "\n".join(problems)


def test_every_alert_rule_is_loaded_and_evaluates(prometheus, traffic):
    loaded = {rule["name"]: rule for rule in prometheus.rules() if rule["type"] == "alerting"}
    expected = {rule["alert"]: rule for _, rule in alert_rules()}
    assert set(loaded) == set(expected)
    unhealthy = {name: rule.get("lastError") for name, rule in loaded.items() if rule["health"] != "ok"}
    assert not unhealthy


# --- 4. a warning, while the server is up ---------------------------------------------------------------------


def test_repetition_loops_page_the_warning_receiver_only(server, prometheus, alertmanager, webhooks, instance):
    [rule] = [rule for _, rule in alert_rules() if rule["alert"] == WARNING_ALERT]
    assert rule["labels"]["severity"] == "warning"
    before = prometheus.query(rule["expr"])
    assert before["status"] == "success", before
    assert before["data"]["result"] == [], "the warning condition held before any looping request"
    assert not webhooks["warning"].alerts(WARNING_ALERT)

    for _ in range(LOOPING_REQUESTS):
        [choice] = complete(server, LOOPING_REQUEST)["choices"]
        assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "repetition"), choice

    try:
        [alert, *_] = wait_until(
            lambda: webhooks["warning"].alerts(WARNING_ALERT, "firing"),
            NOTIFICATION_TIMEOUT_S,
            what=f"{WARNING_ALERT} reaches the warning receiver",
        )
    except TimeoutError as error:
        raise AssertionError(
            f"{error}\nPrometheus alerts: {prometheus.alerts()}\n{stack_logs(prometheus, alertmanager)}"
        ) from None
    assert alert["receiver"] == "warning"
    assert alert["labels"]["severity"] == "warning"
    assert alert["labels"]["instance"] == instance
    assert alert["labels"]["model"] == MODEL
    assert {"summary", "description", "runbook_url"} <= set(alert["annotations"])
    assert "repeats itself" in alert["annotations"]["summary"]

    time.sleep(MISROUTE_GRACE_S)
    assert webhooks["critical"].alerts(WARNING_ALERT) == []
    # Nothing critical has fired at all: a critical alert for this instance would hold back every warning.
    assert webhooks["critical"].payloads() == []


# --- 3. the server goes down ----------------------------------------------------------------------------------


def test_server_down_pages_the_critical_receiver(server, prometheus, alertmanager, webhooks, instance):
    assert not webhooks["critical"].alerts(CRITICAL_ALERT)
    server.stop()
    assert server.process.returncode is not None

    try:
        [alert, *_] = wait_until(
            lambda: webhooks["critical"].alerts(CRITICAL_ALERT, "firing"),
            NOTIFICATION_TIMEOUT_S,
            what=f"{CRITICAL_ALERT} reaches the critical receiver",
        )
    except TimeoutError as error:
        raise AssertionError(
            f"{error}\nPrometheus alerts: {prometheus.alerts()}\n{stack_logs(prometheus, alertmanager)}"
        ) from None
    assert alert["receiver"] == "critical"
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["instance"] == instance
    assert alert["labels"]["job"] == "vigil"
    assert {"summary", "description", "runbook_url"} <= set(alert["annotations"])

    time.sleep(MISROUTE_GRACE_S)
    assert webhooks["warning"].alerts(CRITICAL_ALERT) == []
