#!/usr/bin/env bash
# Builds nvshim's packages, under NVIDIA's package names, from the release binaries
# (`make package` runs this). Into <out>:
#   <package>_<version>_<arch>.deb        dpkg-deb, reproducible (nvidia-docker2: _all)
#   <package>-<version>-1.<arch>.rpm      rpmbuild -bb packaging/rpm/nvshim.spec, signed
#   apt/   flat apt repository, signed:   deb [signed-by=<out>/apt/nvshim.gpg] file:<out>/apt ./
#   yum/   yum/dnf repository: signed rpms, repodata/repomd.xml.asc
# for the packages nvidia-container-toolkit-base, nvidia-container-toolkit,
# libnvidia-container-tools, nvidia-docker2 and nvshim (packaging/README.md has the
# table). Both formats are made from the same staged trees, so they ship the same files.
#
# The version carries epoch 1 (deb 1:<version>, rpm Epoch: 1), so that ours is newer
# than NVIDIA's packages of the same names (1.x) and apt/dnf upgrade from them.
#
# Environment:
#   NVSHIM_VERSION      package version (default: nvshim's version in Cargo.toml)
#   NVSHIM_ARCH         the Debian architecture of the binaries: amd64 or arm64 (default:
#                       this machine's, dpkg --print-architecture); rpms get the rpm name
#                       (x86_64, aarch64). Each binary's ELF machine must match it. For
#                       another architecture than this machine's, NVSHIM_BIN_DIR is required
#                       (nothing is built here) and the default output directory is
#                       target/packages-<arch>
#   NVSHIM_PACKAGE_DIR  output directory (default: target/packages)
#   NVSHIM_BIN_DIR      where the binaries are (default: target/static/release)
#   NVSHIM_SKIP_CARGO=1 never build: fail if a binary is missing (default: missing
#                       binaries are built with `make static-runtime`; present ones
#                       are used as they are)
#   NVSHIM_FORMATS      "deb rpm" (default), "deb" or "rpm"
#   NVSHIM_DEBS         the .debs to build and put in apt/ (default: all five; the
#                       spec always makes every rpm)
#   NVSHIM_GPG_HOME     gnupg home with the signing key (default: <out>.gnupg, where a
#                       key without passphrase is generated if none is there: for test
#                       builds; it sits beside <out> so publishing <out> leaks nothing)
#   NVSHIM_GPG_KEY      the key to sign with (default: the home's first secret key)
#   NVSHIM_ALLOW_MISSING_UNITS=1  build without deployments/udev/71-nvidia-dev-char.rules
#                       and deployments/systemd/nvidia-dev-char-symlinks.service
#                       (default: both are required)
#   SOURCE_DATE_EPOCH   every timestamp in the packages (default: the last git
#                       commit's time, else 2024-01-01)
set -euo pipefail
umask 022
export LC_ALL=C TZ=UTC

die() {
  echo "packaging/build.sh: $*" >&2
  exit 1
}

root=$(cd "$(dirname "$0")/.." && pwd)
pkg=$root/packaging
command -v dpkg >/dev/null 2>&1 || die "dpkg not found (install the dpkg package)"
host_arch=$(dpkg --print-architecture)
arch=${NVSHIM_ARCH:-$host_arch}
bin_dir=${NVSHIM_BIN_DIR:-$root/target/static/release}
if [ "$arch" = "$host_arch" ]; then
  out=${NVSHIM_PACKAGE_DIR:-$root/target/packages}
else
  [ -n "${NVSHIM_BIN_DIR:-}" ] || die "NVSHIM_ARCH=$arch (not this machine's $host_arch) needs NVSHIM_BIN_DIR"
  out=${NVSHIM_PACKAGE_DIR:-$root/target/packages-$arch}
fi
formats=${NVSHIM_FORMATS:-deb rpm}
bins=(nvidia-container-runtime nvidia-container-runtime-hook nvidia-device-plugin nvshim)
packages=(nvidia-container-toolkit-base nvidia-container-toolkit libnvidia-container-tools
  nvidia-docker2 nvshim)
epoch=1
debs=(${NVSHIM_DEBS:-${packages[*]}})
udev_rule=deployments/udev/71-nvidia-dev-char.rules
systemd_unit=deployments/systemd/nvidia-dev-char-symlinks.service
# The exporter's unit (`nvshim exporter`), beside /usr/bin/nvshim in the base package;
# shipped disabled, always required.
exporter_unit=deployments/systemd/nvshim-exporter.service

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 not found (install the $2 package)"
}

wants() {
  case " $formats " in *" $1 "*) return 0 ;; *) return 1 ;; esac
}

cargo_version() {
  local v=""
  if command -v "${CARGO:-cargo}" >/dev/null 2>&1; then
    v=$("${CARGO:-cargo}" metadata --no-deps --format-version 1 --offline \
      --manifest-path "$root/Cargo.toml" 2>/dev/null |
      grep -o '"name":"nvshim","version":"[^"]*"' | head -n1 | cut -d'"' -f8) || true
  fi
  if [ -z "$v" ]; then
    # Without cargo: the workspace version, which nvshim inherits.
    v=$(awk '/^\[/{s=($0=="[workspace.package]")} s && /^version *=/{gsub(/[" ]/,"");
      sub(/^version=/,""); print; exit}' "$root/Cargo.toml")
  fi
  [ -n "$v" ] || die "cannot read nvshim's version from Cargo.toml"
  echo "$v"
}

version=${NVSHIM_VERSION:-$(cargo_version)}
# A cargo pre-release (1.0.0-rc.1) sorts before its release in both formats as
# 1.0.0~rc.1; rpm also forbids '-' in a Version.
version=${version//-/\~}
deb_version=$epoch:$version
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || true)
  SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1704067200}
fi
export SOURCE_DATE_EPOCH

# rpm's name for the architecture, and the ELF e_machine its binaries have.
case "$arch" in
  amd64) rpm_arch=x86_64 machine=62 ;;
  arm64) rpm_arch=aarch64 machine=183 ;;
  ppc64el) rpm_arch=ppc64le machine=21 ;;
  *) die "NVSHIM_ARCH=$arch: not amd64, arm64 or ppc64el" ;;
esac

missing=()
for b in "${bins[@]}"; do
  [ -x "$bin_dir/$b" ] || missing+=("$b")
done
if [ "${#missing[@]}" -gt 0 ]; then
  [ "${NVSHIM_SKIP_CARGO:-0}" != 1 ] || die "missing in $bin_dir: ${missing[*]} (run make static-runtime)"
  [ -z "${NVSHIM_BIN_DIR:-}" ] || die "missing in $bin_dir: ${missing[*]}"
  make -C "$root" static-runtime
fi
for p in "${debs[@]}"; do
  case " ${packages[*]} " in
    *" $p "*) ;;
    *) die "NVSHIM_DEBS: $p is not one of ${packages[*]}" ;;
  esac
done
units=()
for f in "$udev_rule" "$systemd_unit"; do
  if [ -f "$root/$f" ]; then
    units+=("$f")
  elif [ "${NVSHIM_ALLOW_MISSING_UNITS:-0}" = 1 ]; then
    echo "packaging/build.sh: warning: $f is missing; nvidia-container-toolkit-base is built without it (NVSHIM_ALLOW_MISSING_UNITS=1)" >&2
  else
    die "$f is missing (set NVSHIM_ALLOW_MISSING_UNITS=1 to build without it)"
  fi
done
[ -f "$root/$exporter_unit" ] || die "$exporter_unit is missing"
need readelf binutils
need gpg gnupg
# Each binary is of the packages' architecture (e_machine: 2 bytes at offset 18, little-endian).
for b in "${bins[@]}"; do
  m=$(od -An -tu2 -j18 -N2 "$bin_dir/$b" | tr -d ' ')
  [ "$m" = "$machine" ] || die "$bin_dir/$b: ELF machine $m, not $arch's ($machine)"
done
# strip for the binaries' architecture: this machine's, or the cross binutils'.
strip=strip
case "$arch" in
  "$host_arch") need strip binutils ;;
  arm64)
    strip=aarch64-linux-gnu-strip
    need "$strip" binutils-aarch64-linux-gnu
    ;;
  *) die "no strip for $arch binaries on $host_arch" ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
changelog_date=$(date -u -R -d "@$SOURCE_DATE_EPOCH")

# debian/<package>/ is the layout dpkg-shlibdeps expects.
stage_dir() {
  echo "$work/debian/$1"
}

# A new staged package with its doc dir: copyright and (Debian-only, the rpm spec
# leaves it out) the changelog, named as policy wants it for a native package.
new_stage() {
  local s doc
  s=$(stage_dir "$1")
  doc=$s/usr/share/doc/$1
  install -d -m 0755 "$s/usr/bin" "$doc"
  install -m 0644 "$pkg/deb/copyright" "$doc/copyright"
  sed -e "s/@VERSION@/$deb_version/g" -e "s/@DATE@/$changelog_date/" "$pkg/deb/changelog" |
    gzip -9 -n >"$doc/changelog.gz"
  chmod 0644 "$doc/changelog.gz"
  if [ -f "$pkg/deb/$1/lintian-overrides" ]; then
    install -D -m 0644 "$pkg/deb/$1/lintian-overrides" "$s/usr/share/lintian/overrides/$1"
  fi
}

# install_bin PACKAGE BINARY [NAME]: stripped, as dh_strip does.
install_bin() {
  local dest
  dest=$(stage_dir "$1")/usr/bin/${3:-$2}
  install -m 0755 "$bin_dir/$2" "$dest"
  "$strip" --strip-unneeded --remove-section=.comment --remove-section=.note "$dest"
}

# link PACKAGE NAME TARGET: /usr/bin/NAME -> TARGET (relative, in /usr/bin).
link() {
  ln -s "$3" "$(stage_dir "$1")/usr/bin/$2"
}

b=nvidia-container-toolkit-base
new_stage $b
install_bin $b nvidia-container-runtime
install_bin $b nvshim nvidia-ctk
link $b nvidia-cdi-hook nvidia-ctk
link $b nvshim nvidia-ctk
install -D -m 0644 "$pkg/config.toml" "$(stage_dir $b)/etc/nvidia-container-runtime/config.toml"
for f in "${units[@]}"; do
  case "$f" in
    */udev/*) dest=usr/lib/udev/rules.d ;;
    *) dest=usr/lib/systemd/system ;;
  esac
  install -D -m 0644 "$root/$f" "$(stage_dir $b)/$dest/$(basename "$f")"
done
install -D -m 0644 "$root/$exporter_unit" "$(stage_dir $b)/usr/lib/systemd/system/$(basename "$exporter_unit")"

t=nvidia-container-toolkit
new_stage $t
install_bin $t nvidia-container-runtime-hook
link $t nvidia-container-toolkit nvidia-container-runtime-hook
install -D -m 0644 "$root/hooks.d/oci-nvidia-hook.json" \
  "$(stage_dir $t)/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json"

new_stage libnvidia-container-tools
link libnvidia-container-tools nvidia-container-cli nvidia-ctk

new_stage nvidia-docker2
link nvidia-docker2 nvidia-docker nvidia-ctk

new_stage nvshim
install_bin nvshim nvidia-device-plugin
link nvshim gpu-feature-discovery nvidia-ctk
install -m 0644 "$root/README.md" "$(stage_dir nvshim)/usr/share/doc/nvshim/README.md"

# The signing key: NVSHIM_GPG_HOME, or one generated (once) beside <out>.
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -z "${NVSHIM_GPG_HOME:-}" ]; then
  export NVSHIM_GPG_HOME=$out.gnupg
  bash "$pkg/repo.sh" keygen "$NVSHIM_GPG_HOME"
fi

# build_deb PACKAGE: control from packaging/deb/PACKAGE/control, maintainer scripts
# and conffiles from the same directory.
build_deb() {
  local p=$1 s dir size ctl_arch shlibs dynamic f
  s=$(stage_dir "$p")
  dir=$pkg/deb/$p
  # Installed-Size as dpkg-gencontrol computes it: KiB per file, rounded up, and 1
  # per directory or link.
  size=$(find "$s" -mindepth 1 -printf '%y %s\n' |
    awk '{ n += ($1 == "f") ? int(($2 + 1023) / 1024) : 1 } END { print n }')
  install -d -m 0755 "$s/DEBIAN"
  # ${shlibs:Depends}, from the dynamically linked binaries (dpkg-shlibdeps finds
  # the package root by its DEBIAN/).
  shlibs=""
  dynamic=()
  for f in "$s"/usr/bin/*; do
    if [ -f "$f" ] && [ ! -L "$f" ] && readelf -d "$f" | grep -q NEEDED; then
      dynamic+=("debian/$p/usr/bin/$(basename "$f")")
    fi
  done
  if [ "${#dynamic[@]}" -gt 0 ]; then
    printf 'Source: nvshim\n\nPackage: %s\nArchitecture: any\n' "$p" >"$work/debian/control"
    # DEB_HOST_ARCH: the libraries are looked up in that architecture's multiarch
    # directory and packages (libc6:arm64 for arm64 binaries).
    shlibs=$(cd "$work" && DEB_HOST_ARCH=$arch dpkg-shlibdeps -O "${dynamic[@]}" |
      sed -n 's/^shlibs:Depends=//p')
    rm -f "$work/debian/control"
    [ -n "$shlibs" ] || die "$p: dpkg-shlibdeps found no dependencies"
  fi
  if grep -q '@SHLIBS@' "$dir/control"; then
    [ -n "$shlibs" ] || die "$p: its control wants @SHLIBS@ but it has no dynamic binary"
  else
    # Without @SHLIBS@ the package would not depend on the libraries its binaries need.
    [ -z "$shlibs" ] || die "$p: ${dynamic[*]} dynamically linked, but its control has no @SHLIBS@ (the runtime and the hook are linked statically)"
  fi
  sed -e "s/@VERSION@/$deb_version/g" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$size/" \
    -e "s/@SHLIBS@/$shlibs/" "$dir/control" >"$s/DEBIAN/control"
  chmod 0644 "$s/DEBIAN/control"
  if [ -f "$dir/conffiles" ]; then
    install -m 0644 "$dir/conffiles" "$s/DEBIAN/conffiles"
  fi
  # md5sums for debsums, without the conffiles (dpkg tracks their hashes), as dh_md5sums.
  (cd "$s" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' |
    sort -z | xargs -0 md5sum) >"$s/DEBIAN/md5sums"
  chmod 0644 "$s/DEBIAN/md5sums"
  for f in preinst postinst prerm postrm; do
    if [ -f "$dir/$f" ]; then
      install -m 0755 "$dir/$f" "$s/DEBIAN/$f"
    fi
  done
  find "$s" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  ctl_arch=$(sed -n 's/^Architecture: //p' "$s/DEBIAN/control")
  local deb=$out/${p}_${version}_${ctl_arch}.deb
  dpkg-deb --build --root-owner-group -Zxz "$s" "$deb" >/dev/null
  rm -rf "$s/DEBIAN"
  echo "built $deb"
}

if wants deb; then
  need dpkg-deb dpkg
  need dpkg-shlibdeps dpkg-dev
  rm -rf "$out/apt"
  mkdir -p "$out/apt"
  for p in "${debs[@]}"; do
    build_deb "$p"
    cp "$out/${p}_${version}_"*.deb "$out/apt/"
  done
  bash "$pkg/repo.sh" apt "$out/apt"
  echo "apt repository: deb [signed-by=$out/apt/nvshim.gpg] file:$out/apt ./"
fi

if wants rpm; then
  need rpmbuild rpm
  need createrepo_c createrepo-c
  # One tree for the spec: every package's files (it picks them apart in %files).
  rpmroot=$work/rpmroot
  mkdir -p "$rpmroot"
  for p in "${packages[@]}"; do
    cp -a "$(stage_dir "$p")/." "$rpmroot/"
  done
  # The spec lists the units only where they were staged.
  have_units=0
  [ "${#units[@]}" -eq 2 ] && have_units=1
  find "$rpmroot" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  top=$work/rpmbuild
  rpmbuild -bb --quiet --target "$rpm_arch" \
    --define "_topdir $top" \
    --define "nvshim_version $version" \
    --define "nvshim_epoch $epoch" \
    --define "nvshim_stage $rpmroot" \
    --define "nvshim_units $have_units" \
    --define "_buildhost reproducible" \
    --define "use_source_date_epoch_as_buildtime 1" \
    --define "clamp_mtime_to_source_date_epoch 1" \
    --define "_build_id_links none" \
    "$pkg/rpm/nvshim.spec"
  rpms=()
  for f in "$top"/RPMS/*/*.rpm; do
    mv "$f" "$out/"
    rpms+=("$out/$(basename "$f")")
    echo "built $out/$(basename "$f")"
  done
  bash "$pkg/repo.sh" rpmsign "${rpms[@]}"
  rm -rf "$out/yum"
  mkdir -p "$out/yum"
  cp "${rpms[@]}" "$out/yum/"
  bash "$pkg/repo.sh" yum "$out/yum"
  echo "yum repository: baseurl=file://$out/yum, gpgkey=file://$out/yum/gpgkey"
fi
