"""lingc.passes: FX graph passes, one file per pass, run in the order of lingc.pass_manager."""
