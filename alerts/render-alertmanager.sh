#!/bin/sh
# Prints an Alertmanager configuration built from the environment and the secret files (Alertmanager itself does
# not expand variables in its config file). The compose stack runs this in the alertmanager container at start;
# alerts/alertmanager.yml is its output with nothing set, and a test keeps the two equal.
#
# Three receivers, each also posting to the local alert inbox (ALERT_INBOX_URL, the inbox's base URL; set it empty
# to drop the inbox):
#   critical   a pager: PagerDuty and/or Opsgenie
#   warning    chat and/or email, sent only within working hours (held back, not lost, outside them)
#   heartbeat  VigilWatchdog every minute, for an external dead man's switch that pages when it stops
#
# Secrets come from files, never from variables: a channel is on when its file in ALERT_SECRETS_DIR (default
# /run/secrets, where Compose mounts `secrets:`) is not empty, and Alertmanager reads the file itself (*_file):
#   pagerduty_routing_key   PagerDuty Events API v2 integration key                         (critical)
#   opsgenie_api_key        Opsgenie API key; ALERT_OPSGENIE_API_URL for the EU instance     (critical)
#   slack_webhook_url       Slack incoming-webhook URL; ALERT_SLACK_CHANNEL optional         (warning)
#   smtp_password           the SMTP login's password, if the relay needs one                (warning, email)
#   heartbeat_url           the dead man's switch's ping URL                                 (heartbeat)
# The webhook of Alertmanager 0.25 (the version the tests run) has no url_file, so heartbeat_url alone is copied
# into the rendered config, which stays inside the container.
# Email, without a secret: ALERT_EMAIL_TO, ALERT_EMAIL_FROM, ALERT_SMTP_SMARTHOST (host:port),
# ALERT_SMTP_USERNAME, ALERT_SMTP_REQUIRE_TLS (default true).
# Working hours: ALERT_WORKING_DAYS (default monday:friday), ALERT_WORKING_HOURS (default 09:00-18:00) in
# ALERT_TIMEZONE (an IANA name, default UTC).
# POSIX sh only: the alertmanager image has busybox, not bash.
set -eu

ALERT_INBOX_URL=${ALERT_INBOX_URL-http://alert-inbox:8080}
ALERT_SECRETS_DIR=${ALERT_SECRETS_DIR:-/run/secrets}
ALERT_OPSGENIE_API_URL=${ALERT_OPSGENIE_API_URL:-}
ALERT_SLACK_CHANNEL=${ALERT_SLACK_CHANNEL:-}
ALERT_EMAIL_TO=${ALERT_EMAIL_TO:-}
ALERT_EMAIL_FROM=${ALERT_EMAIL_FROM:-}
ALERT_SMTP_SMARTHOST=${ALERT_SMTP_SMARTHOST:-}
ALERT_SMTP_USERNAME=${ALERT_SMTP_USERNAME:-}
ALERT_SMTP_REQUIRE_TLS=${ALERT_SMTP_REQUIRE_TLS:-true}
ALERT_WORKING_DAYS=${ALERT_WORKING_DAYS:-monday:friday}
ALERT_WORKING_HOURS=${ALERT_WORKING_HOURS:-09:00-18:00}
ALERT_TIMEZONE=${ALERT_TIMEZONE:-UTC}

fail() {
    echo "render-alertmanager: $1" >&2
    exit 1
}

# The path of a secret file when it holds something, else nothing.
secret() {
    [ ! -s "$ALERT_SECRETS_DIR/$1" ] || printf '%s' "$ALERT_SECRETS_DIR/$1"
}

# A YAML double-quoted scalar holding $1 verbatim.
quote() {
    printf '"%s"' "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')"
}

PAGERDUTY=$(secret pagerduty_routing_key)
OPSGENIE=$(secret opsgenie_api_key)
SLACK=$(secret slack_webhook_url)
SMTP_PASSWORD=$(secret smtp_password)
HEARTBEAT=$(secret heartbeat_url)

# A pager with no dead man's switch: if Prometheus or Alertmanager dies, the pager stays silent and nobody knows.
if { [ -n "$PAGERDUTY" ] || [ -n "$OPSGENIE" ]; } && [ -z "$HEARTBEAT" ]; then
    echo "render-alertmanager: WARNING: a pager is configured without the heartbeat_url secret: nothing outside" \
        "the stack will notice when Prometheus or Alertmanager stops (docs/operations.md)" >&2
fi
if [ -n "$ALERT_EMAIL_TO" ] && { [ -z "$ALERT_EMAIL_FROM" ] || [ -z "$ALERT_SMTP_SMARTHOST" ]; }; then
    fail "ALERT_EMAIL_TO needs ALERT_EMAIL_FROM and ALERT_SMTP_SMARTHOST (host:port)"
fi
if [ -n "$SMTP_PASSWORD" ] && { [ -z "$ALERT_EMAIL_TO" ] || [ -z "$ALERT_SMTP_USERNAME" ]; }; then
    fail "the smtp_password secret needs ALERT_EMAIL_TO and ALERT_SMTP_USERNAME"
fi
case "$ALERT_SMTP_REQUIRE_TLS" in
    true | false) ;;
    *) fail "ALERT_SMTP_REQUIRE_TLS must be true or false" ;;
esac
case "$ALERT_WORKING_HOURS" in
    [0-2][0-9]:[0-5][0-9]-[0-2][0-9]:[0-5][0-9]) ;;
    *) fail "ALERT_WORKING_HOURS must look like 09:00-18:00" ;;
esac

# One webhook: $1 the URL, $2 whether to send resolved notifications too.
webhook() {
    cat <<EOF
      - url: $(quote "$1")
        send_resolved: $2
EOF
}

inbox_alerts() {
    [ -z "$ALERT_INBOX_URL" ] || { echo "    webhook_configs:" && webhook "${ALERT_INBOX_URL%/}/alerts" true; }
}

critical() {
    inbox_alerts
    if [ -n "$PAGERDUTY" ]; then
        cat <<EOF
    pagerduty_configs:
      - routing_key_file: $(quote "$PAGERDUTY")
        send_resolved: true
        description: '{{ template "vigil.title" . }}'
        details:
          alerts: '{{ template "vigil.text" . }}'
EOF
    fi
    if [ -n "$OPSGENIE" ]; then
        cat <<EOF
    opsgenie_configs:
      - api_key_file: $(quote "$OPSGENIE")
        send_resolved: true
        priority: P1
        message: '{{ template "vigil.title" . }}'
        description: '{{ template "vigil.text" . }}'
EOF
        [ -z "$ALERT_OPSGENIE_API_URL" ] || printf '        api_url: %s\n' "$(quote "$ALERT_OPSGENIE_API_URL")"
    fi
}

warning() {
    inbox_alerts
    if [ -n "$SLACK" ]; then
        cat <<EOF
    slack_configs:
      - api_url_file: $(quote "$SLACK")
        send_resolved: true
        color: '{{ if eq .Status "firing" }}warning{{ else }}good{{ end }}'
        title: '{{ template "vigil.title" . }}'
        text: '{{ template "vigil.text" . }}'
EOF
        [ -z "$ALERT_SLACK_CHANNEL" ] || printf '        channel: %s\n' "$(quote "$ALERT_SLACK_CHANNEL")"
    fi
    if [ -n "$ALERT_EMAIL_TO" ]; then
        cat <<EOF
    email_configs:
      - to: $(quote "$ALERT_EMAIL_TO")
        from: $(quote "$ALERT_EMAIL_FROM")
        smarthost: $(quote "$ALERT_SMTP_SMARTHOST")
        require_tls: $ALERT_SMTP_REQUIRE_TLS
        send_resolved: true
        headers:
          Subject: '{{ template "vigil.title" . }}'
        html: ''
        text: '{{ template "vigil.text" . }}'
EOF
        [ -z "$ALERT_SMTP_USERNAME" ] || printf '        auth_username: %s\n' "$(quote "$ALERT_SMTP_USERNAME")"
        [ -z "$SMTP_PASSWORD" ] || printf '        auth_password_file: %s\n' "$(quote "$SMTP_PASSWORD")"
    fi
}

heartbeat() {
    if [ -n "$ALERT_INBOX_URL" ] || [ -n "$HEARTBEAT" ]; then
        echo "    webhook_configs:"
    fi
    [ -z "$ALERT_INBOX_URL" ] || webhook "${ALERT_INBOX_URL%/}/heartbeat" false
    [ -z "$HEARTBEAT" ] || webhook "$(tr -d '\r\n' < "$HEARTBEAT")" false
}

cat <<EOF
# Generated by alerts/render-alertmanager.sh; edit that script, not this file.
# This is the rendering with no ALERT_* variable and no secret file: every notification goes to the local inbox.
templates:
  - templates/*.tmpl

route:
  receiver: warning
  group_by: [alertname, instance, model]
  routes:
    # The heartbeat goes out every minute for as long as the pipeline works.
    - receiver: heartbeat
      matchers: ['alertname="VigilWatchdog"']
      group_wait: 0s
      group_interval: 1m
      repeat_interval: 1m
    # Critical alerts go out fast and repeat hourly.
    - receiver: critical
      matchers: ['severity="critical"']
      group_wait: 10s
      group_interval: 1m
      repeat_interval: 1h
    # Warnings are batched, repeat every 4 hours, and wait for working hours.
    - receiver: warning
      matchers: ['severity="warning"']
      group_wait: 1m
      group_interval: 5m
      repeat_interval: 4h
      active_time_intervals: [working-hours]

time_intervals:
  - name: working-hours
    time_intervals:
      - weekdays: [$(quote "$ALERT_WORKING_DAYS")]
        times:
          - start_time: $(quote "${ALERT_WORKING_HOURS%-*}")
            end_time: $(quote "${ALERT_WORKING_HOURS#*-}")
        location: $(quote "$ALERT_TIMEZONE")

inhibit_rules:
  # While a critical alert fires for an instance, or for an SLO, the matching warnings are noise.
  - source_matchers: ['severity="critical"']
    target_matchers: ['severity="warning"']
    equal: [instance, slo]
  # While no replica is left at all, the page for each vanished replica says nothing more.
  - source_matchers: ['alertname="VigilAbsent"']
    target_matchers: ['alertname="VigilReplicaMissing"']
    equal: [job]
  # While the fleet's availability budget burns fast enough to page, each replica's 5xx page repeats it.
  - source_matchers: ['alertname="VigilAvailabilityBudgetBurn"', 'severity="critical"']
    target_matchers: ['alertname="VigilHighErrorRate"']

receivers:
  - name: critical
$(critical)
  - name: warning
$(warning)
  - name: heartbeat
$(heartbeat)
EOF
