"""Snapshots and forks of a Docker sandbox (docs/SANDBOX.md): `snapshot()` commits the
container to a labelled image; `fork()` starts a sibling with the same limits from a snapshot
(full fidelity) or from a copy of the workspace only. Commit chains deeper than `flatten_after`
layers are flattened (export + import, a full filesystem copy) so overlayfs' ~125-layer limit is
never hit."""

from __future__ import annotations

import posixpath
import re

from horizon.sandbox import engine
from horizon.sandbox.base import WORKSPACE, SandboxInfraError
from horizon.sandbox.engine import ENGINE_ERRORS, IterReader, remove_images, session_images

SNAPSHOT_REPO = "horizon-snapshot"


class Snapshots:
    """Mixin of `DockerSandbox`: snapshot and fork. Needs `_client`, `_slow_client`, `_container`,
    `_spec`, `_owned_images`, `_snap_count`, `image`, `_check_open`, `_engine_error`, `create`."""

    def snapshot(self, tag: str | None = None) -> str:
        """Commit the filesystem to a labelled image; returns its id (usable by `fork`/`create`)."""
        return self._snapshot(tag, owned=not self._spec["keep_snapshots"])

    def _snapshot(self, tag: str | None, owned: bool) -> str:
        self._check_open()
        self._snap_count += 1
        tag = re.sub(r"[^A-Za-z0-9_.-]", "-",
                     tag or f"{engine.SESSION_ID}-{self._container.short_id}-{self._snap_count}")[:120]
        labels = {**self._spec["labels"], **self._owner_labels("snapshot")}
        try:
            res = self._slow_client.api.commit(self._container.id, repository=SNAPSHOT_REPO, tag=tag,
                                               conf={"Labels": labels})
            img = self._client.images.get(res["Id"])
            if len(img.attrs.get("RootFS", {}).get("Layers", [])) > self._spec["flatten_after"]:
                img = self._flatten(img, tag, labels)
        except ENGINE_ERRORS as e:
            raise self._engine_error("snapshot failed", e) from e
        if owned:   # kept snapshots outlive the process (until cleanup_leaked)
            session_images[img.id] = self._client
            self._owned_images.append(img.id)
        return img.id

    def _flatten(self, deep_image, tag: str, labels: dict[str, str]):
        """Re-import the container's filesystem as a single-layer image with the same config."""
        cfg = deep_image.attrs.get("Config", {}) or {}
        changes = [f"ENV {e}" for e in cfg.get("Env") or []]
        if cfg.get("WorkingDir"):
            changes.append(f"WORKDIR {cfg['WorkingDir']}")
        if cfg.get("User"):
            changes.append(f"USER {cfg['User']}")
        changes.append('CMD ["sleep","infinity"]')
        changes += [f'LABEL "{k}"="{v}"' for k, v in {**(cfg.get("Labels") or {}), **labels}.items()]
        stream = self._slow_client.api.export(self._container.id)
        self._slow_client.api.import_image_from_data(IterReader(stream), repository=SNAPSHOT_REPO, tag=tag,
                                                     changes=changes)
        flat = self._client.images.get(f"{SNAPSHOT_REPO}:{tag}")
        if flat.id != deep_image.id:
            remove_images(self._client, [deep_image.id])
        return flat

    def fork(self, *, workspace_only: bool = False) -> Snapshots:
        """A new, independent sandbox (same limits) from this one's current filesystem.

        Default: commit the whole container filesystem (full fidelity). With
        `workspace_only=True` only `WORKSPACE` is copied (tar) into a fresh container of the
        same image: changes elsewhere (e.g. /tmp, installed packages) are not carried, but
        it avoids a commit, which is slow on storage drivers with a naive diff
        (fuse-overlayfs: seconds; overlay2: sub-second).
        """
        spec = {k: v for k, v in self._spec.items() if k != "image"}
        if not workspace_only:
            ref = self._snapshot(None, owned=False)
            try:
                child = type(self).create(ref, client=self._client, **spec)
            except BaseException:
                remove_images(self._client, [ref])
                raise
            child._owned_images.append(ref)   # the fork's private snapshot goes with the fork
            return child
        self._check_open()
        try:
            stream, _ = self._slow_client.api.get_archive(self._container.id, WORKSPACE)
            data = b"".join(stream)
        except ENGINE_ERRORS as e:
            raise self._engine_error("fork failed", e) from e
        child = type(self).create(self.image, client=self._client, **spec)
        try:
            r = child.exec(f"find {WORKSPACE} -mindepth 1 -delete", timeout=60, workdir="/")
            if r.exit_code != 0:
                raise SandboxInfraError(f"fork: cannot clear the child's workspace: {r.output.strip()}")
            try:
                child._slow_client.api.put_archive(child._container.id, posixpath.dirname(WORKSPACE), data)
            except ENGINE_ERRORS as e:
                raise child._engine_error("fork failed", e) from e
        except BaseException:
            child.close()
            raise
        return child
