"""The compose stack run as containers on this machine: its `offline` profile's images, built with no registry
(`build_offline_images`), and the Compose to run it with (`compose_command`). `python -m deploy` is the
command line; `openbao_entrypoint.py` is copied into the OpenBao image as its main process.
"""

from deploy.images import ComposeBuildError, OfflineImages, build_offline_images
from deploy.tool import ComposeNotFound, compose_command

__all__ = ["ComposeBuildError", "ComposeNotFound", "OfflineImages", "build_offline_images", "compose_command"]
