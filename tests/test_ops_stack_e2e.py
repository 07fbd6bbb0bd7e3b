"""The whole observability pipeline on 127.0.0.1: Vigil -> Prometheus -> Alertmanager -> the alert inbox.

Prometheus and Alertmanager run with the project's own deploy/prometheus.yml, alerts/rules/*.yml and
alerts/alertmanager.yml, rewritten only in their addresses and intervals (see tests/ops_stack.py); Prometheus
also scrapes itself and Alertmanager. The idle server's tiles read "no traffic", never NaN or red; every
dashboard query returns data after real traffic; the SLO rules see that traffic; the heartbeat keeps arriving;
a repetition loop provoked by real requests reaches the warning receiver alone; stopping the server pages the
critical receiver, and so does its target vanishing, as a stopped container's does.

The tests run in file order and share one stack: the last ones stop the server and take its target away.
"""

import concurrent.futures
import json
import math
import signal
import time

import httpx
import pytest
import yaml

from server.bench.local_server import free_port
from tests.api_server import APIServer
from tests.dashboard_queries import (
    MONITORING_METRICS,
    ROOT,
    alert_rules,
    dashboard_queries,
    is_balancer_query,
    is_routing_query,
    load_dashboards,
    metric_names,
    panels,
    rules,
    stat_display,
    substitute,
)
from tests.ops_stack import (
    ALERTMANAGER_CONFIG,
    PROMETHEUS_CONFIG,
    AlertInbox,
    Alertmanager,
    Prometheus,
    alertmanager_config,
    prometheus_config,
    rewrite_rules,
    wait_until,
    write_targets,
)
from tests.serve_with_switches import PROGRAM as FAULT_SWITCH_PROGRAM

pytestmark = [pytest.mark.e2e, pytest.mark.server]

MODEL = "smollm"
WARNING_ALERT = "VigilRepetitionLoops"
CRITICAL_ALERT = "VigilServerDown"
GONE_ALERTS = ("VigilAbsent", "VigilReplicaMissing")
# Only the alerts this test exercises fire within seconds; every other rule keeps its `for:` of minutes, so
# that nothing unrelated can fire during the test (a critical one would hold back the warning by inhibition).
FAST_FOR = {WARNING_ALERT: "2s", CRITICAL_ALERT: "2s", **dict.fromkeys(GONE_ALERTS, "2s")}
EXTERNAL_LABELS = {"grafana_url": "http://grafana.test:3000"}  # docs_url: the test inbox, which serves docs/
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
    # Counting continues what the prompt already holds: the server's n-gram speculation guesses from it.
    {"prompt": "1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2,", "temperature": 0.0, "max_tokens": 12},
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
def inbox():
    receiver = AlertInbox(ROOT / "docs")
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def server(smollm_folder):
    # With the test's fault switch (SIGUSR1 fails the engine's next step), for the mid-stream failure of step 5.
    # With speculation, so that its panels read live numbers too (the looping request of step 4 keeps guesses).
    server = APIServer(smollm_folder, "--stop-on-repetition", "--max-num-seqs", "4",
                       "--speculative-config", '{"num_speculative_tokens": 3}', program=FAULT_SWITCH_PROGRAM)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def instance(server):
    return f"127.0.0.1:{server.port}"


@pytest.fixture(scope="module")
def alertmanager(inbox, workdir):
    daemon = Alertmanager(alertmanager_config(inbox.url), workdir)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def targets(workdir, instance):
    """The discovery file of the `vigil` job, listing the server."""
    path = workdir / "vigil-targets.json"
    write_targets(path, [instance])
    return path


@pytest.fixture(scope="module")
def prometheus(server, instance, targets, alertmanager, inbox, workdir):
    rule_dir = workdir / "rules"
    rule_dir.mkdir()
    port = free_port()
    config = prometheus_config(
        targets, f"127.0.0.1:{port}", f"127.0.0.1:{alertmanager.port}", rewrite_rules(rule_dir, FAST_FOR),
        {**EXTERNAL_LABELS, "docs_url": f"{inbox.url}/docs"},
    )  # fmt: skip
    daemon = Prometheus(config, workdir, port)
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
    # A request's series (the HTTP counter's route and code, the finished-request histograms) are born with the first
    # request that writes them, already holding its counts. If every request landed between two scrapes, each
    # series would enter Prometheus at its final value and a rate over it would see no increase (on a fast CPU
    # the traffic fits in one scrape interval). So one request goes first and is scraped before the rest.
    answered = f'sum(vigil_http_requests_total{{instance="{instance}", {API_ROUTES}}})'
    before = scalar(prometheus, answered) or 0
    complete(server, PARALLEL_COMPLETIONS[0])
    wait_until(lambda: (scalar(prometheus, answered) or 0) > before, 30, interval=0.25,
               what=lambda: f"the first API request in Prometheus: {answered} = {scalar(prometheus, answered)}")
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
    api_requests = 1 + len(completions) + 2 + 2 + 2

    # Prometheus has scraped after the last request, then a few more times, so that rates span the traffic.
    # (Finished requests also count the readiness probe's canaries, so the HTTP counter is the one to wait on.)
    wait_until(
        lambda: (scalar(prometheus, answered) or 0) >= api_requests,
        30,
        interval=0.25,
        what=lambda: f"{api_requests} API requests in Prometheus: {answered} = {scalar(prometheus, answered)}",
    )
    time.sleep(SCRAPES_AFTER_TRAFFIC + 0.5)


# --- the rewritten configuration ------------------------------------------------------------------------------


def test_rewritten_configs_change_only_addresses_and_intervals(tmp_path):
    original = [rule for _, rule in rules()]
    rewritten = [rule for path in rewrite_rules(tmp_path, FAST_FOR)
                 for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]  # fmt: skip
    assert len(rewritten) == len(original)
    for ours, theirs in zip(rewritten, original, strict=True):
        assert ours == {**theirs, **({"for": FAST_FOR[theirs["alert"]]} if theirs.get("alert") in FAST_FOR else {})}

    targets = tmp_path / "targets.json"
    labels = {"docs_url": "http://127.0.0.1:5/docs", "grafana_url": "http://127.0.0.1:6"}
    prometheus = prometheus_config(targets, "127.0.0.1:1", "127.0.0.1:2", [tmp_path / "critical.yml"], labels)
    project = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert set(jobs) == {"vigil", "prometheus", "alertmanager"}
    [theirs] = [job for job in project["scrape_configs"] if job["job_name"] == "vigil"]
    assert jobs["vigil"] == {**{k: v for k, v in theirs.items() if k != "dns_sd_configs"},
                             "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}  # fmt: skip
    assert jobs["prometheus"]["static_configs"] == [{"targets": ["127.0.0.1:1"]}]
    assert jobs["alertmanager"]["static_configs"] == [{"targets": ["127.0.0.1:2"]}]
    assert prometheus["alerting"]["alertmanagers"][0]["static_configs"] == [{"targets": ["127.0.0.1:2"]}]
    assert set(prometheus["global"]["external_labels"]) == set(project["global"]["external_labels"])

    project = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    test = alertmanager_config("http://127.0.0.1:3")
    assert test["inhibit_rules"] == project["inhibit_rules"]
    assert test["route"]["group_by"] == project["route"]["group_by"]
    for ours, theirs in zip(test["route"]["routes"], project["route"]["routes"], strict=True):
        assert (ours["receiver"], ours["matchers"]) == (theirs["receiver"], theirs["matchers"])
        assert ours.get("active_time_intervals") == theirs.get("active_time_intervals")
        if ours["receiver"] != "heartbeat":
            assert ours["repeat_interval"] == theirs["repeat_interval"]
    urls = {r["name"]: [w["url"] for w in r["webhook_configs"]] for r in test["receivers"]}
    assert urls == {"critical": ["http://127.0.0.1:3/alerts"], "warning": ["http://127.0.0.1:3/alerts"],
                    "heartbeat": ["http://127.0.0.1:3/heartbeat"]}  # fmt: skip


# --- 2. dashboards -------------------------------------------------------------------------------------------


def is_gpu_query(expr: str) -> bool:
    """Reads only per-GPU metrics (Vigil's NVML ones, or dcgm-exporter's), which a machine without a GPU does not
    have."""
    names = metric_names(expr)
    return bool(names) and all(n.startswith(("vigil_gpu_", "DCGM_FI_")) and n != "vigil_gpu_count" for n in names)


def test_dashboards_have_queries():
    queries = dashboard_queries(MODEL, "127.0.0.1:1")
    assert len(queries) > 40
    assert any(is_gpu_query(expr) for _, _, expr in queries)
    assert not is_gpu_query('sum(vigil_gpu_count{instance=~"x"})')
    assert is_gpu_query("increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[1h])")


def test_idle_tiles_read_no_traffic_never_nan_or_red(prometheus, instance):
    # Before any API request: the server is up and idle, as after a quiet night.
    problems = []
    for board in load_dashboards().values():
        for panel in panels(board):
            if panel["type"] != "stat":
                continue
            for target in panel["targets"]:
                answer = prometheus.query(substitute(target["expr"], MODEL, instance))
                assert answer["status"] == "success", answer
                values = [float(series["value"][1]) for series in answer["data"]["result"]] or [None]
                for value in values:
                    text, colour = stat_display(panel, value)
                    if text == "NaN" or colour == "red":
                        problems.append(f"{board['title']} / {panel['title']}: {value} shows {text!r} in {colour}")
    assert not problems, "\n".join(problems)


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
        if is_balancer_query(expr):
            continue  # no HAProxy in this stack: tests/test_fleet_e2e.py shows these with data
        if is_routing_query(expr):
            continue  # one model, no alias: tests/test_multi_model_server.py reads these series with their labels
        values = [float(series["value"][1]) for series in answer["data"]["result"]]
        if not values:
            problems.append(f"{dashboard} / {panel}: no data\n    {expr}")
        elif not any(math.isfinite(v) for v in values):
            problems.append(f"{dashboard} / {panel}: only {values}\n    {expr}")
    assert not problems, f"{len(problems)} of {len(queries)} dashboard queries show no data:\n" + "\n".join(problems)


def test_every_rule_is_loaded_and_evaluates(prometheus, traffic):
    loaded = prometheus.rules()
    assert sorted(rule["name"] for rule in loaded) == sorted(rule.get("alert") or rule["record"] for _, rule in rules())
    unhealthy = {rule["name"]: rule.get("lastError") for rule in loaded if rule["health"] != "ok"}
    assert not unhealthy


def test_the_monitoring_exports_what_its_alerts_read(prometheus):
    missing = [name for name in sorted(MONITORING_METRICS) if not prometheus.query(name)["data"]["result"]]
    assert not missing, f"Prometheus or Alertmanager {prometheus_version(prometheus)} does not export {missing}"


def prometheus_version(prometheus: Prometheus) -> str:
    return prometheus.get("/api/v1/status/buildinfo")["data"]["version"]


def test_the_slo_rules_count_the_traffic(prometheus, traffic):
    # The latency SLOs count good events in the bucket le="2.0": if the rules spelled it otherwise than the
    # server writes it, the error ratio would have no value at all.
    for slo in ("availability", "time_to_first_token", "inter_token_latency"):
        assert scalar(prometheus, f'slo:events:rate5m{{slo="{slo}"}}') > 0, slo
        ratio = scalar(prometheus, f'slo:error_ratio:rate5m{{slo="{slo}"}}')
        assert ratio is not None and 0 <= ratio <= 1, slo
    assert scalar(prometheus, 'slo:error_ratio:rate5m{slo="availability"}') == 0  # the 400 is no failure


# --- 3. the heartbeat ------------------------------------------------------------------------------------------


def test_the_heartbeat_keeps_arriving(prometheus, inbox):
    first = wait_until(lambda: inbox.heartbeat()["last_received_at"] and inbox.heartbeat(), NOTIFICATION_TIMEOUT_S,
                       what="the first heartbeat reaches the inbox")  # fmt: skip
    later = wait_until(
        lambda: (beat := inbox.heartbeat())["count"] >= first["count"] + 2 and beat,
        NOTIFICATION_TIMEOUT_S,
        what="two more heartbeats reach the inbox",
    )
    assert later["last_received_at"] >= first["last_received_at"]
    assert inbox.alerts("VigilWatchdog") == [], "heartbeats go to the heartbeat receiver, not the alert list"


# --- 4. a warning, while the server is up ---------------------------------------------------------------------


def test_repetition_loops_page_the_warning_receiver_only(server, prometheus, alertmanager, inbox, instance):
    [rule] = [rule for _, rule in alert_rules() if rule["alert"] == WARNING_ALERT]
    assert rule["labels"]["severity"] == "warning"
    before = prometheus.query(rule["expr"])
    assert before["status"] == "success", before
    assert before["data"]["result"] == [], "the warning condition held before any looping request"
    assert not inbox.alerts(WARNING_ALERT)

    for _ in range(LOOPING_REQUESTS):
        [choice] = complete(server, LOOPING_REQUEST)["choices"]
        assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "repetition"), choice

    try:
        [alert, *_] = wait_until(
            lambda: inbox.alerts(WARNING_ALERT, "firing"),
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
    assert {"summary", "description", "value", "runbook_url", "dashboard_url"} <= set(alert["annotations"])
    assert "repeats itself" in alert["annotations"]["summary"]
    dashboard = f"{EXTERNAL_LABELS['grafana_url']}/d/vigil-model?var-instance={instance}"
    assert alert["annotations"]["dashboard_url"] == dashboard

    time.sleep(MISROUTE_GRACE_S)
    assert inbox.alerts(WARNING_ALERT, receiver="critical") == []
    # Nothing critical has fired for this instance: it would hold back every warning of the instance.
    assert [a for a in inbox.alerts(receiver="critical") if a["labels"].get("instance") == instance] == []


# --- 5. the engine fails in the middle of a stream, then the server goes down, then its target vanishes ----


def test_a_stream_that_fails_after_its_200_counts_against_the_availability_slo(server, prometheus, instance):
    body = {"model": MODEL, "prompt": "Tell a long story", "max_tokens": 500, "ignore_eos": True, "stream": True}
    events = []
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and not events:
                server.process.send_signal(signal.SIGUSR1)  # the engine's next step fails
            events += [line] if line.startswith("data: ") else []
    assert events[-1] == "data: [DONE]" and json.loads(events[-2][len("data: "):])["error"]["code"] == "engine_error"
    counted = f'vigil_request_errors_total{{instance="{instance}", reason="stream_error"}}'
    wait_until(lambda: scalar(prometheus, counted) == 1, 30, what="Prometheus scrapes the stream error")
    wait_until(lambda: (scalar(prometheus, 'slo:bad_events:rate5m{slo="availability"}') or 0) > 0, 30,
               what="the availability SLO counts the failed stream")



def await_page(inbox: AlertInbox, alertname: str, prometheus: Prometheus, alertmanager: Alertmanager) -> dict:
    try:
        [alert, *_] = wait_until(
            lambda: inbox.alerts(alertname, "firing", receiver="critical"),
            NOTIFICATION_TIMEOUT_S,
            what=f"{alertname} reaches the critical receiver",
        )
    except TimeoutError as error:
        raise AssertionError(
            f"{error}\nPrometheus alerts: {prometheus.alerts()}\n{stack_logs(prometheus, alertmanager)}"
        ) from None
    return alert


def test_server_down_pages_the_critical_receiver(server, prometheus, alertmanager, inbox, instance):
    assert not inbox.alerts(CRITICAL_ALERT)
    server.stop()
    assert server.process.returncode is not None

    alert = await_page(inbox, CRITICAL_ALERT, prometheus, alertmanager)
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["instance"] == instance
    assert alert["labels"]["job"] == "vigil"
    assert {"summary", "description", "value", "runbook_url", "dashboard_url"} <= set(alert["annotations"])
    # The runbook link is absolute, and opens the alert's own section.
    runbook = alert["annotations"]["runbook_url"]
    assert runbook == f"{inbox.url}/docs/runbook.md#{CRITICAL_ALERT.lower()}"
    page = httpx.get(runbook.split("#")[0], timeout=10)
    assert page.status_code == 200 and f"id='{CRITICAL_ALERT.lower()}'" in page.text

    time.sleep(MISROUTE_GRACE_S)
    assert inbox.alerts(CRITICAL_ALERT, receiver="warning") == []


def test_a_vanished_replica_pages_once_as_vigil_absent(server, prometheus, alertmanager, inbox, instance, targets):
    # A stopped container's DNS name no longer resolves, so Prometheus drops its target: no up == 0 is left.
    write_targets(targets, [])
    wait_until(lambda: not prometheus.query('up{job="vigil"}')["data"]["result"], 30,
               what="Prometheus drops the vanished target")  # fmt: skip

    alert = await_page(inbox, "VigilAbsent", prometheus, alertmanager)
    assert alert["labels"]["job"] == "vigil" and "instance" not in alert["labels"]
    # VigilReplicaMissing fires for the replica too, but Alertmanager holds it back while VigilAbsent fires.
    wait_until(
        lambda: any(a["labels"]["alertname"] == "VigilReplicaMissing" and a["state"] == "firing"
                    and a["labels"]["instance"] == instance for a in prometheus.alerts()),
        NOTIFICATION_TIMEOUT_S,
        what="VigilReplicaMissing fires in Prometheus",
    )  # fmt: skip
    time.sleep(MISROUTE_GRACE_S)
    assert inbox.alerts("VigilReplicaMissing", "firing") == []
