#!/usr/bin/env bash
# Builds nvshim's packages from the release binaries (`make package` runs this):
#   <out>/nvshim_<version>_<arch>.deb           dpkg-deb, reproducible
#   <out>/nvshim-<version>-1.<rpm arch>.rpm     rpmbuild -bb packaging/rpm/nvshim.spec
#   <out>/apt/   flat apt repository:  deb [trusted=yes] file:<out>/apt ./
#   <out>/yum/   yum/dnf repository (repodata/ by createrepo_c, skipped if not installed)
# Both packages are made from one staged tree, so they ship the same files.
#
# Environment:
#   NVSHIM_VERSION      package version (default: nvshim's version in Cargo.toml)
#   NVSHIM_PACKAGE_DIR  output directory (default: target/packages)
#   NVSHIM_BIN_DIR      where the binaries are (default: target/static/release)
#   NVSHIM_SKIP_CARGO=1 never build: fail if a binary is missing (default: missing
#                       binaries are built with `make static-runtime`; present ones
#                       are used as they are)
#   NVSHIM_FORMATS      "deb rpm" (default), "deb" or "rpm"
#   SOURCE_DATE_EPOCH   every timestamp in the packages (default: the last git
#                       commit's time, else 2024-01-01)
set -euo pipefail
umask 022
export LC_ALL=C TZ=UTC

root=$(cd "$(dirname "$0")/.." && pwd)
pkg=$root/packaging
bin_dir=${NVSHIM_BIN_DIR:-$root/target/static/release}
out=${NVSHIM_PACKAGE_DIR:-$root/target/packages}
formats=${NVSHIM_FORMATS:-deb rpm}
bins=(nvidia-container-runtime nvidia-container-runtime-hook nvidia-device-plugin nvshim)

die() {
  echo "packaging/build.sh: $*" >&2
  exit 1
}

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
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || true)
  SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1704067200}
fi
export SOURCE_DATE_EPOCH

need dpkg dpkg
arch=$(dpkg --print-architecture)
case "$arch" in
  amd64) rpm_arch=x86_64 ;;
  arm64) rpm_arch=aarch64 ;;
  ppc64el) rpm_arch=ppc64le ;;
  *) rpm_arch=$arch ;;
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
need strip binutils
need readelf binutils

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# debian/<package>/ is the layout dpkg-shlibdeps expects.
stage=$work/debian/nvshim
doc=$stage/usr/share/doc/nvshim
install -d -m 0755 "$stage" "$stage/usr/bin" "$stage/etc/nvidia-container-runtime" \
  "$stage/usr/share/containers/oci/hooks.d" "$doc" "$stage/usr/share/lintian/overrides"
for b in "${bins[@]}"; do
  install -m 0755 "$bin_dir/$b" "$stage/usr/bin/$b"
  # As dh_strip does.
  strip --strip-unneeded --remove-section=.comment --remove-section=.note "$stage/usr/bin/$b"
done
install -m 0644 "$pkg/config.toml" "$stage/etc/nvidia-container-runtime/config.toml"
install -m 0644 "$root/hooks.d/oci-nvidia-hook.json" "$stage/usr/share/containers/oci/hooks.d/"
install -m 0644 "$pkg/deb/copyright" "$doc/copyright"
install -m 0644 "$root/README.md" "$doc/README.md"
# Debian-only (the rpm spec deletes them): the changelog, named as policy wants it
# for a native package (no Debian revision), and the lintian overrides.
changelog_date=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
sed -e "s/@VERSION@/$version/g" -e "s/@DATE@/$changelog_date/" "$pkg/deb/changelog" |
  gzip -9 -n >"$doc/changelog.gz"
chmod 0644 "$doc/changelog.gz"
install -m 0644 "$pkg/deb/lintian-overrides" "$stage/usr/share/lintian/overrides/nvshim"

mkdir -p "$out"
if wants deb; then
  need dpkg-deb dpkg
  need dpkg-shlibdeps dpkg-dev
  # Installed-Size as dpkg-gencontrol computes it: KiB per file, rounded up, and 1 per
  # directory or link.
  size=$(find "$stage" -mindepth 1 -printf '%y %s\n' |
    awk '{ n += ($1 == "f") ? int(($2 + 1023) / 1024) : 1 } END { print n }')

  install -d -m 0755 "$stage/DEBIAN"
  # Depends as ${shlibs:Depends} would be, from the dynamically linked binaries
  # (dpkg-shlibdeps finds the package root by its DEBIAN/).
  printf 'Source: nvshim\n\nPackage: nvshim\nArchitecture: any\n' >"$work/debian/control"
  dynamic=()
  for b in "${bins[@]}"; do
    if readelf -d "$stage/usr/bin/$b" | grep -q NEEDED; then
      dynamic+=("debian/nvshim/usr/bin/$b")
    fi
  done
  depends=$(cd "$work" && dpkg-shlibdeps -O "${dynamic[@]}" | sed -n 's/^shlibs:Depends=//p')
  rm -f "$work/debian/control"
  [ -n "$depends" ] || die "dpkg-shlibdeps found no dependencies"
  sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$size/" \
    -e "s/@DEPENDS@/$depends/" "$pkg/deb/control" >"$stage/DEBIAN/control"
  chmod 0644 "$stage/DEBIAN/control"
  install -m 0644 "$pkg/deb/conffiles" "$stage/DEBIAN/conffiles"
  # md5sums for debsums, without the conffile (dpkg tracks its own hash), as dh_md5sums.
  (cd "$stage" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' |
    sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
  chmod 0644 "$stage/DEBIAN/md5sums"
  for s in postinst prerm postrm; do
    install -m 0755 "$pkg/deb/$s" "$stage/DEBIAN/$s"
  done
  find "$stage" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  deb=$out/nvshim_${version}_${arch}.deb
  dpkg-deb --build --root-owner-group -Zxz "$stage" "$deb" >/dev/null
  rm -rf "$stage/DEBIAN"
  echo "built $deb"

  need apt-ftparchive apt-utils
  rm -rf "$out/apt"
  mkdir -p "$out/apt"
  cp "$deb" "$out/apt/"
  (
    cd "$out/apt"
    apt-ftparchive packages . >Packages
    gzip -9 -n <Packages >Packages.gz
    apt-ftparchive release . >"$work/Release"
    mv "$work/Release" Release
  )
  echo "apt repository: deb [trusted=yes] file:$out/apt ./"
fi

if wants rpm; then
  need rpmbuild rpm
  find "$stage" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  top=$work/rpmbuild
  rpmbuild -bb --quiet --target "$rpm_arch" \
    --define "_topdir $top" \
    --define "nvshim_version $version" \
    --define "nvshim_stage $stage" \
    --define "_buildhost reproducible" \
    --define "use_source_date_epoch_as_buildtime 1" \
    --define "clamp_mtime_to_source_date_epoch 1" \
    --define "_build_id_links none" \
    "$pkg/rpm/nvshim.spec"
  rpm_file=$out/nvshim-${version}-1.${rpm_arch}.rpm
  mv "$top/RPMS/$rpm_arch/nvshim-${version}-1.${rpm_arch}.rpm" "$rpm_file"
  echo "built $rpm_file"

  rm -rf "$out/yum"
  if command -v createrepo_c >/dev/null 2>&1; then
    mkdir -p "$out/yum"
    cp "$rpm_file" "$out/yum/"
    createrepo_c --quiet "$out/yum"
    echo "yum repository: baseurl=file://$out/yum"
  else
    echo "note: createrepo_c not installed (Debian: apt-get install createrepo-c); no yum repository written" >&2
  fi
fi
