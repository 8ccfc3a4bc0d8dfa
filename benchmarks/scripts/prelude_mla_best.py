# Exec'd as decode_as's PRELUDE: patches the MLA decode launch table with the fastest exact
# (exact_q and exact_p on) cache-rows-as-M variant of a benchmarks.kernels_attn JSON
# ($MLA_JSON), by its summed us at T = 1 and 6, context 8192. Only the tile, stages, warps and form
# are taken from the winner; the split length stays the table's (it depends on the capacity).
import dataclasses as _dc
import json as _json
import os as _os
import re as _re

import lingc.runtime.kernels.mla_decode.kernel as _K

_rows = [r for r in _json.load(open(_os.environ["MLA_JSON"]))["rows"]
         if r["variant"].endswith("-rm") and "-q16" not in r["variant"] and "-p16" not in r["variant"]
         and r["shape"].startswith("L=8192 ") and r["correct"]]
_tot = {}
for _r in _rows:
    _tot[_r["variant"]] = _tot.get(_r["variant"], 0.0) + _r["us"]
_best = min(_tot, key=_tot.get)
_m = _re.match(r"lingc-s(\d+)-l(\d+)-st(\d+)-w(\d+)-cr(\d+)-cs(\d+)", _best)
_bl, _st, _w = int(_m.group(2)), int(_m.group(3)), int(_m.group(4))
_orig = _K.config_for
_K.config_for = lambda L, H, R, P: _dc.replace(_orig(L, H, R, P), block_l=_bl, num_stages=_st, num_warps=_w,
                                               rows_as_m=True)
print(f"prelude: MLA split table patched to {_best} (T=1 + T=6 at 8192: {_tot[_best]:.2f} us)", flush=True)
