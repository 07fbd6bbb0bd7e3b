#!/bin/sh
# What `make test` needs besides the venv: the monitoring binaries its tests run for real, from Debian's packages
# prometheus (prometheus, promtool), prometheus-alertmanager (prometheus-alertmanager, amtool), haproxy and
# docker-registry (the image registry deploy/pin_images.py is tested against), kubectl (its kustomize builds
# deploy/kubernetes; the package of the Kubernetes apt repository, pkgs.k8s.io), chromium (headless, it opens the
# live console) and libjemalloc2 (the allocator `python -m server` preloads, server/allocator.py).
# As root with apt-get, it installs the missing packages; otherwise it stops with one line naming them.
set -eu

# haproxy lives in /usr/sbin, which a user's PATH often lacks.
PATH="$PATH:/usr/sbin:/sbin"
missing=""
for pair in promtool:prometheus prometheus:prometheus amtool:prometheus-alertmanager \
    prometheus-alertmanager:prometheus-alertmanager haproxy:haproxy kubectl:kubectl \
    docker-registry:docker-registry chromium:chromium; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing="$missing ${pair#*:}"
done
case "$(ldconfig -p 2>/dev/null)" in *libjemalloc.so.2*) ;; *) missing="$missing libjemalloc2" ;; esac
[ -n "$missing" ] || exit 0
packages=$(printf '%s\n' $missing | sort -u | tr '\n' ' ' | sed 's/ $//')

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "make test needs the Debian packages $packages: run \`sudo apt-get install $packages\`, then make test again" >&2
    exit 1
fi
echo "make test: installing $packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends $packages
