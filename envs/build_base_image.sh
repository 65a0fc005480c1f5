#!/usr/bin/env bash
# Build the offline sandbox base image `horizon-sandbox:base` (docs/SPEC.md §5).
#
# A minimal Debian rootfs (debootstrap --variant=minbase) from the mirror and suite
# configured in THIS machine's apt sources (read at run time; nothing hard-coded), with a
# non-root user `agent` (uid/gid 1000) owning /workspace, imported with `docker import`
# (no registry needed). Idempotent: exits 0 at once if the image exists. The rootfs
# tarball is cached under envs/.build/ so re-importing does not re-debootstrap.
#
# Env: HORIZON_BASE_IMAGE  image tag to produce (default horizon-sandbox:base)
#      HORIZON_REBUILD=1   rebuild the image even if it exists (reuses the cached tarball)
#      HORIZON_REBOOTSTRAP=1  also discard the cached rootfs tarball
# Needs: root, a running Docker engine, access to the configured Debian mirror.
set -euo pipefail

IMAGE="${HORIZON_BASE_IMAGE:-horizon-sandbox:base}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="$HERE/.build"
TARBALL="$BUILD/rootfs-minbase.tar"
PACKAGES="bash,coreutils,python3,python3-pytest,git,grep,patch,procps,sed,findutils,diffutils,ca-certificates"
IMG_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
T0=$(date +%s)

log() { echo "[build_base_image +$(( $(date +%s) - T0 ))s] $*"; }

if [[ "${HORIZON_REBUILD:-0}" != 1 ]] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "image $IMAGE already exists; nothing to do"
  exit 0
fi

# --- Mirror + suite from the machine's apt configuration -------------------------------
# Prints "URI SUITE [KEYRING]" for the first enabled deb source whose suite is a base
# suite (no -updates/-security/-backports). Handles one-line sources.list and deb822.
find_mirror() {
  local f
  {
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [[ -f "$f" ]] || continue
      # deb [opts] URI SUITE COMPONENTS...
      sed -e 's/#.*//' "$f" | awk '
        $1 == "deb" {
          i = 2; key = "";
          if ($2 ~ /^\[/) { while (i <= NF) { if ($i ~ /signed-by=/) { k=$i; sub(/.*signed-by=/, "", k); sub(/\]$/, "", k); key=k } if ($i ~ /\]$/) { i++; break } i++ } }
          print $i, $(i+1), key
        }'
    done
    for f in /etc/apt/sources.list.d/*.sources; do
      [[ -f "$f" ]] || continue
      # deb822 stanzas separated by blank lines; fields URIs/Suites/Types/Enabled/Signed-By.
      awk '
        function flush() {
          if (uris != "" && types ~ /(^|[ \t])deb([ \t]|$)/ && enabled != "no") {
            n = split(uris, U, /[ \t]+/); m = split(suites, S, /[ \t]+/);
            for (a = 1; a <= n; a++) for (b = 1; b <= m; b++) if (U[a] != "" && S[b] != "") print U[a], S[b], key
          }
          uris = ""; suites = ""; types = ""; enabled = ""; key = ""
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        { line = $0; field = tolower(line); sub(/:.*/, "", field); val = line; sub(/^[^:]*:[ \t]*/, "", val);
          if (field == "uris") uris = val; else if (field == "suites") suites = val;
          else if (field == "types") types = val; else if (field == "enabled") enabled = tolower(val);
          else if (field == "signed-by" && val ~ /^\//) key = val }
        END { flush() }' "$f"
    done
  } | awk '$2 !~ /-(updates|security|backports|proposed)$/ && $2 !~ /\// && $1 ~ /^(https?|file):/' | head -n 1
}

if [[ "${HORIZON_REBOOTSTRAP:-0}" == 1 ]]; then rm -f "$TARBALL"; fi

if [[ ! -s "$TARBALL" ]]; then
  read -r MIRROR SUITE KEYRING < <(find_mirror) || true
  if [[ -z "${MIRROR:-}" || -z "${SUITE:-}" ]]; then
    echo "build_base_image: no usable 'deb' source found in /etc/apt/sources.list{,.d/*}" >&2
    exit 1
  fi
  log "mirror=$MIRROR suite=$SUITE keyring=${KEYRING:-<default>}"
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    apt-get install -y debootstrap >/dev/null || { apt-get update >/dev/null && apt-get install -y debootstrap >/dev/null; }
  fi
  mkdir -p "$BUILD"
  ROOT="$(mktemp -d "$BUILD/rootfs.XXXXXX")"
  cleanup_root() { umount -R "$ROOT/proc" "$ROOT/sys" "$ROOT/dev/pts" 2>/dev/null || true; rm -rf "$ROOT"; }
  trap cleanup_root EXIT
  KEYOPT=()
  if [[ -n "${KEYRING:-}" && -f "$KEYRING" ]]; then KEYOPT=(--keyring="$KEYRING"); fi
  log "debootstrap --variant=minbase (this takes a few minutes)"
  debootstrap --variant=minbase "${KEYOPT[@]}" --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" \
    > "$BUILD/debootstrap.log" 2>&1 || { tail -n 30 "$BUILD/debootstrap.log" >&2; exit 1; }
  log "debootstrap done; configuring user agent (1000:1000) and /workspace"
  chroot "$ROOT" /usr/sbin/groupadd --gid 1000 agent
  chroot "$ROOT" /usr/sbin/useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash agent
  mkdir -p "$ROOT/workspace"
  chown 1000:1000 "$ROOT/workspace"
  # Slim the image: apt caches and docs are not needed in a sandbox.
  rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* \
         "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/*
  # Keep git quiet and usable for any uid (safe.directory) inside the sandbox.
  printf '[safe]\n\tdirectory = *\n[init]\n\tdefaultBranch = main\n[user]\n\tname = agent\n\temail = agent@sandbox\n' \
    > "$ROOT/etc/gitconfig"
  umount -R "$ROOT/proc" "$ROOT/sys" 2>/dev/null || true
  log "packing rootfs -> $TARBALL"
  tar --numeric-owner --xattrs -C "$ROOT" -cf "$TARBALL.tmp" \
      --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* .
  mv "$TARBALL.tmp" "$TARBALL"
  cleanup_root
  trap - EXIT
else
  log "reusing cached rootfs $TARBALL"
fi

log "docker import -> $IMAGE"
docker import \
  --change "ENV PATH=$IMG_PATH" \
  --change "ENV LANG=C.UTF-8" \
  --change "ENV HOME=/home/agent" \
  --change "WORKDIR /workspace" \
  --change "USER 1000:1000" \
  --change 'CMD ["sleep","infinity"]' \
  --change "LABEL horizon.base=1" \
  "$TARBALL" "$IMAGE" >/dev/null
log "smoke test"
docker run --rm --network none "$IMAGE" bash -c 'id -u && python3 -c "import pytest,sys; print(sys.version.split()[0], pytest.__version__)" && git --version'
log "done: $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes)"
