#!/bin/sh
# What `make serve` wants besides the venv: Debian's libjemalloc2, the allocator `python -m server` preloads
# (server/allocator.py). As root with apt-get it is installed when missing; otherwise one line says that the server
# runs on glibc's malloc (slower on the CPU), and make serve goes on.
set -eu

PATH="$PATH:/usr/sbin:/sbin"
case "$(ldconfig -p 2>/dev/null)" in *libjemalloc.so.2*) exit 0 ;; esac
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "make serve: without libjemalloc2 the server runs on glibc's malloc: \`sudo apt-get install libjemalloc2\`" >&2
    exit 0
fi
echo "make serve: installing libjemalloc2" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q && apt-get install -y -q --no-install-recommends libjemalloc2 \
    || echo "make serve: libjemalloc2 did not install; the server runs on glibc's malloc" >&2
