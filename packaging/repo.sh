#!/usr/bin/env bash
# Signing key and signed repositories for nvshim's packages (build.sh runs it; the
# tests run it to re-sign a repository they add packages to):
#   repo.sh keygen HOME      a new signing key (RSA 3072, no passphrase) in the gnupg home
#                            HOME, unless HOME already holds a secret key
#   repo.sh apt DIR          DIR/*.deb -> flat apt repository, signed:
#                            Packages(.gz), Release, Release.gpg, InRelease,
#                            nvshim.gpg (binary public keyring) and gpgkey (armored)
#   repo.sh rpmsign FILE...  signs the rpms in place (rpmsign --addsign)
#   repo.sh yum DIR          DIR/*.rpm -> yum/dnf repository (createrepo_c), with
#                            repodata/repomd.xml.asc, nvshim.gpg and gpgkey
#
# Environment:
#   NVSHIM_GPG_HOME  the gnupg home holding the secret key (required but for keygen)
#   NVSHIM_GPG_KEY   the key to sign with (default: the home's first secret key)
#
# gpg runs on a private copy of the home, with its own gpg-agent that is stopped
# afterwards, so parallel runs never share (or kill) an agent and nothing is left
# running.
set -euo pipefail
umask 022
export LC_ALL=C TZ=UTC

die() {
  echo "packaging/repo.sh: $*" >&2
  exit 1
}

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 not found (install the $2 package)"
}

usage() {
  die "usage: repo.sh keygen HOME | apt DIR | rpmsign FILE... | yum DIR"
}

work=""
cleanup() {
  if [ -n "$work" ]; then
    gpgconf --homedir "$work/gnupg" --kill gpg-agent >/dev/null 2>&1 || true
    rm -rf "$work"
  fi
}
trap cleanup EXIT

# GNUPGHOME: a private copy of NVSHIM_GPG_HOME (sockets left out); KEY: its fingerprint.
open_key() {
  need gpg gnupg
  local home=${NVSHIM_GPG_HOME:-}
  [ -n "$home" ] || die "NVSHIM_GPG_HOME is not set (the gnupg home with the signing key)"
  [ -d "$home" ] || die "NVSHIM_GPG_HOME=$home is not a directory"
  work=$(mktemp -d)
  mkdir -m 0700 "$work/gnupg"
  tar -C "$home" --exclude='S.*' --exclude='*.lock' --exclude='.#*' -cf - . | tar -C "$work/gnupg" -xf -
  export GNUPGHOME=$work/gnupg
  KEY=${NVSHIM_GPG_KEY:-}
  if [ -z "$KEY" ]; then
    KEY=$(gpg --batch --with-colons --list-secret-keys 2>/dev/null | awk -F: '$1 == "fpr" { print $10; exit }')
    [ -n "$KEY" ] || die "no secret key in NVSHIM_GPG_HOME=$home"
  else
    gpg --batch --list-secret-keys "$KEY" >/dev/null 2>&1 ||
      die "NVSHIM_GPG_KEY=$KEY: no such secret key in NVSHIM_GPG_HOME=$home"
  fi
}

gpg_sign() {
  gpg --batch --yes --pinentry-mode loopback --passphrase '' --local-user "$KEY" \
    --digest-algo SHA512 "$@"
}

export_key() {
  gpg --batch --export "$KEY" >"$1/nvshim.gpg"
  gpg --batch --armor --export "$KEY" >"$1/gpgkey"
  [ -s "$1/nvshim.gpg" ] || die "could not export the public key of $KEY"
}

keygen() {
  need gpg gnupg
  local home=$1 found
  mkdir -p -m 0700 "$home"
  # Listing secret keys starts an agent too: stopped below.
  found=$(gpg --homedir "$home" --batch --list-secret-keys 2>/dev/null | grep -c '^sec' || true)
  if [ "$found" = 0 ]; then
    gpg --homedir "$home" --batch --pinentry-mode loopback --passphrase '' \
      --quick-generate-key 'nvshim packages (test build) <nvshim@example.org>' rsa3072 sign never \
      2>/dev/null || die "gpg could not generate a key in $home"
    echo "generated a signing key in $home (no passphrase: for test builds only)"
  fi
  gpgconf --homedir "$home" --kill gpg-agent >/dev/null 2>&1 || true
}

apt_repo() {
  local dir=$1
  need apt-ftparchive apt-utils
  open_key
  (
    cd "$dir"
    rm -f Packages Packages.gz Release Release.gpg InRelease
    apt-ftparchive packages . >Packages
    gzip -9 -n <Packages >Packages.gz
    apt-ftparchive -o APT::FTPArchive::Release::Origin=nvshim \
      -o APT::FTPArchive::Release::Label=nvshim release . >"$work/Release"
    mv "$work/Release" Release
    gpg_sign --armor --detach-sign --output Release.gpg Release
    gpg_sign --clearsign --output InRelease Release
  )
  export_key "$dir"
}

rpm_sign() {
  need rpmsign rpm
  open_key
  local f
  for f in "$@"; do
    rpmsign --define "__gpg $(command -v gpg)" --define "_gpg_path $GNUPGHOME" \
      --define "_gpg_name $KEY" --addsign "$f" </dev/null >"$work/rpmsign.log" 2>&1 ||
      die "rpmsign could not sign $f: $(cat "$work/rpmsign.log")"
  done
}

yum_repo() {
  local dir=$1
  need createrepo_c createrepo-c
  open_key
  rm -rf "$dir/repodata"
  createrepo_c --quiet "$dir"
  gpg_sign --armor --detach-sign --output "$dir/repodata/repomd.xml.asc" "$dir/repodata/repomd.xml"
  export_key "$dir"
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case "$cmd" in
  keygen) [ $# -eq 1 ] || usage; keygen "$1" ;;
  apt) [ $# -eq 1 ] || usage; apt_repo "$1" ;;
  rpmsign) [ $# -ge 1 ] || usage; rpm_sign "$@" ;;
  yum) [ $# -eq 1 ] || usage; yum_repo "$1" ;;
  *) usage ;;
esac
