#!/usr/bin/env bash
# Downloads Debian's kernel packages for the kernel matrix and unpacks each into the cache,
# never installing them. Uses a private apt configuration (its own sources, lists and
# archives) so the machine's apt sources are left as they are; the archive addresses are the
# ones this machine's apt already uses.
#
#   fetch-kernels.sh [CACHE_DIR]     prints one line per kernel: NAME <tab> UNPACKED_ROOT
#
# A kernel already unpacked in the cache is not fetched again; its package lists are
# refreshed at most once a day.
set -euo pipefail

cache=${1:-${EBPF_METRICSD_KERNEL_CACHE:-/var/cache/ebpf-metricsd/kernels}}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

# name  suite  meta-package
KERNELS=(
  "5.10 bullseye-security linux-image-amd64"
  "5.10-cloud bullseye-security linux-image-cloud-amd64"
  "6.1 bookworm linux-image-amd64"
  "6.1-cloud bookworm linux-image-cloud-amd64"
  "6.1-rt bookworm linux-image-rt-amd64"
  "6.12 bookworm-security linux-image-6.12-amd64"
  "newest trixie-backports linux-image-amd64"
)

# The archive and security archive this machine's apt is configured with (deb822 or
# one-line format).
archive_uris() {
  local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
  local f
  for f in "${files[@]}"; do
    [[ -f $f ]] || continue
    if [[ $f == *.sources ]]; then
      awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}' "$f"
    else
      awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}' "$f"
    fi
  done | sort -u
}
main_uri=$(archive_uris | grep -E '/debian/?$' | head -1 || true)
security_uri=$(archive_uris | grep -E '/debian-security/?$' | head -1 || true)
if [[ -z $main_uri || -z $security_uri ]]; then
  echo "fetch-kernels: no Debian archive and security archive in this machine's apt sources" >&2
  exit 2
fi

apt_root=$cache/apt
mkdir -p "$apt_root/lists/partial" "$apt_root/archives/partial" "$apt_root/etc"
cat >"$apt_root/etc/sources.list" <<SOURCES
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $main_uri bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $security_uri bookworm-security main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $security_uri bullseye-security main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $main_uri trixie-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $main_uri trixie main
SOURCES
APT_OPTS=(
  -o Dir::Etc::SourceList="$apt_root/etc/sources.list"
  -o Dir::Etc::SourceParts=/nonexistent
  -o Dir::State::Lists="$apt_root/lists"
  -o Dir::State::Status="$apt_root/status"
  -o Dir::Cache="$apt_root/cache"
  -o Dir::Cache::Archives="$apt_root/archives"
  -o APT::Get::List-Cleanup=false
  -o Debug::NoLocking=true
  -o APT::Sandbox::User=root
  -o APT::Architecture=amd64
  -o APT::Architectures::=amd64
)
touch "$apt_root/status"
mkdir -p "$apt_root/cache"

all_cached=1
for k in "${KERNELS[@]}"; do
  read -r name _ _ <<<"$k"
  [[ -f $cache/$name/.complete ]] || all_cached=0
done
stamp=$apt_root/lists/.updated
if ((!all_cached)) && [[ ! -f $stamp || -n $(find "$stamp" -mmin +1440) ]]; then
  apt-get "${APT_OPTS[@]}" -q update >&2
  touch "$stamp"
fi

# The packages that hold a meta package's kernel image and modules: the meta package's
# dependencies that are themselves kernel packages (7.x splits them into linux-binary-* and
# linux-modules-*), followed one level further.
kernel_packages() {
  local meta=$1 suite=$2
  local image
  image=$(apt-cache "${APT_OPTS[@]}" -o APT::Default-Release="$suite" depends "$meta/$suite" 2>/dev/null |
    awk '/Depends: linux-(image|binary)-[0-9]/ {print $2; exit}')
  [[ -n $image ]] || return 1
  echo "$image"
  apt-cache "${APT_OPTS[@]}" depends "$image/$suite" 2>/dev/null |
    awk '/Depends: linux-(image|binary|modules)-[0-9]/ {print $2}' | sort -u
}

for k in "${KERNELS[@]}"; do
  read -r name suite meta <<<"$k"
  dest=$cache/$name
  if [[ ! -f $dest/.complete ]]; then
    pkgs=$(kernel_packages "$meta" "$suite") || {
      echo "fetch-kernels: $meta has no kernel image in $suite" >&2
      exit 2
    }
    rm -rf "$dest" "$cache/dl-$name"
    mkdir -p "$dest" "$cache/dl-$name"
    for p in $pkgs; do
      (cd "$cache/dl-$name" && apt-get "${APT_OPTS[@]}" -q download "$p/$suite" >&2)
    done
    for deb in "$cache/dl-$name"/*.deb; do
      dpkg-deb -x "$deb" "$dest"
    done
    rm -rf "$cache/dl-$name"
    # Since 7.x the packages put everything under usr/lib/modules/VERSION.
    if [[ ! -d $dest/lib/modules && -d $dest/usr/lib/modules ]]; then
      ln -s usr/lib "$dest/lib"
    fi
    version=$(ls "$dest/lib/modules" 2>/dev/null | head -1)
    if [[ -n $version && ! -f $dest/boot/vmlinuz-$version && -f $dest/lib/modules/$version/vmlinuz ]]; then
      mkdir -p "$dest/boot"
      ln -s "../lib/modules/$version/vmlinuz" "$dest/boot/vmlinuz-$version"
    fi
    [[ -n $version && -f $dest/boot/vmlinuz-$version ]] || {
      echo "fetch-kernels: $pkgs holds no /boot/vmlinuz and /lib/modules" >&2
      exit 2
    }
    depmod -b "$dest" "$version"
    echo "$version" >"$dest/.version"
    touch "$dest/.complete"
  fi
  printf '%s\t%s\n' "$name" "$dest"
done
