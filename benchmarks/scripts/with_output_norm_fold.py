"""Run pytest with pdl_swap's KDA output-norm fold on (PdlSwap.fold_output_norm, off by default
until measured): `python benchmarks/scripts/with_output_norm_fold.py [pytest args]`."""
import sys

import pytest

from lingc.passes.pdl_swap import PdlSwap

PdlSwap.fold_output_norm = True
sys.exit(pytest.main(sys.argv[1:]))
