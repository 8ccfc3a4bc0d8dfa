"""A Triton cache manager that logs which cache entries a device call used, so that only those
are packed and carried to the next call (device_env.sh: ``save_triton_cache``).

Why: the whole cache grows with every kernel variant ever compiled (680 entries, 77 MB by
session 10) past what the device tool returns, and a stale carried cache makes the next call
recompile what changed (a decode run's compile + capture went from ~50 to ~92 s). Logging the
entries each call hits or writes keeps the carried cache to what the code in use compiles.

Set ``TRITON_CACHE_MANAGER=used_triton_cache:UsedEntriesCacheManager`` with this folder on
PYTHONPATH; entry names go to ``$TRITON_USED_LOG`` (one per line, appended by every process).
"""
import os

from triton.runtime.cache import FileCacheManager

__all__ = ["UsedEntriesCacheManager"]


class UsedEntriesCacheManager(FileCacheManager):
    def _log(self):
        path = os.environ.get("TRITON_USED_LOG")
        if path and not getattr(self, "_logged", False):
            with open(path, "a") as f:
                f.write(self.key + "\n")
            self._logged = True

    def get_group(self, filename):
        group = super().get_group(filename)
        if group is not None:
            self._log()
        return group

    def get_file(self, filename):
        path = super().get_file(filename)
        if path is not None:
            self._log()
        return path

    def put(self, data, filename, binary=True):
        self._log()
        return super().put(data, filename, binary)
