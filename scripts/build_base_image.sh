#!/usr/bin/env bash
# Build the offline stand-ins for the images docker-compose.yml pulls from a hub, for machines
# that reach Debian's package archive and PyPI but no image registry (scripts/check_compose.sh):
#
#   mathdebate-base:py311-bookworm  stands in for python:3.11-slim: Debian bookworm (minbase,
#       debootstrap) with its python3 (3.11) and a venv at /opt/venv first on PATH, so `python`
#       and `pip` are what the Dockerfile expects. The machine's CA bundle and pip settings
#       (/etc/pip.conf, PIP_DEFAULT_TIMEOUT) are copied in, so pip inside `docker build` reaches
#       the package index exactly as pip on the host does.
#   mathdebate-nginx:bookworm       stands in for nginx:1.27-alpine: Debian's nginx on that base,
#       `nginx -g 'daemon off;'`, config at /etc/nginx/nginx.conf as in the official image.
#
# Cached: an image that exists is not built again (FORCE=1 rebuilds both). Needs root,
# debootstrap and a running Docker daemon. Builds use the host network (no container address).
set -euo pipefail
BASE_IMAGE="${BASE_IMAGE:-mathdebate-base:py311-bookworm}"
NGINX_IMAGE="${NGINX_IMAGE:-mathdebate-nginx:bookworm}"
SUITE=bookworm

have_image() { [ "${FORCE:-0}" != 1 ] && docker image inspect "$1" >/dev/null 2>&1; }

# The Debian mirror the host's apt uses (deb822 .sources or a sources.list line); empty: debootstrap's default.
host_mirror() {
    local uri
    uri=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -E '/debian/?$' | head -1 || true)
    [ -n "$uri" ] || uri=$(grep -hsE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -E '/debian/?$' | head -1 || true)
    echo "$uri"
}

if have_image "$BASE_IMAGE"; then
    echo "base image $BASE_IMAGE exists (cached)"
else
    start=$(date +%s)
    root=$(mktemp -d /var/tmp/mathdebate-rootfs.XXXXXX)
    # An interrupted debootstrap can leave /proc, /sys or /dev mounted inside the folder: unmount
    # them first, and never let rm cross into a mount.
    remove_root() {
        awk -v r="$root/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
        rm -rf --one-file-system "$root" "$root.log"
    }
    trap remove_root EXIT
    echo "debootstrap $SUITE (minbase + python3) into $root"
    mirror=$(host_mirror)
    # shellcheck disable=SC2086
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$root" $mirror \
        > "$root.log" 2>&1 || { tail -20 "$root.log"; exit 1; }
    # The host's CA bundle (and any local CAs, kept by a later update-ca-certificates) and pip settings.
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    if compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
        cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
    fi
    [ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
    chroot "$root" /usr/bin/python3 -m venv /opt/venv
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    changes=(--change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
             --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]')
    [ -n "${PIP_DEFAULT_TIMEOUT:-}" ] && changes+=(--change "ENV PIP_DEFAULT_TIMEOUT=$PIP_DEFAULT_TIMEOUT")
    tar -C "$root" -c . | docker import "${changes[@]}" - "$BASE_IMAGE" >/dev/null
    remove_root
    trap - EXIT
    echo "built $BASE_IMAGE in $(( $(date +%s) - start ))s"
fi

if have_image "$NGINX_IMAGE"; then
    echo "nginx image $NGINX_IMAGE exists (cached)"
else
    start=$(date +%s)
    # policy-rc.d: the package's postinst must not start nginx on the host network during the build.
    # (the classic builder: Debian's docker.io has no buildx; its deprecation notice goes to stderr)
    docker build --network host -q -t "$NGINX_IMAGE" - >/dev/null <<EOF
FROM $BASE_IMAGE
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \\
 && apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx >/dev/null \\
 && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \\
 && ln -sf /dev/stdout /var/log/nginx/access.log && ln -sf /dev/stderr /var/log/nginx/error.log
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
EOF
    echo "built $NGINX_IMAGE in $(( $(date +%s) - start ))s"
fi
