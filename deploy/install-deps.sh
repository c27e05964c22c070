#!/usr/bin/env bash
# Installs every Debian package kvferry builds and tests with. Idempotent:
# when all packages are present it only checks and returns.
set -euo pipefail

packages=(
    build-essential cmake pkg-config git
    libucx-dev ucx-utils
    libnanomsg-dev
    libsodium-dev # HMAC-SHA256 of the control plane (--cluster-key-file)
    libprotobuf-c-dev protobuf-c-compiler
    libcmocka-dev
    libopenblas-dev
    libcjson-dev
    libpcre2-dev
    libutf8proc-dev # Unicode normalization of tokenizer.json normalizers (NFC, NFKC, ...)
    libmicrohttpd-dev
    uthash-dev # header only: the AArch64 cross build includes the same uthash.h
    curl iproute2 procps python3 python3-yaml python3-numpy gnuplot-nox xz-utils
    # the AArch64 build of the numerics tests (tests/cross/aarch64.sh): the
    # cross compiler, qemu's user-mode emulator and the target's cJSON and
    # cmocka as :arm64 multiarch packages (the C library to link against,
    # libc6-dev-arm64-cross, is only a recommendation of the compiler)
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libcjson-dev:arm64 libcmocka-dev:arm64
)

# A package is present when installed for its architecture: the one it
# names (libcjson-dev:arm64), else the machine's own (or "all"). With the
# arm64 instances installed, a plain name matches both.
native=$(dpkg --print-architecture)
missing=()
for p in "${packages[@]}"; do
    want=$native
    [[ $p == *:* ]] && want=${p##*:}
    if ! dpkg-query -W -f='${Status} ${Architecture}\n' "${p%%:*}" 2>/dev/null |
        grep -Eqx "install ok installed ($want|all)"; then
        missing+=("$p")
    fi
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
if [[ " ${missing[*]}" == *":arm64"* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
    "${sudo_cmd[@]}" dpkg --add-architecture arm64
fi
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
