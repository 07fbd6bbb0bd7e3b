#!/bin/sh
# Starts Grafana (the arguments: the image's /run.sh) with an admin password that is never the default admin/admin.
# The password is the `grafana_admin_password` secret when its file is not empty; otherwise one is made at random
# on first start and kept, readable by Grafana only, beside Grafana's data (GF_PATHS_DATA, a volume):
#   docker compose exec grafana cat /var/lib/grafana/admin-password
# Grafana sets the admin password when it creates its database, so a later change goes through `grafana cli admin
# reset-admin-password`. POSIX sh only: the grafana image is Alpine's busybox.
set -eu

secret=${GRAFANA_ADMIN_PASSWORD_SECRET:-/run/secrets/grafana_admin_password}
if [ -s "$secret" ]; then
    GF_SECURITY_ADMIN_PASSWORD__FILE=$secret
else
    made="${GF_PATHS_DATA:-/var/lib/grafana}/admin-password"
    if [ ! -s "$made" ]; then
        (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '\n' > "$made")
        echo "grafana: no grafana_admin_password secret; admin's password was made at random: $made"
    fi
    GF_SECURITY_ADMIN_PASSWORD__FILE=$made
fi
export GF_SECURITY_ADMIN_PASSWORD__FILE
unset GF_SECURITY_ADMIN_PASSWORD
exec "$@"
