"""A dependency-free progress bar for long work (loading, random init, compiling, capturing).

Writes one carriage-return-updated line to stderr, throttled to ~10 updates per second. Disabled
by LINGC_PROGRESS=0 or `enabled=False`; in a non-terminal (CI logs) it prints only the final line.
"""

from __future__ import annotations

import os
import sys
import time


class Progress:
    def __init__(self, total: int, desc: str, unit: str = "", enabled: bool | None = None,
                 scale: float = 1.0):
        self.total, self.desc, self.unit, self.scale = total, desc, unit, scale
        if enabled is None:
            enabled = os.environ.get("LINGC_PROGRESS", "1") != "0"
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.n = 0
        self.t0 = self._last = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if self.enabled and self.tty and (now - self._last > 0.1 or self.n >= self.total):
            self._last = now
            self._write(end="")

    def _write(self, end: str) -> None:
        frac = self.n / self.total if self.total else 1.0
        bar = "#" * int(24 * frac) + "." * (24 - int(24 * frac))
        el = time.perf_counter() - self.t0
        n, tot = self.n * self.scale, self.total * self.scale
        fmt = (lambda v: f"{v:.1f}") if self.scale != 1.0 else (lambda v: f"{int(v)}")
        sys.stderr.write(f"\r{self.desc}: [{bar}] {fmt(n)}/{fmt(tot)}{self.unit} {el:.1f}s{end}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self._write(end="\n")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
