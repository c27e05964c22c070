#!/usr/bin/env bash
# Installs every Debian package kvferry builds and tests with. Idempotent:
# when all packages are present it only checks and returns.
set -euo pipefail

packages=(
    build-essential cmake pkg-config git
    libucx-dev ucx-utils
    libnanomsg-dev
    libprotobuf-c-dev protobuf-c-compiler
    libcmocka-dev
    libopenblas-dev
    libcjson-dev
    libpcre2-dev
    libmicrohttpd-dev
    curl iproute2 procps python3 python3-yaml gnuplot-nox
)

missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
    echo "install-deps: all ${#packages[@]} packages present"
    exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
    sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
