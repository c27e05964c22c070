#!/usr/bin/env bash
# Installs every Debian package kvferry builds and tests with. Idempotent:
# when all packages are present it only checks and returns.
#
#   deploy/install-deps.sh             build and test packages
#   deploy/install-deps.sh --runtime   only the shared libraries the kvferry
#                                      binaries load (container run stage)
set -euo pipefail

build_packages=(
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
# The run-time halves of the -dev packages above (same names on Debian 12
# and Ubuntu 22.04), plus ucx_info for checking transports on a host.
runtime_packages=(
    libucx0 ucx-utils libnanomsg5 libprotobuf-c1 libopenblas0 libcjson1 libpcre2-8-0
    libmicrohttpd12 ca-certificates
)
case "${1:-}" in
"") packages=("${build_packages[@]}") ;;
--runtime) packages=("${runtime_packages[@]}") ;;
*) echo "install-deps: unknown argument $1 (expected --runtime or nothing)" >&2; exit 2 ;;
esac

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
